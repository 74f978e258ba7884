"""Ray backend (``loop.backend: ray``): a round's client fits spread over long-lived Ray actors.

Each actor is started once per run and keeps its own copy of the client module and of the data
module (client tensors included), so a fit ships only the payload and the client's state in and
the upload and new state out, as CPU tensors whatever the devices of the driver's server state and
of the actor. The driver keeps sampling, the ClientStore, aggregation, evaluation
and checkpoints. An actor fits a client exactly as the sequential backend does (the same
:class:`~fedlightning.fit.ClientFitter`, seeded from ``(seed, round, client)``), so results do not
depend on which actor runs which client. Each actor computes with the driver's torch settings
(:class:`~fedlightning.torch_settings.ComputeSettings`: intra-op threads, oneDNN, deterministic
algorithms, flush-to-zero, matmul precision), so on CPU results are byte-identical to the
sequential backend's whatever ``OMP_NUM_THREADS`` says; ``loop.num_threads`` sets the threads of
both (default 1: the actors are the parallelism; raise it with ``num_cpus_per_client`` for a
large model, so that actors do not oversubscribe a machine's cores).

Needs the optional extra: ``pip install 'fedlightning[ray]'``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedlightning.backends.base import Backend, ClientDone, RoundResults
from fedlightning.backends.pickling import refuse_unpicklable
from fedlightning.errors import ConfigurationError, WorkerLost, require
from fedlightning.placement import to_cpu
from fedlightning.protocol import ClientJob, FitConfig, FitResult
from fedlightning.signals import keep_sigterm_handler
from fedlightning.torch_settings import ComputeSettings

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.compute import Compute
    from fedlightning.data.datamodule import FederatedDataModule


def _ray():
    try:
        import ray
    except ImportError as error:
        raise ConfigurationError(
            "loop.backend=RayBackend needs Ray: install the extra with pip install 'fedlightning[ray]'"
        ) from error
    return ray


class _DefaultTokenAuthNote(logging.Filter):
    """Drops Ray's note that a new local cluster uses token authentication, its secure default
    (no action is needed; setting ``RAY_AUTH_MODE`` yourself also silences it in Ray). Every
    other record of that logger, e.g. the warning that authentication is *disabled*, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


@contextlib.contextmanager
def _quiet_default_token_auth():
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    note = _DefaultTokenAuthNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def init_ray(address: str | None) -> bool:
    """Start or join Ray at ``address`` (``None``: a local instance) unless this process is
    connected already, quietly (no dashboard, no worker logs, SIGTERM still ours); whether it
    started a connection, which its caller then shuts down."""
    ray = _ray()
    if ray.is_initialized():
        return False
    with _quiet_default_token_auth(), keep_sigterm_handler():  # ray.init sets its own
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return True


#: how often Ray restarts an actor whose process died (-1: always; every job's retries are bounded)
_MAX_RESTARTS = -1
#: how often a job sent to a restarting actor is sent again, and the wait before each try
_UNAVAILABLE_RETRIES = 3
_RETRY_WAIT_S = 1.0


class ClientWorker:
    """One actor: a client module, the data module and a :class:`ClientFitter`.

    The constructor takes only the small FitConfig, from which the fitter resolves the actor's own
    device and precision once (:class:`~fedlightning.compute.Compute`); the model and the data module come with each
    fit as ``shared = [model_ref, datamodule_ref]`` (object refs inside a list: Ray passes them
    as borrowed references) and are fetched on the actor's first fit. Ray logs an error-level line
    for every restartable actor whose constructor arguments live in the object store; here none
    do, and a restarted actor fetches the refs again (the backend holds them for the run)."""

    def __init__(self, config: FitConfig, settings: ComputeSettings) -> None:
        from fedlightning.fit import ClientFitter
        from fedlightning.training import quiet_lightning

        # for the actor's whole life: it fits many clients, computing as the driver would
        settings.apply()
        self._contexts = [quiet_lightning()]
        for context in self._contexts:
            context.__enter__()
        self.fitter = ClientFitter(config)
        self.model: ClientModule | None = None
        self.dm: FederatedDataModule | None = None

    def fit(self, job: ClientJob, shared: list[Any]) -> FitResult:
        if self.model is None:
            import ray

            self.model, self.dm = ray.get(shared)
            self.dm.setup()
            self.dm.place_training_data(self.fitter.device)
        return to_cpu(self.fitter.fit(self.model, self.dm, job))  # the wire carries CPU tensors


