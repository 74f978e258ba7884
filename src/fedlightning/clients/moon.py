"""MOON: Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, arXiv:2103.16257
(section 3.3, equations 3-4; projection head as in the authors' code, github.com/QinbinLi/MOON)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.clients.base import ClientModule
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, StateDict


def moon_contrastive_loss(z: Tensor, z_glob: Tensor, z_prev: Tensor, tau: float) -> Tensor:
    """The model-contrastive loss, averaged over the batch:
    ``-log( e^{cos(z, z_glob)/tau} / (e^{cos(z, z_glob)/tau} + e^{cos(z, z_prev)/tau}) )``.

    Computed as a two-way cross-entropy with the global representation as the positive (the
    authors' code), which is the closed form above without overflow for small ``tau``.
    """
    logits = torch.stack(
        [F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], dim=1
    )
    target = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits / tau, target)


class ProjectedNetwork(nn.Module):
    """A backbone's representation ``h`` through the projection head ``Linear(d, d) -> ReLU ->
    Linear(d, projection_dim)``, and a new classifier on the projection: ``logits = head(z)``.

    The backbone's own classifier is dropped (replaced by ``nn.Identity``) so that no dead
    parameters travel to the server.
    """

    def __init__(self, backbone: nn.Module, num_classes: int, projection_dim: int = 256) -> None:
        super().__init__()
        d = backbone.feature_dim
        if hasattr(backbone, "head"):
            backbone.head = nn.Identity()
        self.backbone = backbone
        self.projection = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, projection_dim))
        self.head = nn.Linear(projection_dim, num_classes)
        self.feature_dim = projection_dim

    def forward_features(self, x: Tensor) -> Tensor:
        """The projected representation z."""
        return self.projection(self.backbone.forward_features(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.forward_features(x))


class MOON(ClientModule):
    """Cross-entropy plus the model-contrastive loss (docs/algorithms.md 1.3):
    ``loss = CE(head(z), y) + mu * l_con(z, z_glob, z_prev)`` with ``z = proj(h(x))`` from the
    model being trained, ``z_glob`` from the dispatched global model and ``z_prev`` from this
    client's model as it ended its previous participation (both frozen, in eval mode).

    The network is any registered backbone (it must expose ``forward_features`` and
    ``feature_dim``) wrapped in a :class:`ProjectedNetwork`, so the global model itself carries the
    projection head. The previous local model is per-client state in the ClientStore; on its first
    participation a client uses the dispatched model as ``z_prev`` (the official code seeds its
    buffer with the initial nets), which makes ``l_con = log 2`` a constant for that round.
    Pair with FedAvg.

    Args:
        mu: weight of the contrastive loss (>= 0); 1 in the official MOON, 0.001 in NIID-Bench.
        tau: temperature (> 0).
        projection_dim: output size of the projection head.
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    def __init__(
        self, mu: float = 1.0, tau: float = 0.5, projection_dim: int = 256, **kwargs: Any
    ) -> None:
        if not mu >= 0:
            raise ConfigurationError(f"MOON mu must be >= 0, got {mu}")
        if not tau > 0:
            raise ConfigurationError(f"MOON tau must be > 0, got {tau}")
        if projection_dim < 1:
            raise ConfigurationError(f"MOON projection_dim must be >= 1, got {projection_dim}")
        self.mu = mu
        self.tau = tau
        # frozen copies, deliberately not submodules: they are neither trained, nor moved to train
        # mode, nor part of the uploaded state_dict
        self._frozen: dict[str, nn.Module] = {}
        super().__init__(**kwargs)

    def wrap_network(self, network: nn.Module) -> nn.Module:
        if not (hasattr(network, "forward_features") and hasattr(network, "feature_dim")):
            raise ConfigurationError(
                f"MOON needs a network exposing forward_features() and feature_dim (every registered "
                f"model does), got {type(network).__name__}"
            )
        return ProjectedNetwork(network, self.hparams.num_classes, self.hparams.projection_dim)

    def on_group_change(self) -> None:
        self._frozen = {}

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        like = next(self.network.parameters())
        if not self._frozen:
            self._frozen = {
                k: copy.deepcopy(self.network).requires_grad_(False).eval()
                for k in ("global", "previous")
            }
        for net in self._frozen.values():
            net.to(device=like.device, dtype=like.dtype)
        self._frozen["global"].load_state_dict(payload.weights)
        self._frozen["previous"].load_state_dict(state.get("previous", payload.weights))

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        z = self.network.forward_features(x)
        loss = F.cross_entropy(self.network.head(z), y)
        if self.mu == 0:
            return loss
        with torch.no_grad():
            z_glob = self._frozen["global"].forward_features(x)
            z_prev = self._frozen["previous"].forward_features(x)
        return loss + self.mu * moon_contrastive_loss(z, z_glob, z_prev, self.tau)

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        return weights, extras, {**state, "previous": weights}
