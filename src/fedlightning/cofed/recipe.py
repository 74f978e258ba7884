"""A CoFED participant's training recipe (docs/algorithms.md section 3): each silo trains with its
own optimizer, learning rate, batch size and epochs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedlightning.errors import require


@dataclass
class Recipe:
    """A participant's training recipe.

    Args:
        optimizer: ``sgd`` or ``adam`` (created fresh for local and for update training).
        lr: learning rate (> 0).
        momentum: SGD momentum in [0, 1).
        weight_decay: L2 penalty (>= 0).
        batch_size: mini-batch size (>= 1).
        epochs: local training epochs (>= 1).
        update_epochs: update-training epochs (>= 1; null: ``epochs``).
        update_batch_size: update-training mini-batch size (>= 1; null: ``batch_size``). The
            paper trains locally with batch 50 and update-trains with batch 1000.
    """

    optimizer: Literal["sgd", "adam"] = "adam"
    lr: float = 1e-3
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 32
    epochs: int = 30
    update_epochs: int | None = None
    update_batch_size: int | None = None

    def __post_init__(self) -> None:
        require(
            self.optimizer in ("sgd", "adam"), "recipe.optimizer", self.optimizer, "'sgd' or 'adam'"
        )
        require(self.lr > 0, "recipe.lr", self.lr, "a number > 0")
        require(0.0 <= self.momentum < 1.0, "recipe.momentum", self.momentum, "a number in [0, 1)")
        require(self.weight_decay >= 0, "recipe.weight_decay", self.weight_decay, "a number >= 0")
        require(self.batch_size >= 1, "recipe.batch_size", self.batch_size, "an integer >= 1")
        require(self.epochs >= 1, "recipe.epochs", self.epochs, "an integer >= 1")
        require(
            self.update_epochs is None or self.update_epochs >= 1,
            "recipe.update_epochs", self.update_epochs, "null or an integer >= 1",
        )  # fmt: skip
        require(
            self.update_batch_size is None or self.update_batch_size >= 1,
            "recipe.update_batch_size", self.update_batch_size, "null or an integer >= 1",
        )  # fmt: skip

    def __str__(self) -> str:
        update = self.epochs if self.update_epochs is None else self.update_epochs
        extra = f" momentum {self.momentum}" if self.optimizer == "sgd" and self.momentum else ""
        batch = f"{self.batch_size}" + (
            f"+{self.update_batch_size}" if self.update_batch_size is not None else ""
        )
        return f"{self.optimizer} lr {self.lr}{extra} B {batch} E {self.epochs}+{update}"
