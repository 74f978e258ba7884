"""FML: Shen et al., "Federated Mutual Learning", arXiv:2006.16765 (2020) (section 3, Algorithm 1;
deep mutual learning between a private model and the shared meme model)."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.clients.base import ClientModule
from fedlightning.clients.fml_evaluation import FMLEvaluation
from fedlightning.clients.fml_heads import AdaptorHeads, mask_logits
from fedlightning.errors import ConfigurationError, require
from fedlightning.models import create_model
from fedlightning.protocol import Payload, StateDict


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


class FML(FMLEvaluation, AdaptorHeads, ClientModule):
    """Federated mutual learning (docs/algorithms.md 1.6): on every batch the meme model (the
    dispatched global model, ``network``) and the client's personal model see the same ``x``; the
    local objective is ``loss_meme + loss_local`` (:func:`dml_losses`, each partner detached), so
    one optimizer step moves each model along the gradient of its own term. The meme model is uploaded; the personal
    model (any registered architecture, ``personal_network``) and its optimizer state stay in the
    ClientStore and never reach the server. Pair with ``FedAvg(weighting="uniform")`` (the paper
    averages the memes uniformly); ``beta = 1`` then is exactly uniform FedAvg on the meme side.

    A client's personal model is initialised at its first participation, from a generator forked
    off the loop's seeded per-fit RNG (so it does not shift the meme side's random stream). Its
    parameters are a second parameter group of the one optimizer (same kind and hyper-parameters as
    the meme's); that group's state (momentum, Adam moments) carries across rounds in the
    ClientStore, while the meme's is fresh every round. Steps (and ``local_steps``) count batches.

    Each client deploys its personal model: the loop's personalized evaluation scores every client
    that holds one on its own split (``personal_acc`` with its distribution,
    :mod:`fedlightning.loop.personal`; the validation split unless the data has client test
    splits), and with adaptor heads FML adds ``adaptor_acc`` (:mod:`fedlightning.clients.
    fml_evaluation`).

    With ``alpha = 1`` the personal model's loss is its own CE only (the meme's output enters
    neither its loss nor its gradient), so ``personal_acc`` is then the paper's
    independent-training (local only) baseline.

    Training metrics (tracked per batch, the same on every backend): ``train_loss`` is the meme
    model's loss ``loss_meme``, ``personal_train_loss`` the personal model's ``loss_local``.

    Args:
        alpha: weight of the personal model's CE against its KL to the meme, in [0, 1].
        beta: weight of the meme model's CE against its KL to the personal model, in [0, 1].
        personal_network: registered model name of the personal model (default: ``network``).
        personal_network_kwargs: builder arguments of the personal model (default: the meme's when
            the architectures are the same, none otherwise).
        personal_networks: per-client personal architectures (the paper's mix, e.g.
            ``[mlp, lenet5, fml_cnn1, fml_cnn2, fml_cnn2]``): client i's personal model is
            ``personal_networks[i mod len]``, built with the meme's builder arguments when it is
            the meme's architecture and with none otherwise. Overrides ``personal_network``.
        adaptor_features: clients with different label spaces (docs/algorithms.md 1.6,
            :mod:`fedlightning.clients.fml_heads`): the meme ``network`` becomes a backbone with
            this many output features, shared and averaged; each client keeps a private adaptor
            head ``Linear(adaptor_features, num_classes)`` masked to its own label space (the
            classes of its training samples), trained locally beside its personal model and never
            uploaded. ``null``: the meme is the whole classifier.

        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    required_weighting: ClassVar[str | None] = "uniform"  # the server's mean of the memes

    def __init__(
        self,
        alpha: float = 0.5,
        beta: float = 0.5,
        personal_network: str | None = None,
        personal_network_kwargs: dict[str, Any] | None = None,
        personal_networks: list[str] | None = None,
        adaptor_features: int | None = None,
        **kwargs: Any,
    ) -> None:
        for name, value in (("alpha", alpha), ("beta", beta)):
            if not 0.0 <= value <= 1.0:
                raise ConfigurationError(f"FML {name} must lie in [0, 1], got {value}")
        require(
            adaptor_features is None or (type(adaptor_features) is int and adaptor_features >= 1),
            "model.adaptor_features", adaptor_features, "null or an integer >= 1",
        )  # fmt: skip
        super().__init__(**kwargs)
        self.adaptor_features = adaptor_features
        self.label_spaces: Tensor | None = None  # one clients x classes mask
        self._eval_head: tuple[Tensor, Tensor] | None = None
        if adaptor_features is not None:
            self.head = nn.Linear(adaptor_features, self.num_classes)
            self.label_mask = torch.ones(self.num_classes, dtype=torch.bool)
        if personal_networks is not None and not personal_networks:
            raise ConfigurationError(
                "FML personal_networks must be null or a non-empty list, got []"
            )
        self.personal_names = list(personal_networks or [])
        if self.personal_names:
            personal_network = self.personal_names[0]
            if personal_network_kwargs is None and personal_network == self.hparams.get("network"):
                personal_network_kwargs = self.hparams.get("network_kwargs")
        if personal_network is None:
            personal_network = self.hparams.get("network")  # absent when network is a module
            if personal_network is None:
                raise ConfigurationError(
                    "FML personal_network must name a registered model when network is an nn.Module, got None"
                )
            if personal_network_kwargs is None:
                personal_network_kwargs = self.hparams.get("network_kwargs")
        self.personal_spec = (personal_network, dict(personal_network_kwargs or {}))
        self._personal_specs = {personal_network: self.personal_spec}
        for name in self.personal_names:  # every architecture is checked at construction
            self._personal_specs.setdefault(name, self._spec_of(name))
            self._build_personal(name)
        self.personal = self._build_personal()
        self.alpha = alpha
        self.beta = beta
        self._optimizer: torch.optim.Optimizer | None = None

    def _spec_of(self, name: str) -> tuple[str, dict[str, Any]]:
        same = name == self.hparams.get("network")
        return name, dict((self.hparams.get("network_kwargs") or {}) if same else {})

    def personal_name(self, client_id: int) -> str:
        """Client ``client_id``'s personal architecture."""
        if not self.personal_names:
            return self.personal_spec[0]
        return self.personal_names[client_id % len(self.personal_names)]

    def _build_personal(self, name: str | None = None) -> nn.Module:
        name, kwargs = self._personal_specs[name or self.personal_spec[0]]
        return create_model(
            name, self.num_classes, self.hparams.in_channels, self.hparams.image_size, **kwargs
        )

    def _use_personal(self, client_id: int) -> None:
        """Make ``self.personal`` client ``client_id``'s architecture (on the meme's device)."""
        name = self.personal_name(client_id)
        if getattr(self, "_personal_active", self.personal_spec[0]) != name:
            device = next(self.network.parameters()).device
            with torch.random.fork_rng(devices=[]):  # never shifts the fit's random stream
                self.personal = self._build_personal(name).to(device)
            self._personal_active = name

    # -- one client's round ---------------------------------------------------------------------
    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        self._use_personal(client_id)
        if "personal" in state:
            self.personal.load_state_dict(state["personal"])
        else:
            with torch.random.fork_rng(devices=[]):
                fresh = self._build_personal(self.personal_name(client_id))
                self.personal.load_state_dict(fresh.state_dict())
        self.personal.train()
        self._optimizer = None  # this fit's, from configure_optimizers
        if self.adaptor_features is not None:
            self._begin_head(client_id, state)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = self.make_optimizer(self.network.parameters())
        private = [*self.personal.parameters()]
        if self.adaptor_features is not None:
            private += [*self.head.parameters()]  # private like the personal model's
        personal = [p for p in private if p.requires_grad]
        optimizer.add_param_group({"params": personal})
        for param, saved in zip(personal, self.state.get("optimizer", []), strict=False):
            # copies on the parameter's device (scalars such as Adam's step stay where torch
            # keeps them): the steps update the optimizer state in place
            optimizer.state[param] = {
                k: _copy(v, param.device if isinstance(v, Tensor) and v.dim() else None)
                for k, v in saved.items()
            }
        self._optimizer = optimizer
        return optimizer

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        out_local = self.personal(x)
        if self.adaptor_features is not None:
            out_local = mask_logits(out_local, self.label_mask)
        loss_meme, loss_local = dml_losses(self.meme_logits(x), out_local, y, self.alpha, self.beta)
        self.track("train_loss", loss_meme)  # the shared model's loss, as other objectives report
        self.track("personal_train_loss", loss_local)
        # the graphs are disjoint (partners detached): each model gets the gradient of its own loss
        return loss_meme + loss_local

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        personal = {
            k: v.detach().to("cpu", copy=True) for k, v in self.personal.state_dict().items()
        }
        optimizer = self._optimizer
        saved = [] if optimizer is None else [
            {k: _copy(v, "cpu") for k, v in optimizer.state.get(p, {}).items()}
            for p in optimizer.param_groups[1]["params"]
        ]  # fmt: skip
        self._optimizer = None
        new = {**state, "personal": personal, "optimizer": saved}
        if self.adaptor_features is not None:
            new["head"] = {
                k: v.detach().to("cpu", copy=True) for k, v in self.head.state_dict().items()
            }
        return weights, extras, new


def _copy(value: Any, device: str | torch.device | None = None) -> Any:
    """A copy of one optimizer-state entry (tensors cloned, optionally moved)."""
    if isinstance(value, Tensor):
        return value.detach().to(device or value.device, copy=True)
    return copy.deepcopy(value)
