"""FML: Shen et al., "Federated Mutual Learning", arXiv:2006.16765 (2020) (section 3, Algorithm 1;
deep mutual learning between a private model and the shared meme model)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.clients.base import ClientModule
from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model
from fedlightning.protocol import Payload, StateDict
from fedlightning.state import ClientStore


def dml_losses(
    out_meme: Tensor, out_local: Tensor, y: Tensor, alpha: float, beta: float
) -> tuple[Tensor, Tensor]:
    """The two deep-mutual-learning losses on one batch, ``(loss_meme, loss_local)``:

    ``loss_local = alpha CE(out_local, y) + (1 - alpha) KL(p_meme || p_local)``
    ``loss_meme  = beta  CE(out_meme, y)  + (1 - beta)  KL(p_local || p_meme)``

    with ``p = softmax(out)`` (temperature 1), KL averaged over the batch and the partner's output
    detached in each loss. A KL term with weight 0 is not computed (so ``beta = 1`` is exactly CE).
    """

    def mixed(out: Tensor, partner: Tensor, weight: float) -> Tensor:
        loss = F.cross_entropy(out, y)
        if weight == 1:
            return loss
        # kl_div(input=log q, target=log p) = KL(p || q): the partner's distribution is the target
        kl = F.kl_div(
            F.log_softmax(out, dim=1),
            F.log_softmax(partner.detach(), dim=1),
            reduction="batchmean",
            log_target=True,
        )
        return weight * loss + (1 - weight) * kl

    return mixed(out_meme, out_local, beta), mixed(out_local, out_meme, alpha)


class FML(ClientModule):
    """Federated mutual learning (ALGORITHMS.md 1.6): on every batch the meme model (the dispatched
    global model, ``network``) and the client's personal model see the same ``x`` and each takes
    one optimizer step on its :func:`dml_losses` term. The meme model is uploaded; the personal
    model (any registered architecture, ``personal_network``) and its optimizer state stay in the
    ClientStore and never reach the server. Pair with ``FedAvg(weighting="uniform")`` (the paper
    averages the memes uniformly); ``beta = 1`` then is exactly uniform FedAvg on the meme side.

    A client's personal model is initialised at its first participation, from a generator forked
    off the loop's seeded per-fit RNG (so it does not shift the meme side's random stream). Its
    optimizer (same kind and hyper-parameters as the meme's) carries its state across rounds; the
    meme's optimizer is fresh every round. The two models train with Lightning manual optimization;
    only the meme's steps are counted by the Trainer, so ``global_step`` (and ``local_steps``)
    count batches. Precision ``16-mixed`` is refused: the personal model's optimizer runs outside
    Lightning's gradient scaler.

    :meth:`evaluate_clients` reports ``personal_acc``: each participating client's personal model
    on its own validation split, averaged over those clients (unweighted, like ``val_acc``).

    Args:
        alpha: weight of the personal model's CE against its KL to the meme, in [0, 1].
        beta: weight of the meme model's CE against its KL to the personal model, in [0, 1].
        personal_network: registered model name of the personal model (default: ``network``).
        personal_network_kwargs: builder arguments of the personal model (default: the meme's when
            the architectures are the same, none otherwise).
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    required_weighting: ClassVar[str | None] = "uniform"  # the server's mean of the memes
    supported_precisions: ClassVar[frozenset[str]] = frozenset(
        {"32-true", "32", "bf16-mixed", "64-true"}
    )

    def __init__(
        self,
        alpha: float = 0.5,
        beta: float = 0.5,
        personal_network: str | None = None,
        personal_network_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        for name, value in (("alpha", alpha), ("beta", beta)):
            if not 0.0 <= value <= 1.0:
                raise ConfigurationError(f"FML {name} must lie in [0, 1], got {value}")
        super().__init__(**kwargs)
        if personal_network is None:
            personal_network = self.hparams.get("network")  # absent when network is a module
            if personal_network is None:
                raise ConfigurationError(
                    "FML personal_network must name a registered model when network is an nn.Module, got None"
                )
            if personal_network_kwargs is None:
                personal_network_kwargs = self.hparams.get("network_kwargs")
        self.personal_spec = (personal_network, dict(personal_network_kwargs or {}))
        self.personal = self._build_personal()
        self.alpha = alpha
        self.beta = beta
        self.automatic_optimization = False
        self._personal_optimizer: torch.optim.Optimizer | None = None
        self._personal_loss_sum: Tensor | float = 0.0

    def _build_personal(self) -> nn.Module:
        name, kwargs = self.personal_spec
        return create_model(
            name, self.num_classes, self.hparams.in_channels, self.hparams.image_size, **kwargs
        )

    # -- one client's round ---------------------------------------------------------------------
    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        if "personal" in state:
            self.personal.load_state_dict(state["personal"])
        else:
            with torch.random.fork_rng(devices=[]):
                self.personal.load_state_dict(self._build_personal().state_dict())
        self.personal.train()
        self._personal_loss_sum = 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # the personal optimizer is ours, not Lightning's: the Trainer then counts meme steps only
        self._personal_optimizer = self.make_optimizer(self.personal.parameters())
        if "optimizer" in self.state:
            # a copy: load_state_dict may alias the stored tensors, which the steps then modify
            self._personal_optimizer.load_state_dict(copy.deepcopy(self.state["optimizer"]))
        return self.make_optimizer(self.network.parameters())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        loss_meme, loss_local = dml_losses(
            self.network(x), self.personal(x), y, self.alpha, self.beta
        )
        meme_optimizer = self.optimizers()
        meme_optimizer.zero_grad()
        self._personal_optimizer.zero_grad()
        # the graphs are disjoint (partners detached): each model gets the gradient of its own loss
        self.manual_backward(loss_meme + loss_local)
        meme_optimizer.step()
        self._personal_optimizer.step()
        self._loss_sum = self._loss_sum + loss_meme.detach()
        self._personal_loss_sum = self._personal_loss_sum + loss_local.detach()
        self._loss_batches += 1

    def end_client(self) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client()
        personal = {
            k: v.detach().to("cpu", copy=True) for k, v in self.personal.state_dict().items()
        }
        state = {**state, "personal": personal, "optimizer": self._personal_optimizer.state_dict()}
        self._personal_optimizer = None
        return weights, extras, state

    def client_metrics(self) -> dict[str, float]:
        metrics = super().client_metrics()
        if self._loss_batches:
            metrics["personal_train_loss"] = float(self._personal_loss_sum) / self._loss_batches
        return metrics

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate_clients(
        self,
        client_ids: Sequence[int],
        store: ClientStore,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
        device: torch.device,
    ) -> dict[str, float]:
        """``personal_acc``: the mean over ``client_ids`` of each personal model's accuracy on its
        client's validation split (clients without validation samples are left out)."""
        model = self.personal.to(device).eval()
        dtype = next(model.parameters()).dtype
        accuracies = []
        with torch.no_grad():
            for cid in client_ids:
                state = store.get(cid)
                if "personal" not in state:
                    continue
                model.load_state_dict(state["personal"])
                correct, count = 0, 0
                for x, y in val_dataloader(cid):
                    prediction = model(x.to(device, dtype)).argmax(dim=1)
                    correct += int((prediction == y.to(device)).sum())
                    count += len(y)
                if count:
                    accuracies.append(correct / count)
        model.train()
        return {"personal_acc": sum(accuracies) / len(accuracies)} if accuracies else {}
