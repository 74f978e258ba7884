"""Optimizer steps, gradient clipping and gradient scaling on stacked per-client tensors
(docs/algorithms.md section 9.2).

Every tensor here carries a leading client axis ``C``. A step runs as multi-tensor (``foreach``)
operations over all of a parameter group's stacked tensors at once, in place, with no host
synchronisation. ``active`` (bool, ``[C]`` on the device; ``None``: every client) says which
clients take the step: the others keep their parameters and optimizer state exactly (a client
that ran out of batches, or whose ``16-mixed`` step its scaler skipped). The formulas are those of
``torch.optim.SGD``/``Adam``/``AdamW`` (single-tensor form) and of ``torch.amp.GradScaler`` and
``torch.nn.utils.clip_grad_norm_``, applied per client, so a client's trajectory equals its
sequential fit up to floating-point reassociation (SGD and Adam steps themselves: bitwise on the
CPU, tests/test_cohort.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

#: optimizers the cohort backend implements, by class
COHORT_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def optimizer_refusal(optimizer: torch.optim.Optimizer) -> str | None:
    """Why the cohort backend cannot run ``optimizer`` (``None``: it can)."""
    if type(optimizer) not in COHORT_OPTIMIZERS:
        return f"it implements SGD, Adam and AdamW, got {type(optimizer).__name__}"
    for group in optimizer.param_groups:
        if group.get("maximize") or group.get("amsgrad") or group.get("dampening"):
            return "it implements SGD without dampening and Adam(W) without amsgrad or maximize"
        if isinstance(group["lr"], Tensor):
            return "it needs a float learning rate"
    return None


def per_client(values: Tensor, like: Tensor) -> Tensor:
    """``values`` (``[C]``) shaped to broadcast over ``like`` (``[C, ...]``), in its dtype."""
    return values.to(like.dtype).view(-1, *([1] * (like.ndim - 1)))


def _commit(active: Tensor | None, targets: list[Tensor], new: list[Tensor]) -> None:
    """``targets`` take their ``new`` values for the ``active`` clients (all: ``None``)."""
    if active is None:
        torch._foreach_copy_(targets, new)
        return
    for target, value in zip(targets, new, strict=True):
        target.copy_(torch.where(active.view(-1, *([1] * (value.ndim - 1))), value, target))


@dataclass
class StackedOptimizer:
    """One optimizer's parameter groups (names and settings) and its stacked per-client state.

    ``kind`` is ``"sgd"`` or ``"adam"`` (``decoupled`` for AdamW); ``state[name]`` holds
    ``momentum_buffer`` (SGD, zeros where a client had none: ``m * 0 + g = g`` is SGD's first
    step) or ``exp_avg``, ``exp_avg_sq`` and ``step`` (Adam, float64 ``[C]``)."""

    kind: str
    decoupled: bool
    groups: list[tuple[list[str], dict[str, Any]]]
    state: dict[str, dict[str, Tensor]] = field(default_factory=dict)

    @property
    def hyper(self) -> dict[str, dict[str, Any]]:
        """Each parameter's group settings, by name."""
        return {name: h for names, h in self.groups for name in names}

    @classmethod
    def stack(
        cls,
        optimizers: list[torch.optim.Optimizer],
        names: list[dict[int, str]],
        params: dict[str, Tensor],
    ) -> StackedOptimizer:
        """From each client's fresh optimizer (``names[i]`` maps its parameters' ids to names)
        and the stacked parameters."""
        first = optimizers[0]
        kind = "sgd" if isinstance(first, torch.optim.SGD) else "adam"
        groups = [
            ([names[0][id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
            for g in first.param_groups
        ]
        stacked = cls(kind, isinstance(first, torch.optim.AdamW), groups)
        keys = ("momentum_buffer",) if kind == "sgd" else ("exp_avg", "exp_avg_sq")
        for name in stacked.hyper:
            saved = [
                opt.state.get({ids[id(p)]: p for g in opt.param_groups for p in g["params"]}[name], {})
                for opt, ids in zip(optimizers, names, strict=True)
            ]  # fmt: skip
            zeros = torch.zeros_like(params[name][0])
            state = {
                key: torch.stack([zeros if s.get(key) is None else s[key].to(zeros) for s in saved])
                for key in keys
            }
            if kind == "adam":
                steps = [float(s.get("step", 0.0)) for s in saved]
                state["step"] = torch.tensor(steps, dtype=torch.float64, device=zeros.device)
            stacked.state[name] = state
        return stacked

    def client_state(self, name: str, i: int, took_steps: bool, had: dict[str, Any]) -> dict:
        """Client ``i``'s ``optimizer.state`` entry for parameter ``name``, as torch leaves it."""
        if not took_steps:
            return had
        state = self.state[name]
        if self.kind == "sgd":
            momentum = self.hyper[name]["momentum"]
            return {"momentum_buffer": state["momentum_buffer"][i].clone() if momentum else None}
        return {
            "step": torch.tensor(float(state["step"][i]), dtype=torch.float32),
            "exp_avg": state["exp_avg"][i].clone(),
            "exp_avg_sq": state["exp_avg_sq"][i].clone(),
        }

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], active: Tensor | None):
        """One optimizer step for the ``active`` clients (``None``: all), in place on ``params``
        and the state."""
        for names, h in self.groups:
            ps, gs = [params[n] for n in names], [grads[n] for n in names]
            states = [self.state[n] for n in names]
            if self.kind == "sgd":
                _sgd(ps, gs, states, h, active)
            else:
                _adam(ps, gs, states, h, self.decoupled, active)


def _sgd(ps: list[Tensor], gs: list[Tensor], states: list[dict], h: dict, active: Tensor | None):
    """SGD (``torch.optim.SGD``'s single-tensor formulas) over the stacked tensors: in place when
    every client steps, otherwise computed aside and committed for the active ones."""
    lr, momentum, wd = h["lr"], h["momentum"], h["weight_decay"]
    if wd:
        gs = torch._foreach_add(gs, ps, alpha=wd)
    if momentum:
        bufs = [s["momentum_buffer"] for s in states]
        new_bufs = bufs if active is None else [b.clone() for b in bufs]
        torch._foreach_mul_(new_bufs, momentum)
        torch._foreach_add_(new_bufs, gs)
        gs = torch._foreach_add(gs, new_bufs, alpha=momentum) if h["nesterov"] else new_bufs
        if active is not None:
            _commit(active, bufs, new_bufs)
    if active is None:
        torch._foreach_add_(ps, gs, alpha=-lr)
    else:
        _commit(active, ps, torch._foreach_add(ps, gs, alpha=-lr))


def _adam(ps: list[Tensor], gs: list[Tensor], states: list[dict], h: dict, decoupled: bool,
          active: Tensor | None) -> None:  # fmt: skip
    """Adam/AdamW (``torch.optim.Adam``'s single-tensor formulas, its Python-float bias
    corrections as float64 per client) over the stacked tensors, committed for the active ones."""
    lr, (beta1, beta2), eps, wd = h["lr"], h["betas"], h["eps"], h["weight_decay"]
    steps = [s["step"] for s in states]
    moved = 1.0 if active is None else active.to(torch.float64)
    taken = [torch.where(t + moved > 0, t + moved, 1.0) for t in steps]  # each client's step
    if wd and decoupled:
        ps_new = torch._foreach_mul(ps, 1 - lr * wd)
    else:
        ps_new = ps
        gs = torch._foreach_add(gs, ps, alpha=wd) if wd else gs
    exp_avg = torch._foreach_lerp([s["exp_avg"] for s in states], gs, 1 - beta1)
    exp_avg_sq = torch._foreach_mul([s["exp_avg_sq"] for s in states], beta2)
    torch._foreach_addcmul_(exp_avg_sq, gs, gs, value=1 - beta2)
    step_size = [per_client(-lr / (1 - beta1**t), p) for t, p in zip(taken, ps, strict=True)]
    correction2 = [per_client((1 - beta2**t) ** 0.5, p) for t, p in zip(taken, ps, strict=True)]
    denom = torch._foreach_div(torch._foreach_sqrt(exp_avg_sq), correction2)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(torch._foreach_mul(step_size, exp_avg), denom)
    _commit(active, ps, torch._foreach_add(ps_new, update))
    _commit(active, [s["exp_avg"] for s in states], exp_avg)
    _commit(active, [s["exp_avg_sq"] for s in states], exp_avg_sq)
    _commit(active, steps, torch._foreach_add(steps, 1.0))


def clip_gradients(grads: dict[str, Tensor], value: float, algorithm: str) -> dict[str, Tensor]:
    """Each client's gradients clipped as Fabric clips one client's: by value (``clamp(-v, v)``)
    or by the total 2-norm over all its trainable tensors (``clip_grad_norm_``: factor
    ``min(1, v / (norm + 1e-6))``)."""
    if algorithm == "value":
        return {n: g.clamp(-value, value) for n, g in grads.items()}
    norms = torch.stack(
        [torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()], dim=1
    )
    total = torch.linalg.vector_norm(norms, dim=1)
    factor = (value / (total + 1e-6)).clamp(max=1.0)
    return {n: g * per_client(factor, g) for n, g in grads.items()}


class StackedScaler:
    """``torch.amp.GradScaler`` per client (``16-mixed``): scale ``2**16``, halved on a step with
    non-finite gradients (that client's step is skipped, its parameters and optimizer state do not
    move), doubled after 2000 finite steps in a row. A client's scaler is fresh every fit, as
    Lightning builds one per fit. Its tensors are updated in place (a captured step replays)."""

    def __init__(self, num_clients: int, device: torch.device) -> None:
        self.scale = torch.full((num_clients,), 2.0**16, dtype=torch.float32, device=device)
        self.growth = torch.zeros(num_clients, dtype=torch.long, device=device)

    def unscale(
        self, grads: dict[str, Tensor], index: Tensor | None = None
    ) -> tuple[dict[str, Tensor], Tensor]:
        """``(unscaled gradients, finite per client)`` for the clients ``index`` (``None``: all)."""
        scale = self.scale if index is None else self.scale[index]
        inverse = scale.double().reciprocal().float()
        grads = {n: g * per_client(inverse, g) for n, g in grads.items()}
        finite = torch.stack([torch.isfinite(g.flatten(1)).all(dim=1) for g in grads.values()])
        return grads, finite.all(dim=0)

    def update(self, finite: Tensor, active: Tensor | None) -> None:
        """After a step: the scaler update of every ``active`` client (``None``: all)."""
        grown = self.growth + 1
        double = finite & (grown == 2000)
        scale = torch.where(finite, self.scale, self.scale * 0.5)
        scale = torch.where(double, scale * 2.0, scale)
        growth = torch.where(finite & ~double, grown, torch.zeros_like(grown))
        _commit(active, [self.scale, self.growth], [scale, growth])
