"""Optimizer steps, gradient clipping and gradient scaling on stacked per-client tensors.

Every tensor here carries a leading client axis ``C``; ``active`` (bool, ``[C]``) says which
clients take this step: the others keep their parameters and optimizer state exactly (a client
that ran out of batches, or whose ``16-mixed`` step was skipped by its scaler). The formulas are
those of ``torch.optim.SGD``/``Adam``/``AdamW`` (single-tensor form) and of
``torch.amp.GradScaler`` and ``torch.nn.utils.clip_grad_norm_``, applied per client, so a client's
trajectory equals its sequential fit up to floating-point reassociation.
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


def _keep(active: Tensor, new: Tensor, old: Tensor) -> Tensor:
    return torch.where(active.view(-1, *([1] * (new.ndim - 1))), new, old)


def _per_client(values: Tensor, like: Tensor) -> Tensor:
    return values.to(like.dtype).view(-1, *([1] * (like.ndim - 1)))


@dataclass
class StackedOptimizer:
    """One optimizer's hyper-parameters per parameter name and its stacked per-client state.

    ``kind`` is ``"sgd"`` or ``"adam"`` (``decoupled`` for AdamW); ``hyper[name]`` is the
    parameter group's settings; ``state[name]`` holds ``momentum_buffer`` (SGD, zeros where a
    client had none: ``m * 0 + g = g`` is SGD's first step) or ``exp_avg``, ``exp_avg_sq`` and
    ``step`` (Adam, float64 ``[C]``)."""

    kind: str
    decoupled: bool
    hyper: dict[str, dict[str, Any]]
    state: dict[str, dict[str, Tensor]] = field(default_factory=dict)

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
        hyper = {}
        for group in first.param_groups:
            settings = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                hyper[names[0][id(p)]] = settings
        stacked = cls(kind, isinstance(first, torch.optim.AdamW), hyper)
        for name in hyper:
            entries: dict[str, list[Tensor]] = {}
            for optimizer, ids in zip(optimizers, names, strict=True):
                by_name = {ids[id(p)]: p for g in optimizer.param_groups for p in g["params"]}
                saved = optimizer.state.get(by_name[name], {})
                zeros = torch.zeros_like(params[name][0])
                if kind == "sgd":
                    buf = saved.get("momentum_buffer")
                    entries.setdefault("momentum_buffer", []).append(
                        zeros if buf is None else buf.to(zeros)
                    )
                else:
                    for key in ("exp_avg", "exp_avg_sq"):
                        value = saved.get(key)
                        entries.setdefault(key, []).append(
                            zeros if value is None else value.to(zeros)
                        )
                    step = saved.get("step", 0.0)
                    entries.setdefault("step", []).append(
                        torch.as_tensor(float(step), dtype=torch.float64, device=zeros.device)
                    )
            stacked.state[name] = {k: torch.stack(v) for k, v in entries.items()}
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
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], active: Tensor) -> None:
        """One optimizer step for the ``active`` clients, in place on ``params`` and the state."""
        for name, grad in grads.items():
            h, state, param = self.hyper[name], self.state[name], params[name]
            if self.kind == "sgd":
                new_param, new_state = _sgd(param, grad, state, h)
            else:
                new_param, new_state = _adam(param, grad, state, h, self.decoupled, active)
            param.copy_(_keep(active, new_param, param))
            for key, value in new_state.items():
                state[key] = _keep(active, value, state[key])


def _sgd(param: Tensor, grad: Tensor, state: dict[str, Tensor], h: dict[str, Any]):
    if h["weight_decay"]:
        grad = grad.add(param, alpha=h["weight_decay"])
    new_state = {}
    if h["momentum"]:
        buf = state["momentum_buffer"].mul(h["momentum"]).add_(grad)
        new_state["momentum_buffer"] = buf
        grad = grad.add(buf, alpha=h["momentum"]) if h["nesterov"] else buf
    return param.add(grad, alpha=-h["lr"]), new_state


def _adam(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    h: dict[str, Any],
    decoupled: bool,
    active: Tensor,
):
    lr, (beta1, beta2), eps, wd = h["lr"], h["betas"], h["eps"], h["weight_decay"]
    step = state["step"] + active.to(torch.float64)  # the step each active client takes
    step = torch.where(step > 0, step, torch.ones_like(step))
    if wd:
        if decoupled:
            param = param.mul(1 - lr * wd)
        else:
            grad = grad.add(param, alpha=wd)
    exp_avg = state["exp_avg"].lerp(grad, 1 - beta1)
    exp_avg_sq = state["exp_avg_sq"].mul(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)  # float64 per client, as torch's Python-float arithmetic
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    denom = (exp_avg_sq.sqrt() / _per_client(bias_correction2_sqrt, param)).add_(eps)
    update = _per_client(-step_size, param) * exp_avg / denom
    new_step = state["step"] + 1
    return param + update, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "step": new_step}


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
    return {n: g * _per_client(factor, g) for n, g in grads.items()}


class StackedScaler:
    """``torch.amp.GradScaler`` per client (``16-mixed``): scale ``2**16``, halved on a step with
    non-finite gradients (that client's step is skipped, its parameters and optimizer state do not
    move), doubled after 2000 finite steps in a row. A client's scaler is fresh every fit, as
    Lightning builds one per fit."""

    def __init__(self, num_clients: int, device: torch.device) -> None:
        self.scale = torch.full((num_clients,), 2.0**16, dtype=torch.float32, device=device)
        self.growth = torch.zeros(num_clients, dtype=torch.long, device=device)

    def unscale(self, grads: dict[str, Tensor], index: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """``(unscaled gradients, finite per client)`` for the clients ``index``."""
        inverse = self.scale[index].double().reciprocal().float()
        grads = {n: g * _per_client(inverse, g) for n, g in grads.items()}
        finite = torch.stack([torch.isfinite(g.flatten(1)).all(dim=1) for g in grads.values()])
        return grads, finite.all(dim=0)

    def update(self, finite: Tensor, active: Tensor) -> None:
        """After a step: the scaler update of every ``active`` client."""
        grown = self.growth + 1
        double = finite & (grown == 2000)
        scale = torch.where(finite, self.scale, self.scale * 0.5)
        scale = torch.where(double, scale * 2.0, scale)
        growth = torch.where(finite & ~double, grown, torch.zeros_like(grown))
        self.scale = torch.where(active, scale, self.scale)
        self.growth = torch.where(active, growth, self.growth)
