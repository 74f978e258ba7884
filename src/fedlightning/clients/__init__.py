"""Client objectives: one LightningModule per local training rule."""

from fedlightning.clients.base import ClientModule

__all__ = ["ClientModule"]
