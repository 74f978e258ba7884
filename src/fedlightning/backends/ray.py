"""Ray backend (``loop.backend: ray``): a round's client fits spread over long-lived Ray actors.

Each actor is started once per run and keeps its own copy of the client module and of the data
module (client tensors included), so a fit ships only the payload and the client's state in and
the upload and new state out. The driver keeps sampling, the ClientStore, aggregation, evaluation
and checkpoints. An actor fits a client exactly as the sequential backend does (the same
``FederatedLoop._fit_client``, seeded from ``(seed, round, client)``), so results do not depend on
which actor runs which client; on CPU they are bitwise equal to the sequential backend's when
both use the same number of torch threads (Ray gives each actor ``num_cpus`` threads).

Needs the optional extra: ``pip install 'fedlightning[ray]'``.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, Upload

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule
    from fedlightning.loop import FederatedLoop


def _ray():
    try:
        import ray
    except ImportError as error:
        raise ConfigurationError(
            "loop.backend='ray' needs Ray: install the extra with pip install 'fedlightning[ray]'"
        ) from error
    return ray


#: how often Ray restarts an actor whose process died
_MAX_RESTARTS = 3


class ClientWorker:
    """One actor: a client module, the data module and a sequential loop to fit clients with."""

    def __init__(
        self,
        model: ClientModule,
        dm: FederatedDataModule,
        loop_settings: dict[str, Any],
        threads: int,
    ):
        from fedlightning.loop import FederatedLoop
        from fedlightning.training import cpu_compute, quiet_lightning

        # for the actor's whole life: it fits many clients and builds many Trainers
        self._contexts = [cpu_compute(threads, loop_settings["onednn"]), quiet_lightning()]
        for context in self._contexts:
            context.__enter__()
        self.model = model
        self.dm = dm
        self.dm.setup()
        self.loop = FederatedLoop(
            run_dir=tempfile.mkdtemp(prefix="fedlightning-worker-"),
            progress_bar=False,
            plots=False,
            **loop_settings,
        )
        self.loop.place_training_data(self.dm)

    def fit(
        self, round_index: int, cid: int, payload: Payload, state: dict[str, Any]
    ) -> tuple[Upload, dict[str, Any]]:
        self.loop.store.put(cid, state)
        try:
            return self.loop._fit_client(self.model, self.dm, round_index, cid, payload)
        finally:
            self.loop.store.put(cid, {})


class RayBackend:
    """Starts ``num_workers`` actors (at the first round) and fits each round's clients on them.

    Args:
        loop: the driver's loop (its settings are copied into every actor).
        address: Ray cluster address (``None``: start or join a local instance).
        num_workers: actors to start (``None``: one per GPU if ``num_gpus_per_client > 0``, else
            one per CPU Ray reports).
        num_gpus_per_client: GPUs (or a fraction) each actor holds.
        num_cpus_per_client: CPUs each actor holds; also its torch threads.
    """

    def __init__(
        self,
        loop: FederatedLoop,
        address: str | None,
        num_workers: int | None,
        num_gpus_per_client: float,
        num_cpus_per_client: int,
    ) -> None:
        self.loop = loop
        self.address = address
        self.num_workers = num_workers
        self.num_gpus = num_gpus_per_client
        self.num_cpus = num_cpus_per_client
        self.workers: list[Any] = []

    def start(self, model: ClientModule, dm: FederatedDataModule) -> None:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        resources = ray.cluster_resources()
        count = self.num_workers
        if count is None:
            count = (
                int(resources.get("GPU", 0) // self.num_gpus)
                if self.num_gpus
                else int(resources["CPU"] // self.num_cpus)
            )
        count = max(1, count)
        settings = {
            name: getattr(self.loop, name)
            for name in (
                "local_epochs",
                "local_steps",
                "precision",
                "accelerator",
                "seed",
                "direct_fit",
                "onednn",
            )
        }
        if not self.num_gpus and settings["accelerator"] == "auto":
            settings["accelerator"] = "cpu"  # an actor without GPUs must not pick one up
        # an actor whose process dies (out of memory, a crashed kernel) fails the clients it was
        # fitting and is restarted for the next ones
        worker = ray.remote(
            num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_restarts=_MAX_RESTARTS
        )(ClientWorker)
        model = copy.deepcopy(model)
        model.trainer = None
        model_ref, dm_ref = ray.put(model), ray.put(dm)
        self.workers = [
            worker.remote(model_ref, dm_ref, settings, self.num_cpus) for _ in range(count)
        ]

    def fit(
        self, round_index: int, client_ids: Sequence[int], payloads: dict[int, Payload]
    ) -> dict[int, tuple[Upload, dict[str, Any]] | BaseException]:
        """Every client's ``(upload, new state)``, or the exception its fit raised."""
        ray = _ray()
        pending = {}
        for i, cid in enumerate(client_ids):  # round-robin: actors run their queue in order
            worker = self.workers[i % len(self.workers)]
            pending[cid] = worker.fit.remote(
                round_index, cid, payloads[cid], self.loop.store.get(cid)
            )
        results: dict[int, tuple[Upload, dict[str, Any]] | BaseException] = {}
        for cid, ref in pending.items():
            try:
                results[cid] = ray.get(ref)
            except ray.exceptions.RayTaskError as error:
                cause = error.as_instanceof_cause()
                if isinstance(cause, ConfigurationError):
                    raise cause from None
                results[cid] = cause
            except ray.exceptions.RayActorError as error:  # the actor died: that client failed
                results[cid] = error
        return results

    def stop(self) -> None:
        ray = _ray()
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
