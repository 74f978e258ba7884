"""CoFED's optional learning-rate re-search for update training (docs/algorithms.md section 3).

Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603 (update training re-tried at 0.1x and 2x the local learning rate with early
stopping, as the authors' released experiment scripts do). Update training runs once per
learning-rate factor ``f`` at ``lr * f``, every candidate from the same locally trained model,
with the same seed and the same batches, each with early stopping on a validation part held out
of the participant's local data; the candidate with the best validation score is kept.

Score of a model on the validation set: ``(accuracy, -mean CE)``, compared lexicographically
(accuracy first, the cross-entropy breaks ties, which are frequent on small validation sets).
Early stopping keeps the weights of the best-scoring epoch and stops when ``patience`` epochs in a
row did not improve on it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.errors import ConfigurationError

if TYPE_CHECKING:
    from fedlightning.cofed.torch_participants import TorchParticipant

#: the candidates of the paper: the base learning rate, 0.1x and 2x
DEFAULT_FACTORS: tuple[float, ...] = (1.0, 0.1, 2.0)


def validation_split(y: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of a stratified validation part of the labels ``y``.

    Per class with ``n_c >= 2`` samples, ``min(n_c - 1, max(1, round(fraction * n_c)))`` samples
    drawn at random (a class keeps at least one training sample and, if it has two, gives at least
    one to validation); a class with a single sample stays entirely in training.

    >>> validation_split(np.array([0, 0, 0, 0, 0, 1, 1, 2]), 0.2, seed=0).size
    2
    """
    rng = np.random.default_rng(seed)
    picked = []
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        if len(rows) < 2:
            continue
        k = min(len(rows) - 1, max(1, round(fraction * len(rows))))
        picked.append(rng.permutation(rows)[:k])
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


@torch.no_grad()
def validation_score(
    network: nn.Module, x: Tensor, y: Tensor, batch_size: int = 1024
) -> tuple[float, float]:
    """``(accuracy, mean cross-entropy)`` of ``network`` on ``(x, y)`` in eval mode (the mode is
    restored afterwards)."""
    was_training = network.training
    network.eval()
    device = next(network.parameters()).device
    correct, loss = 0, 0.0
    for s in range(0, len(y), batch_size):
        out = network(x[s : s + batch_size].to(device)).float()
        target = y[s : s + batch_size].to(device)
        correct += int((out.argmax(dim=1) == target).sum())
        loss += float(F.cross_entropy(out, target, reduction="sum"))
    network.train(was_training)
    return correct / len(y), loss / len(y)


def better(score: tuple[float, float], than: tuple[float, float] | None) -> bool:
    """Whether ``(accuracy, loss)`` improves on ``than``: higher accuracy, or equal accuracy and
    lower loss (``None``: anything improves)."""
    return than is None or (score[0], -score[1]) > (than[0], -than[1])


class BestEpoch(pl.Callback):
    """Early stopping on a validation set, keeping the best epoch's weights.

    After every training epoch the module's ``network`` is scored on ``(x, y)``; an improvement
    (see :func:`better`) stores a CPU copy of the module's state_dict, and ``patience`` epochs in a
    row without one stop the fit (``trainer.should_stop``).
    """

    def __init__(self, x: Tensor, y: Tensor, patience: int, batch_size: int = 1024) -> None:
        self.x, self.y = x, y
        self.patience = patience
        self.batch_size = batch_size
        self.best: tuple[float, float] | None = None
        self.best_epoch = 0
        self.epochs_run = 0
        self.best_state: dict[str, Tensor] | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.epochs_run += 1
        score = validation_score(pl_module.network, self.x, self.y, self.batch_size)
        if better(score, self.best):
            self.best, self.best_epoch = score, self.epochs_run
            self.best_state = {
                k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()
            }
        elif self.epochs_run - self.best_epoch >= self.patience:
            trainer.should_stop = True


@dataclass
class Candidate:
    """One update-training run of the search (a row of the run's ``lr_search.csv``)."""

    factor: float
    lr: float
    epochs_run: int
    best_epoch: int
    val_acc: float
    val_loss: float
    chosen: bool = False

    def row(self, participant: int) -> dict[str, Any]:
        return {"participant": participant, **asdict(self)}


def choose(candidates: list[Candidate]) -> int:
    """Index of the best candidate: best validation score, the earliest listed on a tie (the base
    learning rate first in the default order)."""
    best = 0
    for k, c in enumerate(candidates):
        if better((c.val_acc, c.val_loss), (candidates[best].val_acc, candidates[best].val_loss)):
            best = k
    return best


def check_search(factors: list[float], patience: int, val_fraction: float) -> None:
    """Refuse bad search options with a :class:`ConfigurationError` naming the option."""
    if not (
        len(factors) >= 1
        and all(isinstance(f, int | float) and 0 < f < float("inf") for f in factors)
        and len(set(factors)) == len(factors)
    ):
        raise ConfigurationError(
            f"participants.lr_factors={list(factors)!r} is not allowed: expected a non-empty list "
            "of distinct finite numbers > 0 (e.g. [1.0, 0.1, 2.0])"
        )
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ConfigurationError(
            f"participants.patience={patience!r} is not allowed: expected an integer >= 1"
        )
    if not 0.0 < val_fraction < 1.0:
        raise ConfigurationError(
            f"participants.val_fraction={val_fraction!r} is not allowed: expected a number in (0, 1)"
        )


def search_update(
    participant: TorchParticipant,
    x: Tensor,
    y: np.ndarray,
    val_x: Tensor,
    val_y: Tensor,
    seed: int,
) -> list[Candidate]:
    """Update-train ``participant`` once per factor of its settings' ``lr_factors`` on ``(x, y)``,
    each from the same starting weights and with the same ``seed``, early-stopped on
    ``(val_x, val_y)`` (:class:`BestEpoch`); load the best candidate's best epoch (:func:`choose`)
    and return every candidate, the chosen one marked."""
    settings, module = participant.settings, participant.module
    base_lr = module.lr
    start = {k: v.detach().clone() for k, v in module.state_dict().items()}
    candidates, states = [], []
    batch_size = participant.recipe.update_batch_size or participant.recipe.batch_size
    try:
        for factor in settings.lr_factors:
            module.load_state_dict(start)
            module.lr = base_lr * factor
            keeper = BestEpoch(val_x, val_y, settings.patience, settings.eval_batch_size)
            participant._train(
                x, y, participant.update_epochs, seed, balanced=True, batch_size=batch_size,
                callbacks=[keeper],
            )  # fmt: skip
            assert keeper.best is not None and keeper.best_state is not None
            candidates.append(
                Candidate(
                    float(factor), module.lr, keeper.epochs_run, keeper.best_epoch, *keeper.best
                )
            )
            states.append(keeper.best_state)
    finally:
        module.lr = base_lr
    chosen = choose(candidates)
    candidates[chosen].chosen = True
    module.load_state_dict(states[chosen])
    return candidates
