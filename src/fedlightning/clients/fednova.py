"""FedNova: Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020, arXiv:2007.07481 (section 4 and Appendix; a_i with momentum as in
the authors' code, github.com/JYWa/FedNova)."""

from __future__ import annotations

from typing import Any, ClassVar

from fedlightning.clients.base import ClientModule
from fedlightning.clients.sgd_steps import fednova_a
from fedlightning.compute import NO_SKIP_PRECISIONS
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import StateDict


class FedNovaClient(ClientModule):
    """Plain local SGD that reports its normalising factor (docs/algorithms.md 1.5):
    ``a_i = fednova_a(tau_i, rho)`` with ``tau_i`` the optimizer steps actually taken and ``rho``
    the SGD momentum, as the upload extra ``"a"``. The local objective is cross-entropy; the
    normalised averaging ``d_i = (x - x_i) / a_i`` happens on the server from the uploaded weights.

    Only SGD is allowed (a_i describes SGD with momentum; Adam has no such factor). Weight decay
    acts on the gradient and does not change a_i (as in the authors' code without a proximal term).
    Precisions that can skip optimizer steps (``16-mixed`` with its gradient scaler) are refused:
    a skipped step is still counted (as Lightning's ``global_step`` counts it), so ``tau_i`` would
    not be the real count.
    Pair with :class:`fedlightning.server.FedNova` (or InCo around it): ``required_aggregator``,
    checked at start-up (docs/algorithms.md section 2.6, "Pairing"); with plain FedAvg the
    uploaded ``a_i`` would be ignored.

    Args:
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr, momentum...).
    """

    required_aggregator: ClassVar[frozenset[str]] = frozenset({"FedNova"})
    upload_extras: ClassVar[frozenset[str]] = frozenset({"a"})
    supported_precisions: ClassVar[frozenset[str]] = NO_SKIP_PRECISIONS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.optimizer_name != "sgd":
            raise ConfigurationError(
                f"{type(self).__name__} needs optimizer 'sgd' (a_i is defined for SGD with momentum), "
                f"got {self.optimizer_name!r}"
            )

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        return weights, {**extras, "a": fednova_a(num_steps, self.momentum)}, state
