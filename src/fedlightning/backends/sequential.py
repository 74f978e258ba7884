"""The sequential backend: a round's clients fitted one after the other in this process."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedlightning.backends.base import Backend, ClientDone, RoundResults
from fedlightning.errors import ConfigurationError
from fedlightning.fit import ClientFitter
from fedlightning.protocol import ClientJob, FitConfig

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.compute import Compute
    from fedlightning.data.datamodule import FederatedDataModule


class SequentialBackend(Backend):
    """Fits each client in turn with one :class:`~fedlightning.fit.ClientFitter`; the training data
    stays on the fitting device (a GPU) for the whole run when it fits there."""

    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig,
        compute: Compute, on_client_done: ClientDone | None = None,
    ) -> None:  # fmt: skip
        self.model, self.datamodule = model, datamodule
        self.fitter = ClientFitter(config, compute)
        self.on_client_done = on_client_done
        datamodule.place_training_data(self.fitter.device)

    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        results: RoundResults = {}
        for job in jobs:
            try:
                results[job.client_id] = self.fitter.fit(self.model, self.datamodule, job)
            except (ConfigurationError, KeyboardInterrupt):
                raise
            except Exception as error:  # noqa: BLE001  (the loop's failure policy decides)
                error.traceback = traceback.format_exc()  # type: ignore[attr-defined]
                results[job.client_id] = error
            if self.on_client_done is not None:
                self.on_client_done(job.client_id)
        return results
