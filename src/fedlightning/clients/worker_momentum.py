"""Worker momentum: Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust
Optimization", ICML 2021, arXiv:2012.10333 (Algorithm 2, the workers' momentum). docs/algorithms.md
section 8.4."""

from __future__ import annotations

from typing import Any, Literal

from fedlightning.clients.base import ClientModule
from fedlightning.errors import require
from fedlightning.placement import move
from fedlightning.protocol import StateDict

#: the two recursions of a worker's momentum (docs/algorithms.md 8.4)
FORMS = ("paper", "torch")


def worker_momentum_step(
    dispatched: StateDict,
    trained: StateDict,
    momentum: StateDict,
    beta: float,
    form: str = "paper",
) -> tuple[StateDict, StateDict]:
    """``(upload, new momentum)`` of one client's round (docs/algorithms.md 8.4).

    With ``w`` the ``dispatched`` model, ``w_i`` the ``trained`` one and ``delta_i = w - w_i`` the
    client's pseudo-gradient, the momentum is

    - ``form="paper"``: ``m_i <- (1 - beta) delta_i + beta m_i`` (the paper's Algorithm 2);
    - ``form="torch"``: ``m_i <- beta m_i + delta_i`` (``torch.optim.SGD``'s momentum buffer, the
      reference code's ``MomentumWorker``: ``m_1 = delta_1``), ``1 / (1 - beta)`` times the paper's
      for the same pseudo-gradients;

    and the upload is ``w - m_i``, for every floating entry (``momentum`` missing a key:
    ``m_i = 0`` there, the client's first round). Computed in float64, stored in the entry's
    dtype; integer entries (BatchNorm's counter) are uploaded as trained and carry no momentum.

    >>> import torch
    >>> w, w_i = {"x": torch.tensor([1.0])}, {"x": torch.tensor([0.0])}
    >>> upload, m = worker_momentum_step(w, w_i, {}, beta=0.9)
    >>> round(m["x"].item(), 6), round(upload["x"].item(), 6)
    (0.1, 0.9)
    >>> upload, m = worker_momentum_step(w, w_i, m, beta=0.9)
    >>> round(m["x"].item(), 6)
    0.19
    >>> _, m = worker_momentum_step(w, w_i, {"x": torch.tensor([1.0])}, 0.9, form="torch")
    >>> round(m["x"].item(), 6)  # 0.9 * 1 + 1
    1.9
    """
    if form not in FORMS:
        raise ValueError(f"worker momentum's form is 'paper' or 'torch', got {form!r}")
    dampening = 1.0 - beta if form == "paper" else 1.0
    upload: StateDict = {}
    new: StateDict = {}
    for key, value in trained.items():
        if not value.is_floating_point():
            upload[key] = value
            continue
        w = dispatched[key].double()
        delta = w - value.double()
        previous = momentum.get(key)
        m = dampening * delta + (beta * previous.double() if previous is not None else 0.0)
        new[key] = m.to(value.dtype)
        upload[key] = (w - m).to(value.dtype)
    return upload, new


class WorkerMomentum(ClientModule):
    """The cross-entropy client that uploads the momentum of its updates (docs/algorithms.md 8.4):
    after the local fit, ``m_i <- (1 - beta)(w - w_i) + beta m_i`` (``form="paper"``) or
    ``m_i <- beta m_i + (w - w_i)`` (``form="torch"``, the reference code's) and the upload is
    ``w - m_i`` (:func:`worker_momentum_step`), so the server's mean step ``w <- w - mean_i m_i``
    descends along the aggregate momentum, and centered clipping (its center the last aggregate)
    clips the momenta around the previous aggregate momentum: the paper's method. An attack
    replaces the uploads after the fit, so malicious clients send what they like in place of
    ``w - m_i``.

    The two forms differ by the factor ``1 / (1 - beta)`` (10 at beta 0.9) on the momenta, so on
    the server's step and on a clipping radius: a radius ``tau`` of the paper's form is
    ``tau / (1 - beta)`` of the torch form (the reference code scales its ``tau`` so).

    ``m_i`` is per-client data: it lives in the client's persistent state (key ``"momentum"``, in
    the ClientStore, checkpointed with it), zero before the client's first round. ``beta = 0`` is
    the plain client. Any local optimizer and objective settings of
    :class:`~fedlightning.clients.ClientModule` apply to the fit itself.

    Args:
        beta: the momentum coefficient in ``[0, 1)`` (the paper's experiments use 0.9).
        form: ``paper`` (``(1 - beta)`` on the new pseudo-gradient, ``m_0 = 0``) or ``torch``
            (``m <- beta m + delta``, ``m_1 = delta``).
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    def __init__(
        self, beta: float = 0.9, form: Literal["paper", "torch"] = "paper", **kwargs: Any
    ) -> None:
        require(0.0 <= beta < 1.0, "model.beta", beta, "a number in [0, 1)")
        require(form in FORMS, "model.form", form,
                "'paper' (m <- (1 - beta) delta + beta m) or 'torch' (m <- beta m + delta)")  # fmt: skip
        super().__init__(**kwargs)
        self.beta = beta
        self.form = form

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        dispatched = move(self.payload.weights, self.device)
        momentum = move(state.get("momentum", {}), self.device)  # the ClientStore's on the CPU
        upload, new = worker_momentum_step(dispatched, weights, momentum, self.beta, self.form)
        return upload, extras, {**state, "momentum": new}
