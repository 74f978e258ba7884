"""FedRoD: Chen, Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022, arXiv:2107.00778 (section 4: the balanced-softmax generic head and
the personalized head)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.clients.base import ClientModule
from fedlightning.clients.evaluation_hooks import PersonalNetwork
from fedlightning.clients.groups import refuse_groups
from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model
from fedlightning.protocol import Payload, StateDict

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule


def features_and_logits(network: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(features, logits)`` of ``network`` on ``x``: the input of its ``head`` (the registered
    models' classifier) and its output."""
    captured: list[Tensor] = []
    handle = network.head.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))
    try:
        logits = network(x)
    finally:
        handle.remove()
    return captured[0], logits


class TwoHeads(nn.Module):
    """The deployed FedRoD model: ``network(x) + p_head(features)``, the generic logits plus the
    personalized head's on the same features."""

    def __init__(self, network: nn.Module, p_head: nn.Module) -> None:
        super().__init__()
        self.network, self.p_head = network, p_head

    def forward(self, x: Tensor) -> Tensor:
        features, logits = features_and_logits(self.network, x)
        return logits + self.p_head(features)


class FedRoD(ClientModule):
    """FedRoD (docs/algorithms.md section 10.13): the network (body and generic head, shared and
    averaged) is trained on the balanced softmax loss ``CE(z_G + log pi_i, y)``, ``pi_i`` the
    client's training label distribution, ``z_G`` the network's logits; the client's personalized
    head ``h_P`` (a linear layer on the network's features ``phi``, kept in its state) is trained
    on ``CE(z_G + h_P(phi), y)`` with ``z_G`` and ``phi`` detached. One optimizer over both:
    the two losses touch disjoint parameters. The client deploys ``z_G + h_P(phi)``
    (:class:`TwoHeads`); ``h_P`` starts at zero (the generic model) and is that before the
    client's first fit. Classes the client does not hold get ``log pi = -inf``: the loss never
    puts mass on them.

    Args:
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments; the network must
            have a ``head`` classifier (every registered model does).
    """

    personalized: ClassVar[bool] = True
    bookkeeping_attributes: ClassVar[frozenset[str]] = ClientModule.bookkeeping_attributes | {
        "_label_counts"
    }

    def __init__(self, **kwargs: Any) -> None:
        refuse_groups(kwargs.get("networks"), "FedRoD", "puts its personalized head on one "
                      "network's features, and client groups of several architectures have "
                      "none")  # fmt: skip
        super().__init__(**kwargs)
        head = getattr(self.network, "head", None)
        if not isinstance(head, nn.Linear):
            raise ConfigurationError(
                "FedRoD puts its personalized head beside the network's linear classifier "
                "`head`, and this network has none: use a registered model"
            )
        #: the client's personalized head h_P
        self.p_head = nn.Linear(head.in_features, head.out_features)
        self._label_counts: Tensor | None = None
        self._log_prior = torch.zeros(head.out_features)

    def prepare_clients(self, datamodule: FederatedDataModule) -> None:
        super().prepare_clients(datamodule)
        self._label_counts = torch.as_tensor(datamodule.partition_table(), dtype=torch.float64)

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        if self._label_counts is None:
            raise RuntimeError(
                "FedRoD's balanced softmax needs the clients' label counts: call "
                "prepare_clients(datamodule) before the first fit (the loop does)"
            )
        self.p_head.load_state_dict(state.get("p_head", self._zero_head()))
        counts = self._label_counts[client_id]
        prior = (counts / counts.sum()).log().to(self.device, next(self.parameters()).dtype)
        self._log_prior = prior

    def _zero_head(self) -> StateDict:
        return {k: torch.zeros_like(v) for k, v in self.p_head.state_dict().items()}

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        features, logits = features_and_logits(self.network, x)
        generic = F.cross_entropy(logits + self._log_prior, y)
        personal = F.cross_entropy(logits.detach() + self.p_head(features.detach()), y)
        self.track("train_loss", generic)
        self.track("personal_train_loss", personal)
        return generic + personal

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        head = {k: v.detach().to("cpu", copy=True) for k, v in self.p_head.state_dict().items()}
        return weights, extras, {**state, "p_head": head}

    def personal_network(self, client_id: int) -> PersonalNetwork:
        name = self.hparams.get("network")
        if not isinstance(name, str):
            raise ConfigurationError(
                "FedRoD's personalized evaluation rebuilds the network by its registered name: "
                "give model.network as a name"
            )
        kwargs = dict(self.hparams.get("network_kwargs") or {})
        shape = (self.num_classes, self.hparams.in_channels, self.hparams.image_size)
        features = self.p_head.in_features

        def build() -> nn.Module:
            network = create_model(name, *shape, **kwargs)
            return TwoHeads(network, nn.Linear(features, self.num_classes))

        return PersonalNetwork(f"fedrod:{name}", build)

    def personal_state(
        self, client_id: int, state: Mapping[str, Any], deployed: StateDict
    ) -> StateDict:
        """The deployable as ``network.*`` and the client's head as ``p_head.*`` (zero before its
        first fit: the generic model)."""
        head = state.get("p_head") or self._zero_head()
        return {**{f"network.{k}": v for k, v in deployed.items()},
                **{f"p_head.{k}": v for k, v in head.items()}}  # fmt: skip
