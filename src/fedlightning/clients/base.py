"""ClientModule: the plain cross-entropy client (the FedAvg client, ALGORITHMS.md section 1.1).

Other objectives subclass it and override :meth:`ClientModule.local_loss` (FedProx) or the round
hooks :meth:`ClientModule.begin_client` / :meth:`ClientModule.end_client` (SCAFFOLD, MOON, FML).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model
from fedlightning.protocol import Payload, StateDict
from fedlightning.server.base import ClientKeys

if TYPE_CHECKING:
    from fedlightning.state import ClientStore


class ClientModule(pl.LightningModule):
    """Trains one client's copy of ``network`` for one round: ``loss = CE(f(x), y)``.

    The same module instance serves every client in turn: :meth:`begin_client` loads the server's
    payload and the client's persistent state, Lightning fits it, and :meth:`end_client` returns the
    upload and the new state. The optimizer is created fresh for every fit (no optimizer state
    crosses rounds).

    Args:
        network: a registered model name (see ``fedlightning.models.list_models()``) or any
            ``nn.Module`` producing logits.
        num_classes, in_channels, image_size: the input/output shape for a registered model
            (linked from the data module by the CLI).
        network_kwargs: extra keyword arguments for the registered model's builder.
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
    #: Lightning precisions this objective can train with (``None``: any), checked by
    #: :meth:`check_precision` in :meth:`setup`, before the first step
    supported_precisions: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        network: str | nn.Module = "cnn",
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 8,
        network_kwargs: dict[str, Any] | None = None,
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
        self.save_hyperparameters(ignore=["network"] if isinstance(network, nn.Module) else None)
        if isinstance(network, nn.Module):
            self.network = network
        else:
            self.network = create_model(
                network, num_classes, in_channels, image_size, **(network_kwargs or {})
            )
        self.num_classes = num_classes
        self.optimizer_name = optimizer
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_loss = MeanMetric()
        self.client_id: int | None = None
        self.payload: Payload | None = None
        self.state: dict[str, Any] = {}
        self._loss_sum: Tensor | float = 0.0
        self._loss_batches = 0

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    # -- one client's round ---------------------------------------------------------------------
    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        """Start client ``client_id``'s round from ``payload`` with its persistent ``state``."""
        self.client_id = client_id
        self.payload = payload
        self.state = state
        self.load_network_state(payload.weights)
        self._loss_sum = 0.0
        self._loss_batches = 0

    def end_client(self) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        """``(trained weights on CPU, upload extras, new persistent state)`` after the fit."""
        weights = {k: v.detach().to("cpu", copy=True) for k, v in self.network.state_dict().items()}
        return weights, {}, self.state

    def client_metrics(self) -> dict[str, float]:
        """Local training metrics of the round just fitted."""
        if not self._loss_batches:
            return {}
        return {"train_loss": float(self._loss_sum) / self._loss_batches}

    def load_network_state(self, weights: StateDict) -> None:
        """Copy ``weights`` into the network (all keys must match)."""
        self.network.load_state_dict(weights)

    def client_key_sets(self, num_clients: int) -> list[ClientKeys] | None:
        """Each client's architecture group and state_dict keys when clients train different
        architectures (passed to a ``heterogeneous`` aggregator's ``setup``); ``None``: every
        client trains the whole ``network``."""
        return None

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
        if stage == "fit":
            self.check_precision(str(self.trainer.precision))

    def evaluate_clients(
        self,
        client_ids: Sequence[int],
        store: ClientStore,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
        device: torch.device,
    ) -> dict[str, float]:
        """Extra metrics over the round's participating clients, called by the loop after its
        standard evaluation (e.g. FML's personal models on their own validation splits).

        Args:
            client_ids: the clients whose upload was aggregated this round.
            store: the ClientStore holding every client's persistent state.
            val_dataloader: ``val_dataloader(client_id)`` gives that client's validation batches.
            device: where the loop evaluates.
        """
        return {}

    # -- training -------------------------------------------------------------------------------
    def local_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The local objective on one batch; subclasses add their terms here."""
        return F.cross_entropy(self(x), y)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = self.local_loss(x, y)
        self._loss_sum = self._loss_sum + loss.detach()
        self._loss_batches += 1
        return loss

    def make_optimizer(self, params: Iterable[Tensor]) -> torch.optim.Optimizer:
        """The configured optimizer (SGD or Adam) over the trainable tensors of ``params``."""
        params = [p for p in params if p.requires_grad]
        if self.optimizer_name == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(
            params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self.parameters())

    # -- evaluation -----------------------------------------------------------------------------
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Global-model accuracy and loss on the global test set (``test_acc``, ``test_loss``)."""
        x, y = batch
        logits = self(x)
        self.test_acc(logits, y)
        self.test_loss(F.cross_entropy(logits, y, reduction="none"))
        self.log("test_acc", self.test_acc, on_step=False, on_epoch=True)
        self.log("test_loss", self.test_loss, on_step=False, on_epoch=True)

    def on_validation_epoch_start(self) -> None:
        self._val_correct: Tensor | None = None
        self._val_count: Tensor | None = None

    def validation_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> None:
        """Batches carry ``(x, y, client_id)``; accuracy is accumulated per client."""
        x, y, owner = batch
        correct = (self(x).argmax(dim=1) == y).to(torch.float64)
        size = int(owner.max()) + 1
        counts = torch.bincount(owner, minlength=size).to(torch.float64)
        hits = torch.bincount(owner, weights=correct, minlength=size)
        self._val_correct = _add_padded(self._val_correct, hits)
        self._val_count = _add_padded(self._val_count, counts)

    def on_validation_epoch_end(self) -> None:
        """``val_acc``: the unweighted mean over clients of each client's validation accuracy."""
        if self._val_count is None:
            return
        has_data = self._val_count > 0
        per_client = self._val_correct[has_data] / self._val_count[has_data]
        self.log("val_acc", per_client.mean().float())


def _add_padded(total: Tensor | None, part: Tensor) -> Tensor:
    if total is None:
        return part
    size = max(len(total), len(part))
    return F.pad(total, (0, size - len(total))) + F.pad(part, (0, size - len(part)))
