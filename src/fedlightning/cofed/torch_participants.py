"""CoFED participants with registered models (by default CoFED's random CNN family) trained with
Lightning, local training on cross-entropy, update training on class-balanced cross-entropy.
Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603 (docs/algorithms.md section 3).
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.clients.base import ClientModule
from fedlightning.cofed.lr_search import (
    DEFAULT_FACTORS,
    check_search,
    search_update,
    validation_split,
)
from fedlightning.cofed.participant_base import Participant, Participants
from fedlightning.cofed.recipe import Recipe
from fedlightning.compute import PRECISIONS
from fedlightning.data.loader import TensorBatches
from fedlightning.errors import ConfigurationError, require
from fedlightning.loop.checks import check_accelerator
from fedlightning.models.registry import create_model, list_models, model_builder
from fedlightning.seeding import derive_seed, seed_fit
from fedlightning.training import lean_trainer


def class_balanced_weights(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Cross-entropy class weights ``w_c = (1 / n_c) / max_k (1 / n_k) = min_k n_k / n_c``.

    Inverse class frequency normalised to a largest weight of 1 (the rarest present class), minima
    over the classes present; a class without samples gets weight 1 (it is never a target).

    >>> class_balanced_weights(np.array([0, 0, 0, 0, 1, 1, 2]), 4).tolist()
    [0.25, 0.5, 1.0, 1.0]
    """
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    present = counts > 0
    weights = np.ones(num_classes)
    if present.any():
        weights[present] = counts[present].min() / counts[present]
    return weights


class TorchParticipants(Participants):
    """Participants with registered models, trained with Lightning.

    Participant i gets ``models[i mod len(models)]`` and ``recipes[i mod len(recipes)]``. A model
    builder with a ``seed`` argument (``cofed_cnn``) gets a per-participant seed, so a random
    architecture family draws each participant its own architecture. Local training minimises
    cross-entropy; update training minimises class-balanced cross-entropy (see
    :func:`class_balanced_weights`) over local plus pseudo-labelled samples, from the local model
    with a fresh optimizer.

    Args:
        models: registered model names (``fedlightning.models.list_models()``).
        model_kwargs: extra builder arguments, applied to every model.
        recipes: training recipes (default one ``Recipe()``).
        accelerator: Lightning accelerator of every fit (``auto``, ``cpu``, ``gpu``...).
        precision: Lightning precision of every fit.
        eval_batch_size: batch size for predictions.
        lr_search: update-train once per factor of ``lr_factors`` (learning rate ``lr * f``),
            each run with early stopping on a validation part of the local data, and keep the best
            (docs/algorithms.md section 3; off: one update-training run at ``lr``).
        lr_factors: the learning-rate factors tried (default ``[1.0, 0.1, 2.0]``; distinct, > 0).
        patience: epochs without a better validation score before a run stops (>= 1).
        val_fraction: share of each class's local samples held out for validation, from local
            and update training alike, when ``lr_search`` is on (in (0, 1)).
    """

    def __init__(
        self,
        models: list[str] | None = None,
        model_kwargs: dict[str, Any] | None = None,
        recipes: list[Recipe] | None = None,
        accelerator: str = "auto",
        precision: Literal["32-true", "32", "bf16-mixed", "16-mixed", "64-true"] = "32-true",
        eval_batch_size: int = 1024,
        lr_search: bool = False,
        lr_factors: list[float] | None = None,
        patience: int = 10,
        val_fraction: float = 0.2,
    ) -> None:
        check_accelerator(accelerator, "participants.accelerator")  # as fit checks its own
        self.lr_factors = list(DEFAULT_FACTORS) if lr_factors is None else list(lr_factors)
        check_search(self.lr_factors, patience, val_fraction)
        self.lr_search = lr_search
        self.patience = patience
        self.val_fraction = val_fraction
        self.models = ["cofed_cnn"] if models is None else list(models)
        self.recipes = [Recipe()] if recipes is None else list(recipes)
        unknown = [m for m in self.models if m not in list_models()]
        require(
            len(self.models) > 0 and not unknown, "participants.models", self.models,
            f"a non-empty list of registered models ({', '.join(list_models())})",
        )  # fmt: skip
        require(
            len(self.recipes) > 0,
            "participants.recipes",
            self.recipes,
            "a non-empty list of recipes",
        )
        require(
            precision in PRECISIONS,
            "participants.precision",
            precision,
            f"one of {', '.join(PRECISIONS)}",
        )
        require(
            eval_batch_size >= 1, "participants.eval_batch_size", eval_batch_size, "an integer >= 1"
        )
        self.model_kwargs = dict(model_kwargs or {})
        self.accelerator = accelerator
        self.precision = precision
        self.eval_batch_size = eval_batch_size

    def build(
        self, index: int, num_classes: int, sample_shape: tuple[int, ...], seed: int
    ) -> Participant:
        require(
            num_classes >= 2,
            "label space size",
            num_classes,
            ">= 2 classes for a torch participant",
        )
        name = self.models[index % len(self.models)]
        kwargs = dict(self.model_kwargs)
        if "seed" in inspect.signature(model_builder(name)).parameters:
            kwargs.setdefault("seed", derive_seed(seed, "architecture"))
        in_channels, image_size = (
            (sample_shape[0], sample_shape[-1]) if len(sample_shape) == 3 else (sample_shape[0], 1)
        )
        torch.manual_seed(derive_seed(seed, "init") % 2**32)
        network = create_model(name, num_classes, in_channels, image_size, **kwargs)
        widths = getattr(network, "widths", None)
        arch = f"{name}{list(widths)}" if widths else name
        recipe = self.recipes[index % len(self.recipes)]
        return TorchParticipant(network, num_classes, recipe, self, description=f"{arch}; {recipe}")


