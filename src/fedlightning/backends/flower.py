"""Flower backend (``loop.backend: FlowerBackend``): client fits on SuperNodes of a Flower
deployment, the fedlightning loop staying the server.

Each round, the :class:`~fedlightning.protocol.ClientJob` s of the clients one SuperNode serves
become one Flower ``Message`` carrying one blob (:mod:`fedlightning.flower_app.records`: weights,
payload extras and client state in fedlightning's wire format, :mod:`fedlightning.flower_app.wire`;
O(1) Flower objects per message) sent through the SuperLink to that SuperNode; its ClientApp
forwards it to the node's warm worker (:mod:`fedlightning.flower_app.client`), which fits them one
after another with :class:`~fedlightning.fit.ClientFitter` on its own data and replies with the
uploads, one blob again. One message per node and round, not per client: Flower 1.41's SuperNode
handles one message at a time, each in a fresh ``flwr-clientapp`` process, and sleeps 3 s whenever
it finds no message waiting.

Secure aggregation (``secure_aggregation: true``): each round runs Flower's own SecAgg+ (its
``SecAggPlusWorkflow`` on the SuperLink, its ``secaggplus_mod`` in the ClientApp) on one vector per
SuperNode, the node's weighted sum of its clients' updates, so the server learns only their sum
over the nodes (:mod:`fedlightning.flower_app.secure`; docs/algorithms.md section 2.7). Only
aggregators that run on that sum are accepted (:mod:`fedlightning.flower_app.secure_options`);
the result equals the plain run's up to SecAgg+'s quantisation, bounded per entry by
``J 2C/T / m`` (``J`` nodes, ``C`` = ``clipping_range``, ``T`` = ``quantization_range``, ``m`` the
owners' share of the round's weight).

How the loop reaches the SuperLink: Flower hands a ``Grid`` only to a ServerApp, so ``start``
submits a small relay ServerApp with ``flwr run`` (the connection ``address``, ``insecure`` and
``root_certificates`` passed to Flower as a SuperLink connection) and the relay connects back to
this process on ``relay_host`` (authenticated with a one-run key); the loop keeps sampling,
aggregation, evaluation and checkpoints (resume as with any backend). With ``address: null`` the
backend uses the Grid of the ServerApp it runs in (the app ``fedlightning flower-app`` writes):
that ServerApp passes its Grid to the command it runs, which hands it to
:meth:`FlowerBackend.use_grid` before the run starts (:mod:`fedlightning.flower_app.server`).

Which node fits which client: each SuperNode's node config (``partition-id``/``num-partitions`` or
``client-ids``, :mod:`fedlightning.flower_app.client`); ``start`` waits up to ``connect_timeout``
for SuperNodes covering every client id. Failures: a fit that raises on a node comes back as a
:class:`RemoteClientError` with the node's traceback; a node that gives no reply within
``round_timeout`` (killed, disconnected) or a Flower-level error is :class:`WorkerLost` for
each of its clients of the round, which the
loop's failure policy treats as a client failure, never as a bug. A lost node is asked again which
clients it serves when the SuperLink lists it again.

On CPU with the same partition and torch threads, the result is byte-identical to the sequential
backend's (without secure aggregation): nodes fit exactly as it does, and the wire is exact.

Needs the optional extra: ``pip install 'fedlightning[flower]'``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from fedlightning.backends.base import Backend, ClientDone, RoundResults
from fedlightning.backends.flower_rounds import RemoteClientError, plain_round, secure_round
from fedlightning.errors import ConfigurationError, WorkerLost, require
from fedlightning.flower_app.specs import class_spec
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.seeding import derive_seed, seed_fit

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.compute import Compute
    from fedlightning.data.datamodule import FederatedDataModule
    from fedlightning.server.base import Aggregator

__all__ = ["FlowerBackend", "RemoteClientError"]


def _flwr() -> None:
    try:
        import flwr  # noqa: F401
    except ImportError as error:
        raise ConfigurationError(
            "loop.backend=FlowerBackend needs Flower: pip install 'fedlightning[flower]'"
        ) from error


class FlowerBackend(Backend):
    """Fits each round's clients on Flower SuperNodes (see the module docstring).

    Args:
        address: the SuperLink's address as ``flwr run`` reaches it (``host:port``); ``null``: the
            Grid of the ServerApp this loop runs in (an app written by ``fedlightning flower-app``).
        insecure: connect without TLS (``flower-superlink --insecure``).
        root_certificates: path of the CA certificate(s) that signed the SuperLink's TLS certificate.
        federation: the federation to submit the run to (``@account/name``; Flower's default if
            ``null``).
        round_timeout: seconds to wait for a round's replies; a node silent that long is lost.
        connect_timeout: seconds to wait for the relay ServerApp and for SuperNodes covering every
            client at start.
        relay_host: the address of this machine as the SuperLink's machine reaches it (the relay
            ServerApp connects back to it on a free port).
        secure_aggregation: aggregate with Flower's SecAgg+: the server learns only the sum of
            the nodes' weighted updates (module docstring).
        num_shares: SecAgg+: the shares each node's secrets are split into, an integer >= 3 or a
            fraction of the nodes (1.0: every node holds one).
        reconstruction_threshold: SecAgg+: the shares that reconstruct a node's secrets (an
            integer >= 2 or a fraction of num_shares; default 0.75, a strict majority).
        clipping_range: SecAgg+: C, every entry of a node's vector must lie in [-C, C] (else the
            run stops naming this option); the quantisation step is 2C/T.
        quantization_range: SecAgg+: T, the integers [0, T] a vector entry is quantised to.
        modulus_range: SecAgg+: the masks' modulus, a power of 2 above nodes x T.
    """

    def __init__(
        self,
        address: str | None = "127.0.0.1:8000",
        insecure: bool = False,
        root_certificates: str | None = None,
        federation: str | None = None,
        round_timeout: float = 600.0,
        connect_timeout: float = 120.0,
        relay_host: str = "127.0.0.1",
        secure_aggregation: bool = False,
        num_shares: int | float = 1.0,
        reconstruction_threshold: int | float = 0.75,
        clipping_range: float = 8.0,
        quantization_range: int = 2**22,
        modulus_range: int = 2**32,
    ) -> None:
        require(
            round_timeout > 0, "loop.backend.init_args.round_timeout", round_timeout, "a number > 0"
        )
        require(
            connect_timeout > 0,
            "loop.backend.init_args.connect_timeout",
            connect_timeout,
            "a number > 0",
        )
        require(
            address is None or ":" in address,
            "loop.backend.init_args.address", address, "null or host:port of the SuperLink",
        )  # fmt: skip
        self.address, self.insecure, self.root_certificates = address, insecure, root_certificates
        self.federation = federation
        self.round_timeout, self.connect_timeout, self.relay_host = (
            round_timeout,
            connect_timeout,
            relay_host,
        )
        from fedlightning.flower_app.secure_options import secure_options

        self.secure = secure_options(
            secure_aggregation, num_shares=num_shares,
            reconstruction_threshold=reconstruction_threshold, clipping_range=clipping_range,
            quantization_range=quantization_range, modulus_range=modulus_range,
        )  # fmt: skip
        self.weighting = "samples"
        self.grid: Any = None
        self.transport: Any = None
        self.served: dict[int, list[int]] = {}
        self._tmp: str | None = None
        #: per node of the last plain round: the timestamps of its message's way
        #: (:data:`fedlightning.flower_app.transport.Timing`; ``benchmarks/flower_overhead.py``)
        self.round_timings: list[dict[str, float]] = []
        self.on_client_done: ClientDone | None = None
        self._reported: set[int] = set()  # the clients reported done in the current round

    def use_grid(self, grid: Any) -> None:
        """Fit on ``grid`` (a Flower ``Grid``), that of the ServerApp this loop runs in: called on
        that ServerApp's behalf (:mod:`fedlightning.flower_app.server`) by the command it runs,
        ``fedlightning.cli.main(..., grid=grid)``, before the run starts."""
        require(
            self.address is None,
            "loop.backend.init_args.address", self.address,
            "null when the loop runs inside a Flower ServerApp (it uses that app's Grid)",
        )  # fmt: skip
        self.grid = grid

    def check(self, model: ClientModule, config: FitConfig, compute: Compute) -> None:
        _flwr()

    @property
    def individual_uploads(self) -> bool:
        """Under secure aggregation, the uploads a round returns are stand-ins that carry only
        the secure sum (:mod:`fedlightning.flower_app.secure`): no attack can replace one."""
        return self.secure is None

    def check_aggregator(self, aggregator: Aggregator) -> None:
        """Under secure aggregation, refuse an aggregator that needs individual uploads."""
        if self.secure is not None:
            from fedlightning.flower_app.secure_options import check_aggregator

            self.weighting = check_aggregator(aggregator)

    # -- start: reach the SuperLink, wait for SuperNodes -----------------------------------------
    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig,
        compute: Compute, on_client_done: ClientDone | None = None,
    ) -> None:  # fmt: skip
        """Reach the SuperLink and wait for SuperNodes serving every client. The nodes resolve
        their own compute from ``config`` (each once); ``on_client_done`` is called for a node's
        clients as its reply arrives (a node fits its clients of a round in one message)."""
        _flwr()
        self.on_client_done = on_client_done
        self.config, self.num_clients = config, datamodule.num_clients
        self.num_samples = datamodule.client_num_samples
        self.spec = {
            "model": class_spec(model, "model"),
            "data": class_spec(datamodule, "data module"),
        }
        if self.address is None:
            from fedlightning.flower_app.transport import GridTransport

            if self.grid is None:
                raise ConfigurationError(
                    "loop.backend.init_args.address=null means the Grid of the ServerApp this loop "
                    "runs in, but none runs here: set it to your SuperLink's host:port"
                )
            self.transport = GridTransport(self.grid)
        else:
            from fedlightning.flower_app.connect import start_relay

            self.transport, self._tmp = start_relay(self)
        try:
            self._discover()
            if self.secure is not None:
                from fedlightning.flower_app.secure_options import check_nodes

                check_nodes(self.secure, len(self.served))
        except BaseException:
            self.stop()
            raise

    def _discover(self) -> None:
        deadline = time.monotonic() + self.connect_timeout
        while True:
            self._refresh(max(1.0, deadline - time.monotonic()))
            covered = {c for ids in self.served.values() for c in ids}
            missing = sorted(set(range(self.num_clients)) - covered)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"loop.backend=FlowerBackend: after {self.connect_timeout:g} s no SuperNode "
                    f"serves client(s) {missing} (nodes: {sorted(self.served)}); start SuperNodes "
                    "whose node config (partition-id/num-partitions or client-ids) covers every client"
                )
            time.sleep(0.5)

    def _refresh(self, timeout: float) -> None:
        """Forget nodes the SuperLink no longer lists; ask new ones which clients they serve."""
        listed = self.transport.node_ids()
        self.served = {n: ids for n, ids in self.served.items() if n in listed}
        new = [n for n in listed if n not in self.served]
        if new:
            self.served.update(self.transport.served(new, self.num_clients, timeout))

    # -- rounds ----------------------------------------------------------------------------------
    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        self._refresh(self.round_timeout)
        results: RoundResults = {}
        batches: dict[int, list[ClientJob]] = {}  # node -> its clients' jobs, in job order
        for job in jobs:
            nodes = [n for n in sorted(self.served) if job.client_id in self.served[n]]
            if not nodes:
                results[job.client_id] = WorkerLost(
                    f"no connected SuperNode serves client {job.client_id}"
                )
                continue
            batches.setdefault(nodes[job.client_id % len(nodes)], []).append(job)
        self._reported = set()
        if self.secure is not None:
            results.update(secure_round(self, round_index, batches))
        elif batches:
            results.update(plain_round(self, round_index, batches))
        self.report_done(results)  # those no reply reported: lost, or under SecAgg+
        # the global RNG as a sequential round leaves it: seeded for the last client's fit
        if jobs:
            seed_fit(derive_seed(self.config.seed, "fit", round_index, jobs[-1].client_id))
        return {job.client_id: results[job.client_id] for job in jobs}

    def report_done(self, client_ids: Iterable[int]) -> None:
        """Tell ``on_client_done`` about each of ``client_ids`` not yet reported this round."""
        for cid in client_ids:
            if cid not in self._reported and self.on_client_done is not None:
                self.on_client_done(cid)
            self._reported.add(cid)

    def stop(self) -> None:
        if self.transport is not None and hasattr(self.transport, "close"):
            self.transport.close()
        self.transport, self.served = None, {}
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
