"""Model registry: ``create_model(name, num_classes, in_channels, image_size)``."""

from fedlightning.models import small  # noqa: F401  (registers the small models)
from fedlightning.models.registry import create_model, list_models, register_model

__all__ = ["create_model", "list_models", "register_model"]