class TorchParticipant(Participant):
    """A torch model trained by a lean Lightning Trainer (no logger, checkpoint or progress bar)."""

    def __init__(
        self,
        network: nn.Module,
        num_classes: int,
        recipe: Recipe,
        settings: TorchParticipants,
        description: str = "",
    ) -> None:
        self.module = _WeightedCEClient(network, num_classes, recipe)
        self.recipe = recipe
        self.settings = settings
        self.num_classes = num_classes
        self.description = description

    def fit(self, x: Tensor, y: np.ndarray, seed: int) -> None:
        """Local training; with ``lr_search`` a stratified validation part of ``(x, y)`` is held
        out first (and kept out of update training too)."""
        self.num_local = len(y)
        self.validation_rows = np.zeros(0, dtype=np.int64)
        if self.settings.lr_search:
            rows = validation_split(y, self.settings.val_fraction, derive_seed(seed, "validation"))
            if len(rows) == 0:
                raise ConfigurationError(
                    f"participants.lr_search=True is not allowed here: no class of this "
                    f"participant has 2 local samples to hold one out for validation (labels "
                    f"{np.bincount(y).tolist()})"
                )
            self.validation_rows = rows
            keep = np.setdiff1d(np.arange(len(y)), rows)
            x, y = x[keep], y[keep]
        self._train(
            x, y, self.recipe.epochs, seed, balanced=False, batch_size=self.recipe.batch_size
        )

    @property
    def update_epochs(self) -> int:
        """Update-training epochs (with ``lr_search``: the most each candidate may run)."""
        return (
            self.recipe.epochs if self.recipe.update_epochs is None else self.recipe.update_epochs
        )

    def update(self, x: Tensor, y: np.ndarray, seed: int) -> None:
        batch_size = self.recipe.update_batch_size or self.recipe.batch_size
        self._train(x, y, self.update_epochs, seed, balanced=True, batch_size=batch_size)

    def update_from(
        self,
        local_x: Tensor,
        local_y: np.ndarray,
        pseudo_x: Tensor,
        pseudo_y: np.ndarray,
        seed: int,
    ) -> None:
        if not self.settings.lr_search:
            return super().update_from(local_x, local_y, pseudo_x, pseudo_y, seed)
        if len(local_y) != self.num_local:
            raise ValueError("update_from needs the local data fit() was given")
        rows = self.validation_rows
        keep = np.setdiff1d(np.arange(len(local_y)), rows)
        x = torch.cat([local_x[keep], pseudo_x])
        y = np.concatenate([local_y[keep], pseudo_y])
        self.search_log = tuple(
            search_update(self, x, y, local_x[rows], torch.as_tensor(local_y[rows]), seed)
        )

    def _train(
        self,
        x: Tensor,
        y: np.ndarray,
        epochs: int,
        seed: int,
        balanced: bool,
        batch_size: int,
        callbacks: list[Any] | None = None,
    ) -> None:
        weights = class_balanced_weights(y, self.num_classes) if balanced else None
        self.module.class_weight = (
            None if weights is None else torch.as_tensor(weights, dtype=torch.float32)
        )
        seed_fit(seed)
        self.module.train()  # predictions left it in eval mode, and Lightning keeps a module's mode
        trainer = lean_trainer(
            self.settings.accelerator,
            self.settings.precision,
            max_epochs=epochs,
            limit_val_batches=0,
            callbacks=callbacks,
        )
        batches = TensorBatches(x, torch.as_tensor(y), batch_size, shuffle=True, seed=seed)
        trainer.fit(self.module, train_dataloaders=batches)

    @torch.no_grad()
    def predict_proba(self, x: Tensor) -> np.ndarray:
        network = self.module.network
        device = _device(self.settings.accelerator)
        network.eval().to(device)
        out = [
            F.softmax(
                network(x[s : s + self.settings.eval_batch_size].to(device)).float(), dim=1
            ).cpu()
            for s in range(0, len(x), self.settings.eval_batch_size)
        ]
        network.cpu()
        return torch.cat(out).numpy() if out else np.zeros((0, self.num_classes), np.float32)


class _WeightedCEClient(ClientModule):
    """ClientModule whose cross-entropy carries optional per-class weights."""

    def __init__(self, network: nn.Module, num_classes: int, recipe: Recipe) -> None:
        super().__init__(
            network=network, num_classes=num_classes, optimizer=recipe.optimizer, lr=recipe.lr,
            momentum=recipe.momentum, weight_decay=recipe.weight_decay,
        )  # fmt: skip
        self.class_weight: Tensor | None = None

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        weight = None if self.class_weight is None else self.class_weight.to(x.device)
        return F.cross_entropy(self(x), y, weight=weight)


def _device(accelerator: str) -> torch.device:
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")