class RayBackend(Backend):
    """Starts ``num_workers`` actors and fits each round's clients on them, round-robin.

    Args:
        address: Ray cluster address (``null``: start or join a local instance).
        num_workers: actors to start (``null``: one per GPU if ``num_gpus_per_client > 0``, else
            one per CPU Ray reports divided by ``num_cpus_per_client``).
        num_gpus_per_client: GPUs (or a fraction of one) each actor holds.
        num_cpus_per_client: CPUs each actor holds (Ray's scheduling); its torch threads are the
            run's (``loop.num_threads``, default 1; null: the driver's), so results equal
            sequential fits.
    """

    def __init__(
        self,
        address: str | None = None,
        num_workers: int | None = None,
        num_gpus_per_client: float = 0.0,
        num_cpus_per_client: int = 1,
    ) -> None:
        require(
            num_workers is None or num_workers >= 1,
            "loop.backend.init_args.num_workers",
            num_workers,
            "null or an integer >= 1",
        )
        require(
            num_gpus_per_client >= 0,
            "loop.backend.init_args.num_gpus_per_client",
            num_gpus_per_client,
            "a number >= 0",
        )
        require(
            num_cpus_per_client >= 1,
            "loop.backend.init_args.num_cpus_per_client",
            num_cpus_per_client,
            "an integer >= 1",
        )
        self.address = address
        self.num_workers = num_workers
        self.num_gpus = num_gpus_per_client
        self.num_cpus = num_cpus_per_client
        self.workers: list[Any] = []
        self.shared: list[Any] = []
        self.on_client_done: ClientDone | None = None
        self._owns_ray = False

    def check(self, model: ClientModule, config: FitConfig, compute: Compute) -> None:
        """Refuse an objective that cannot be pickled to the actors, naming the attribute
        (:mod:`fedlightning.backends.pickling`), before anything is written."""
        refuse_unpicklable(model, _ray().cloudpickle.dumps, "RayBackend")

    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig,
        compute: Compute, on_client_done: ClientDone | None = None,
    ) -> None:  # fmt: skip
        """Start the actors; each resolves its own compute from ``config`` (its device, e.g. a
        CPU-only actor's, may differ from the driver's ``compute``). An objective that no longer
        pickles (an attribute ``prepare_clients`` added) is refused before Ray starts."""
        self.on_client_done = on_client_done
        ray = _ray()
        refuse_unpicklable(model, ray.cloudpickle.dumps, "RayBackend")
        # a Ray instance this backend starts is shut down by stop(); one the user started stays
        self._owns_ray = init_ray(self.address)
        resources = ray.cluster_resources()
        self._check_resources(ray, resources)
        count = self.num_workers
        if count is None:
            count = (
                int(resources.get("GPU", 0) // self.num_gpus)
                if self.num_gpus
                else int(resources["CPU"] // self.num_cpus)
            )
        count = max(1, count)
        if not self.num_gpus and config.accelerator == "auto":
            config = dataclasses.replace(config, accelerator="cpu")  # no GPU in a CPU-only actor
        settings = ComputeSettings.current()  # the driver's, inside the run's cpu_compute
        config = dataclasses.replace(config, num_threads=settings.num_threads)
        # an actor whose process dies (out of memory, a crashed kernel) fails the clients it was
        # fitting and is restarted for the next ones
        worker = ray.remote(
            num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_restarts=_MAX_RESTARTS
        )(ClientWorker)
        model = copy.deepcopy(model)
        model.trainer = None
        self.shared = [ray.put(model), ray.put(datamodule)]  # alive while actors may restart
        self.workers = [worker.remote(config, settings) for _ in range(count)]

    def _check_resources(self, ray: Any, resources: dict[str, float]) -> None:
        """Refuse at once an actor that no node of the cluster can ever hold (Ray would wait
        forever with idle workers left behind), naming the resource."""
        wanted = {"GPU": self.num_gpus, "CPU": float(self.num_cpus)}
        for name, amount in wanted.items():
            have = float(resources.get(name, 0.0))
            if amount > 0 and have < amount:
                if self._owns_ray:
                    ray.shutdown()
                    self._owns_ray = False
                option = "num_gpus_per_client" if name == "GPU" else "num_cpus_per_client"
                raise ConfigurationError(
                    f"loop.backend.init_args.{option}={amount:g} can never be scheduled: the Ray "
                    f"cluster has {have:g} {name}(s) in all; lower it or add {name}s to the cluster"
                )

    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        ray = _ray()
        # the wire carries CPU tensors (the server state may be on the GPU; the loop moves the
        # uploads back onto its device on arrival)
        jobs = to_cpu(list(jobs))  # one call: a payload shared by jobs is copied once
        # round-robin: actors run their queue in order
        workers = {job.client_id: self.workers[i % len(self.workers)] for i, job in enumerate(jobs)}
        pending = {
            job.client_id: (job, workers[job.client_id].fit.remote(job, self.shared))
            for job in jobs
        }
        if self.on_client_done is not None:
            self._count_as_finished(ray, {ref: cid for cid, (_, ref) in pending.items()})
        results: RoundResults = {}
        for cid, (job, ref) in pending.items():
            for attempt in range(_UNAVAILABLE_RETRIES + 1):
                try:
                    results[cid] = ray.get(ref)
                except ray.exceptions.RayTaskError as error:
                    cause = error.as_instanceof_cause()
                    if isinstance(cause, ConfigurationError):
                        raise cause from None
                    cause.traceback = str(error)  # the worker's traceback, as Ray formats it
                    results[cid] = cause
                except ray.exceptions.ActorUnavailableError as error:
                    # the actor is restarting (another client's fit killed it): a fit is a pure
                    # function of its job, so it is submitted again once the actor is back
                    results[cid] = WorkerLost(f"client {cid}'s Ray actor was unavailable: {error}")
                    if attempt < _UNAVAILABLE_RETRIES:
                        time.sleep(_RETRY_WAIT_S)
                        ref = workers[cid].fit.remote(job, self.shared)
                        continue
                except ray.exceptions.RayActorError as error:
                    # the actor died during this fit: that client failed, through no fault of its own
                    results[cid] = WorkerLost(f"client {cid}'s Ray actor was lost: {error}")
                break
        return results

    def _count_as_finished(self, ray: Any, refs: dict[Any, int]) -> None:
        """Report each client as its fit ends (succeeded or failed), in the order they end."""
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                self.on_client_done(refs.pop(ref))

    def stop(self) -> None:
        if self.workers:
            ray = _ray()
            for worker in self.workers:
                ray.kill(worker)
        self.workers, self.shared = [], []
        if self._owns_ray:  # no Ray runtime left running after the run
            _ray().shutdown()
            self._owns_ray = False
