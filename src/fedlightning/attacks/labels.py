"""Label flipping, the data-side attack: the malicious clients train on ``y -> C - 1 - y``
(docs/algorithms.md section 8.1).

The clients travel in :attr:`fedlightning.protocol.FitConfig.label_flip_clients`; every fit of
every backend takes its batches from :func:`training_batches`, the one place a client's training
data is read, so a Ray actor or a Flower SuperNode flips exactly what a sequential fit flips.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fedlightning.attacks.base import Attack, AttackRound
from fedlightning.attacks.maths import flip_labels
from fedlightning.protocol import FitConfig, StateDict

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule


class LabelFlip(Attack):
    """Label flipping: each malicious client trains on its own samples with every label ``y``
    replaced by ``C - 1 - y`` (C the data set's classes) and uploads what it trained, unchanged.

    Args:
        fraction, clients: the malicious clients (:class:`~fedlightning.attacks.base.Attack`).
    """

    poisons_labels = True

    def __init__(self, fraction: float = 0.0, clients: list[int] | None = None) -> None:
        super().__init__(fraction, clients)

    def corrupt(self, attack_round: AttackRound) -> list[StateDict]:
        return [u.weights for u in attack_round.uploads]  # the poison is in the training data


class FlippedLabels:
    """The batches of ``batches`` with their labels flipped (:func:`flip_labels`); sized, and
    re-iterable exactly as ``batches`` is (the same shuffles)."""

    def __init__(self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], num_classes: int):
        self.batches = batches
        self.num_classes = num_classes

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    # the client's whole data as tensors, for fits that sample their own batches (DP-SGD's
    # Poisson batches): an AttributeError when ``batches`` has none, as without the attack
    @property
    def x(self) -> torch.Tensor:
        return self.batches.x  # type: ignore[attr-defined]

    @property
    def y(self) -> torch.Tensor:
        return flip_labels(self.batches.y, self.num_classes)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in self.batches:
            yield x, flip_labels(y, self.num_classes)

    def batch_rows(self) -> list[torch.Tensor]:
        """The next pass's batches as row indices into ``(x, y)``, as ``batches`` draws them."""
        return self.batches.batch_rows()  # type: ignore[attr-defined]


def training_batches(dm: FederatedDataModule, client_id: int, seed: int, config: FitConfig) -> Any:
    """Client ``client_id``'s training batches for one fit, shuffled from ``seed``
    (:meth:`FederatedDataModule.client_train_dataloader`), with flipped labels when the client is
    one of ``config.label_flip_clients``."""
    batches = dm.client_train_dataloader(client_id, seed)
    if client_id in config.label_flip_clients:
        return FlippedLabels(batches, dm.num_classes)
    return batches
