"""Each client's held-out splits of a :class:`~fedlightning.data.datamodule.FederatedDataModule`
(docs/algorithms.md section 4): its validation split (held out of its samples, or dealt from the
test set with ``val_from_test``) and, with ``client_test_fraction``, its own test split (held out
of its samples class by class), which personalized evaluation scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedlightning.data.loader import TensorBatches
from fedlightning.data.ragged import client_rows
from fedlightning.errors import ConfigurationError


class ClientSplits:
    """The per-client held-out data of the data module (mixed into it; ``setup`` sets
    ``_val_idx`` and ``_client_test_idx``)."""

    def _val_pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the validation indices point: the test set with ``val_from_test``, else the
        training pool."""
        data = self.data
        return (
            (data.test_x, data.test_y) if self.val_from_test > 0 else (data.train_x, data.train_y)
        )

    def client_val_dataloader(self, client_id: int) -> TensorBatches:
        idx = self._val_idx[client_id]
        x, y = self._val_pool()
        return TensorBatches(x[idx], y[idx], self.eval_batch_size)

    def client_val_data(
        self, client_ids: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The validation samples of ``client_ids`` (``None``: every client) at once:
        ``(x, y, client_id)``, by client."""
        return client_rows(self._val_idx, *self._val_pool(), client_ids)

    @property
    def has_client_test(self) -> bool:
        """Whether each client has its own test split (``client_test_fraction > 0``)."""
        return self.client_test_fraction > 0

    def client_test_data(
        self, client_ids: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The own test samples (``client_test_fraction``) of ``client_ids`` (``None``: every
        client): ``(x, y, client_id)``, by client."""
        if self._client_test_idx is None:
            raise ConfigurationError(
                "the clients have no test split of their own: set data.client_test_fraction > 0"
            )
        return client_rows(self._client_test_idx, self.data.train_x, self.data.train_y, client_ids)
