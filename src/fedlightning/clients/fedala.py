"""FedALA: Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning", AAAI 2023, arXiv:2212.01197 (section 4, the ALA module)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlightning.clients.base import ClientModule
from fedlightning.errors import require
from fedlightning.protocol import Payload, StateDict

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule


class FedALA(ClientModule):
    """FedALA (docs/algorithms.md section 10.14): a client does not overwrite its model with the
    global one; it starts its round from ``theta_hat = theta_i + (theta - theta_i) * W_i`` on the
    top ``layer_idx`` parameter tensors (the lower ones take the global ``theta``), with
    element-wise weights ``W_i`` in [0, 1] learned on a random ``rand_percent`` % of its training
    data (adaptive local aggregation). Per batch of that sample, with ``g`` the gradient of the
    cross-entropy of the model at ``theta_hat``::

        W <- clip(W - eta * g * (theta - theta_i), 0, 1);   theta_hat = theta_i + (theta - theta_i) * W

    One pass over the sample a round; in the client's first aggregation (the start phase) passes
    repeat until the standard deviation of the last ``num_pre_loss`` pass losses is below
    ``threshold``. Then it trains ``theta_hat`` on cross-entropy, uploads it (FedAvg averages) and
    keeps it (``local``, with ``W``), deploying its kept model. At its first participation it
    has no ``theta_i``: it starts from the global model (no aggregation).

    The aggregation runs in :meth:`begin_client`, before the fit, on the client's data from the
    data module (:meth:`prepare_clients`); the fit itself is plain cross-entropy, so every backend
    trains it, the cohort included.

    Args:
        eta: W's step size (> 0; the authors' code: 1.0).
        rand_percent: the share of the client's training data the weights learn on, in (0, 100]
            (the authors': 80).
        layer_idx: how many parameter tensors, counted from the output, are aggregated adaptively
            (>= 1; the authors': 2, the classifier's weight and bias).
        threshold: the start phase's stopping standard deviation (> 0; the authors': 0.1).
        num_pre_loss: the losses it looks back over (>= 2; the authors': 10).
        max_start_passes: a bound on the start phase's passes (>= 1; the authors' loop has none).
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    personalized: ClassVar[bool] = True
    bookkeeping_attributes: ClassVar[frozenset[str]] = ClientModule.bookkeeping_attributes | {
        "_datamodule"
    }

    def __init__(
        self, eta: float = 1.0, rand_percent: float = 80, layer_idx: int = 2,
        threshold: float = 0.1, num_pre_loss: int = 10, max_start_passes: int = 100,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        require(eta > 0, "model.eta", eta, "a number > 0")
        require(0 < rand_percent <= 100, "model.rand_percent", rand_percent, "a number in (0, 100]")
        for name, value, least in (("layer_idx", layer_idx, 1), ("num_pre_loss", num_pre_loss, 2),
                                   ("max_start_passes", max_start_passes, 1)):  # fmt: skip
            require(type(value) is int and value >= least, f"model.{name}", value,
                    f"an integer >= {least}")  # fmt: skip
        require(threshold > 0, "model.threshold", threshold, "a number > 0")
        super().__init__(**kwargs)
        self.eta, self.rand_percent, self.layer_idx = eta, rand_percent, layer_idx
        self.threshold, self.num_pre_loss, self.max_start_passes = (
            threshold, num_pre_loss, max_start_passes,
        )  # fmt: skip
        self._datamodule: FederatedDataModule | None = None
        self._ala_weights: dict[str, Tensor] = {}

    def prepare_clients(self, datamodule: FederatedDataModule) -> None:
        super().prepare_clients(datamodule)
        self._datamodule = datamodule

    def top_names(self) -> list[str]:
        """The adaptively aggregated parameters: the last ``layer_idx`` trainable ones."""
        names = [n for n, p in self.network.named_parameters() if p.requires_grad]
        return names[-self.layer_idx :]

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        weights = state.get("ala_weights") or {
            n: torch.ones_like(payload.weights[n]) for n in self.top_names()
        }
        if "local" in state:  # else no local model yet: the global one, W untouched
            weights = self._aggregate(client_id, payload.weights, state, weights)
        #: W (round context: each client's own)
        self._ala_weights = {n: v.to(self.device) for n, v in weights.items()}

    def _aggregate(self, client_id: int, global_: StateDict, state: Mapping[str, Any],
                   weights: dict[str, Tensor]) -> dict[str, Tensor]:  # fmt: skip
        """Learn W (class docstring) and load theta_hat's top tensors; returns W."""
        params = dict(self.network.named_parameters())
        device = next(iter(params.values())).device
        local = {n: state["local"][n].to(device) for n in weights}
        diff = {n: global_[n].to(device) - local[n] for n in weights}
        w = {n: v.to(device).clone() for n, v in weights.items()}

        def load() -> None:
            with torch.no_grad():
                for n in w:
                    params[n].copy_(local[n] + diff[n] * w[n])

        load()
        losses: list[float] = []
        for _ in range(1 if state.get("ala_started") else self.max_start_passes):
            for x, y in self._sample(client_id):
                with torch.enable_grad():
                    loss = F.cross_entropy(self.network(x.to(device)), y.to(device))
                    grads = torch.autograd.grad(loss, [params[n] for n in w])
                with torch.no_grad():
                    for n, g in zip(w, grads, strict=True):
                        w[n] = (w[n] - self.eta * g * diff[n]).clamp(0.0, 1.0)
                load()
            losses.append(float(loss.detach()))
            recent = losses[-self.num_pre_loss :]
            if len(losses) > self.num_pre_loss and statistics.pstdev(recent) < self.threshold:
                break
        return {n: v.detach().cpu() for n, v in w.items()}

    def _sample(self, client_id: int) -> list[tuple[Tensor, Tensor]]:
        """The batches of a contiguous ``rand_percent`` % of the client's training samples,
        from a start drawn off the fit's random stream (forked: training draws the same)."""
        if self._datamodule is None:
            raise RuntimeError(
                "FedALA learns its aggregation weights on the client's training data: call "
                "prepare_clients(datamodule) before the first fit (the loop does)"
            )
        data = self._datamodule.client_train_dataloader(client_id, seed=0)
        total = len(data.y)
        size = max(1, int(self.rand_percent * total / 100))
        with torch.random.fork_rng(devices=[]):
            start = int(torch.randint(0, total - size + 1, ()))
        x, y = data.x[start : start + size], data.y[start : start + size]
        step = self._datamodule.batch_size
        dtype = next(self.network.parameters()).dtype
        return [(x[i : i + step].to(dtype), y[i : i + step]) for i in range(0, size, step)]

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        """Upload the trained model; keep it (``local``) with W; the start phase is over."""
        weights, extras, state = super().end_client(num_steps)
        local = {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}
        ala = {n: v.detach().to("cpu", copy=True) for n, v in self._ala_weights.items()}
        new = {**state, "local": local, "ala_weights": ala, "ala_started": "local" in state}
        return weights, extras, new

    def personal_state(
        self, client_id: int, state: Mapping[str, Any], deployed: StateDict
    ) -> StateDict:
        """The client's kept model; before its first fit, the global model."""
        return state.get("local", deployed)
