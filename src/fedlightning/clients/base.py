"""ClientModule: the plain cross-entropy client (the FedAvg client, docs/algorithms.md section 1.1)
and the contract every client objective follows.

An objective states its local objective as one method, :meth:`ClientModule.local_loss`, computed
from the module's own forward; the round context it needs (the dispatched weights, a control
variate, frozen models) is prepared in :meth:`ClientModule.begin_client` as attributes of the
module, and :meth:`ClientModule.end_client` returns the upload and the new persistent state. The
same ``local_loss`` drives every backend (:mod:`fedlightning.fit`); the cohort backend stacks the
attributes per client with nothing declared (:mod:`fedlightning.backends.cohort.context`). Any
objective trains heterogeneous clients by the ``networks`` option, with no subclass.

Who owns what (docs/algorithms.md section 6.1): the objective owns the network it is training
(``network``, one group's at a time) and its round context; the client groups own every
architecture's network (:class:`~fedlightning.clients.groups.ClientGroups`); the cohort backend
owns each client's captured view; the scoring path owns the networks it scores
(:class:`~fedlightning.scoring.ScoringNetworks`), told how by :mod:`fedlightning.clients.
evaluation_hooks`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.clients.batch_metrics import BatchMetrics
from fedlightning.clients.evaluation_hooks import EvaluationHooks
from fedlightning.clients.groups import ClientGroups
from fedlightning.clients.per_client import VECTORIZED_FLAG, per_client_input
from fedlightning.errors import ConfigurationError, require
from fedlightning.models import create_model
from fedlightning.protocol import ClientKeys, Payload, StateDict

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule


class ClientModule(EvaluationHooks, pl.LightningModule):
    """Trains one client's copy of ``network`` for one round: ``loss = CE(f(x), y)``.

    The same module instance serves every client in turn: :meth:`begin_client` loads the server's
    payload and the client's persistent state (the module is already on its fitting device), the
    fit minimises :meth:`local_loss`, and :meth:`end_client` returns the upload and the new state.
    The optimizer is created fresh for every fit (no optimizer state crosses rounds).

    Heterogeneous clients: ``networks`` lists registered model names whose state_dict keys nest
    (e.g. ``resnet10 .. resnet26``); they are ordered by parameter count, smallest first, and the
    clients split into that many equal, contiguous groups
    (:func:`~fedlightning.clients.groups.assign_groups`). The largest architecture is the server
    model. Every group's network is built once and owned by :attr:`client_groups`; a payload's
    key set selects the group whose network becomes ``self.network``, so an objective's own code
    sees exactly the client's architecture.

    Evaluation never runs this module: it scores copies of :attr:`client_groups`' networks in
    eval mode (docs/algorithms.md section 6.1; the hooks: :class:`~fedlightning.clients.
    evaluation_hooks.EvaluationHooks`).

    Args:
        network: a registered model name (see ``fedlightning.models.list_models()``) or any
            ``nn.Module`` producing logits.
        num_classes, in_channels, image_size: the input/output shape for a registered model
            (linked from the data module by the CLI).
        network_kwargs: extra keyword arguments for the registered model's builder.
        networks: registered model names of the client groups' architectures (heterogeneous
            clients); ``network`` is then ignored. ``null``: every client trains ``network``.
        optimizer: ``sgd`` or ``adam``.
        lr: learning rate (> 0).
        momentum: SGD momentum in [0, 1).
        weight_decay: L2 penalty (>= 0).
    """

    #: payload extras this objective needs from the aggregator (e.g. SCAFFOLD's ``c``)
    required_payload_extras: ClassVar[frozenset[str]] = frozenset()
    #: upload extras this objective produces (e.g. SCAFFOLD's ``delta_c``)
    upload_extras: ClassVar[frozenset[str]] = frozenset()
    #: how the aggregator must weight this objective's uploads (``None``: as configured; FML:
    #: ``"uniform"``), checked at start-up against an aggregator's ``weighting`` option
    required_weighting: ClassVar[str | None] = None
    #: the aggregators this objective needs, by class name (any base class's counts, and an inner
    #: aggregator's under InCo or client-level DP) or capability (an aggregator's
    #: ``capabilities``): one of them, checked at start-up; empty: any aggregator
    required_aggregator: ClassVar[frozenset[str]] = frozenset()
    #: names an aggregator's ``served_objectives`` may ask for, besides this class's names
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: Lightning precisions this objective can train with (``None``: any), checked at start-up
    supported_precisions: ClassVar[frozenset[str] | None] = None
    #: the fewest samples a training batch of this objective may hold, and why (Per-FedAvg's
    #: two halves), refused at start-up as BatchNorm's two are (docs section 4.1); 1: any batch
    min_batch_samples: ClassVar[tuple[int, str]] = (1, "")
    #: The base class's own bookkeeping, never round context: the cohort backend stacks per
    #: client the tensors and frozen modules of every other attribute (besides those of a bare
    #: LightningModule). The round's inputs (properties ``client_id``, ``payload``, ``state``:
    #: ``local_loss`` must not read them under the cohort, copy what it needs in
    #: :meth:`begin_client`), the tracked metrics, the client groups and the active one, the
    #: constructor's settings, ``save_hyperparameters``' record, the cohort's flag and the fit's
    #: planned steps.
    bookkeeping_attributes: ClassVar[frozenset[str]] = frozenset({
        "_client_id", "_payload", "_state", "_batch_metrics", "client_groups", "group_index",
        "num_classes", "optimizer_name", "lr", "momentum", "weight_decay",
        "_hparams", "_hparams_initial", "_hparams_name", VECTORIZED_FLAG, "planned_steps",
    })  # fmt: skip

    client_id = per_client_input("client_id", "the client being fitted (``None`` outside a fit)")
    payload = per_client_input("payload", "the server's :class:`~fedlightning.Payload` this round")
    state = per_client_input("state", "the client's persistent state as its round began")

    def __init__(
        self,
        network: str | nn.Module = "cnn",
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 8,
        network_kwargs: dict[str, Any] | None = None,
        networks: list[str] | None = None,
        optimizer: Literal["sgd", "adam"] = "sgd",
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        if optimizer not in ("sgd", "adam"):
            raise ConfigurationError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        if not lr > 0:
            raise ConfigurationError(f"lr must be > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ConfigurationError(f"momentum must lie in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ConfigurationError(f"weight_decay must be >= 0, got {weight_decay}")
        if networks is not None:
            require(
                len(set(networks)) == len(networks) >= 1,
                "model.networks",
                networks,
                "null or distinct registered model names",
            )
        self.save_hyperparameters(ignore=["network"] if isinstance(network, nn.Module) else None)
        self.num_classes = num_classes
        self.optimizer_name = optimizer
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.client_id: int | None = None
        self.payload: Payload | None = None
        self.state: dict[str, Any] = {}
        #: the optimizer steps the current fit will take (``local_steps``, or ``local_epochs``
        #: passes over the client's batches), set by the fit before ``begin_client``; ``None``
        #: outside such a fit (the cohort backend's fits: it steps no schedule that needs it)
        self.planned_steps: int | None = None
        self._batch_metrics = BatchMetrics()
        if networks is None:
            built = network if isinstance(network, nn.Module) else self.create_network(network)
            name = network if isinstance(network, str) else None
            #: every architecture's network (one without client groups): docs/algorithms.md 6.1
            self.client_groups = ClientGroups([name], [self.wrap_network(built)], grouped=False)
        else:
            self.client_groups = ClientGroups.build(
                list(networks), lambda name: self.wrap_network(self.create_network(name))
            )
        #: the group whose network :attr:`network` is (the server model's at construction)
        self.group_index = self.client_groups.server_index
        self.network = self.client_groups.networks[self.group_index]

    def create_network(self, name: str) -> nn.Module:
        """The registered model ``name`` built for this module's input/output shape."""
        hp = self.hparams
        return create_model(
            name, hp.num_classes, hp.in_channels, hp.image_size, **(hp.network_kwargs or {})
        )

    def wrap_network(self, network: nn.Module) -> nn.Module:
        """The network this objective trains around a built ``network`` (MOON adds its projection
        head); called for every group's architecture too."""
        return network

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    # -- one client's round ---------------------------------------------------------------------
    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        """Start client ``client_id``'s round from ``payload`` with its persistent ``state``.

        Called with the module on its fitting device; objectives prepare their round context here
        (tensors on ``self.device``)."""
        self.client_id = client_id
        self.payload = payload
        self.state = state
        self.load_network_state(payload.weights)
        self._batch_metrics = BatchMetrics()

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        """``(trained weights, upload extras, new persistent state)`` after a fit that took
        ``num_steps`` optimizer steps (K_i). The weights are copies on the fitting device: an
        upload stays on the GPU for the server, which lives there too
        (:mod:`fedlightning.loop.server_device`); the ClientStore copies state to the CPU."""
        weights = {k: v.detach().clone() for k, v in self.network.state_dict().items()}
        return weights, {}, self.state

    def client_metrics(self) -> dict[str, float]:
        """Local training metrics of the round just fitted: the mean over the fit's batches of
        every value :meth:`track` recorded (``train_loss``: the local loss, unless the objective
        tracks its own)."""
        return self._batch_metrics.means()

    @property
    def batch_metrics(self) -> BatchMetrics:
        """This round's per-batch metrics: a fit step runs through its ``step`` (on every backend)."""
        return self._batch_metrics

    def track(self, name: str, value: Tensor | float) -> None:
        """Record ``value`` (one number) as this batch's ``name``, from :meth:`local_loss`; the
        round's :meth:`client_metrics` report its mean over the fit's batches, on every backend.
        ``train_loss`` is recorded from ``local_loss``'s value unless the objective tracks it
        (e.g. its data loss without a regulariser). Ignored outside a fit step."""
        self._batch_metrics.record(name, value)

    @property
    def groups(self) -> list[str]:
        """The client groups' architecture names, smallest first (empty for homogeneous clients)."""
        return self.client_groups.names

    @property
    def group(self) -> str | None:
        """The active group's architecture name (``None`` for homogeneous clients)."""
        return self.groups[self.group_index] if self.groups else None

    def load_network_state(self, weights: StateDict) -> None:
        """Copy ``weights`` into the network; with client groups, first activate the group whose
        architecture has exactly ``weights``' keys (:meth:`ClientGroups.activate
        <fedlightning.clients.groups.ClientGroups.activate>`: on this network's device, dtype and
        mode)."""
        index = self.client_groups.index_of(weights)
        if index != self.group_index:
            self.network = self.client_groups.activate(index, self.network)
            self.group_index = index
            self.on_group_change()
        self.network.load_state_dict(weights)

    def on_group_change(self) -> None:
        """Called after another group's network became ``self.network`` (drop per-architecture
        caches, e.g. MOON's frozen copies)."""

    def client_key_sets(self, num_clients: int) -> list[ClientKeys] | None:
        """Each client's architecture group and state_dict keys (``None``: every client trains the
        whole ``network``), passed to the aggregator's ``setup``."""
        return self.client_groups.client_key_sets(num_clients)

    def server_parameter_names(self) -> frozenset[str]:
        """The state_dict keys of the server model (the largest group's network with
        ``networks``) that are trainable parameters, passed to the aggregator's ``setup``: what a
        server update steps; every other entry is a buffer (BatchNorm statistics, counters)."""
        return self.client_groups.server_parameter_names()

    @classmethod
    def check_precision(cls, precision: str) -> None:
        """Raise a ConfigurationError if this objective cannot train in ``precision``."""
        allowed = cls.supported_precisions
        if allowed is not None and precision not in allowed:
            raise ConfigurationError(
                f"loop.precision={precision!r} is not supported by {cls.__name__} (see its "
                f"docstring): use one of {', '.join(sorted(allowed))}"
            )

    def setup(self, stage: str) -> None:
        if stage == "fit":  # a Trainer fit (Fabric fits are checked by the loop at start-up)
            self.check_precision(str(self.trainer.precision))

    def prepare_clients(self, datamodule: FederatedDataModule) -> None:
        """Called once by the loop (and by a Flower node) with the set-up data module, before any
        fit: objectives that derive per-client settings from the data (FML's label spaces for its
        adaptor heads) override it. The default does nothing."""

    # -- training -------------------------------------------------------------------------------
    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """The local objective on one ``(x, y)`` batch; objectives add their terms here."""
        x, y = batch
        return F.cross_entropy(self(x), y)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """:meth:`local_loss`, with the values it tracked (and ``train_loss``) added to the fit's
        metrics. Objectives override ``local_loss``; one that overrides this hook gets a Trainer
        for its fits."""
        loss, tracked = self.batch_metrics.step(self.local_loss, batch)
        for name, value in tracked.items():
            self.batch_metrics.add(name, value)
        return loss

    def make_optimizer(self, params: Iterable[Tensor]) -> torch.optim.Optimizer:
        """The configured optimizer (SGD or Adam) over the trainable tensors of ``params``."""
        params = [p for p in params if p.requires_grad]
        if self.optimizer_name == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(
            params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )

    def configure_optimizers(self) -> Any:
        return self.make_optimizer(self.parameters())
