"""InCo Aggregation: Chan et al., "Internal Cross-layer Gradients for Extending Homogeneity to
Heterogeneity in Federated Learning", ICLR 2024, arXiv:2308.11464 (section 3, Theorem 3.1; the
``official`` variant follows the authors' released code). docs/algorithms.md section 2.4.

The server update of a deep layer k is mixed with the update of the first layer of its stage
(``layer 0``), whose update is more homogeneous across clients and architectures. :class:`InCo`
wraps any aggregator with one global model (FedAvg, Scaffold, FedNova, FedAvgM, FedAdam), so any
client objective becomes InCo<Method>.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict, Upload
from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.inco_pairs import (
    PAIR_RULES,
    inco_pairs,
    paper_layer0,
    register_pair_rule,
    resnet_pairs,
    vit_pairs,
)
from fedlightning.server.inco_stats import pair_products, summarize
from fedlightning.server.summation import wide
from fedlightning.server.wrapping import WrappingAggregator

__all__ = [
    "CLIP", "C_MAX", "PAIR_RULES", "VARIANTS", "InCo", "cross_layer_update", "inco_apply",
    "inco_pairs", "paper_layer0", "register_pair_rule", "resnet_pairs", "vit_pairs",
]  # fmt: skip

VARIANTS = ("official", "paper", "exact")
#: the official code's bounds: c = clamp(|theta|, 0, C_MAX), g_new clipped to [-CLIP, CLIP]
C_MAX = 5.0
CLIP = 0.1


def _safe_div(x: Tensor, y: Tensor) -> Tensor:
    """``x / y`` where ``y != 0``, else 0 (a zero update has no direction)."""
    nonzero = y != 0
    return torch.where(
        nonzero, x / torch.where(nonzero, y, torch.ones_like(y)), torch.zeros_like(x)
    )


def cross_layer_update(
    g_k: Tensor,
    g_0: Tensor,
    variant: Literal["official", "paper", "exact"] = "official",
    normalize: bool | None = None,
    optimize: bool = True,
) -> Tensor:
    """InCo's cross-layer update of a deep layer's server update ``g_k`` with its stage's layer-0
    update ``g_0`` (same shape).

    With ``a = <g_0, g_0>``, ``b = <g_0, g_k>``, ``theta = b / a`` (0 when ``a = 0``):
    ``g_new = (g_k/||g_k|| + c g_0/||g_0||) (||g_k|| + ||g_0||) / 2`` (normalised; a zero vector
    stays zero when normalised) or ``g_k + c g_0`` (``normalize=False``), where

    - ``official`` (the authors' code, default): ``c = clamp(|theta|, 0, 5)``; for 4-D (conv)
      tensors a, b, the norms and c are per kernel slice ``[o, i]``; the result is clipped
      element-wise to ``[-0.1, 0.1]`` (also under the ablations);
    - ``paper``: ``c = -theta``, per layer, no clipping;
    - ``exact`` (Theorem 3.1 as stated): ``c = -theta`` if ``b < 0`` else 0, per layer, not
      normalised: ``g_k`` if ``b >= 0`` else ``g_k - theta g_0``, the projection of ``g_k`` onto
      ``{g : <g, g_0> >= 0}``;
    - ``optimize=False``: ``c = 1`` (``normalize=False`` too: ``g_k + g_0``, the paper's "w/o N & O").

    ``normalize=None`` (default) takes each variant's own form: normalised for ``official`` and
    ``paper``, the plain projection for ``exact``. Decision (docs/algorithms.md section 2.4 lists ``exact``
    beside the normalised update, but names it "Theorem 3.1 as stated", whose update is the
    projection): ``exact`` means the theorem; ``exact`` with ``normalize=True`` is the normalised
    update with the theorem's coefficient, which is *not* a projection: ``<g_new, g_0>`` is
    ``b (1/||g_k|| - 1/||g_0||) (||g_k|| + ||g_0||) / 2``, below 0 when ``b < 0`` and
    ``||g_0|| > ||g_k||``.

    Computed in float64 (float32 on a device without float64) on ``g_k``'s device, returned in
    ``g_k``'s dtype. (Over 60 lines for this docstring: each variant's formula is stated here,
    where it is computed; the body is 30 lines.)

    >>> g = cross_layer_update(torch.tensor([1.0, -1.0]), torch.tensor([0.0, 1.0]), "exact")
    >>> g.tolist()
    [1.0, 0.0]
    """
    require(variant in VARIANTS, "aggregator.variant", variant, f"one of {', '.join(VARIANTS)}")
    if normalize is None:
        normalize = variant != "exact"
    if g_k.shape != g_0.shape:
        raise ValueError(
            f"g_k {tuple(g_k.shape)} and g_0 {tuple(g_0.shape)} must have the same shape"
        )
    gk, g0 = wide(g_k.detach()), wide(g_0.detach())
    dims = (2, 3) if variant == "official" and gk.ndim == 4 else tuple(range(gk.ndim))

    def dot(x: Tensor, y: Tensor) -> Tensor:
        return (x * y).sum(dim=dims, keepdim=True)

    a, b = dot(g0, g0), dot(g0, gk)
    theta = _safe_div(b, a)
    if not optimize:
        c = torch.ones_like(theta)
    elif variant == "official":
        c = theta.abs().clamp(0.0, C_MAX)
    elif variant == "paper":
        c = -theta
    else:
        c = torch.where(b < 0, -theta, torch.zeros_like(theta))
    if normalize:
        norm_k, norm_0 = dot(gk, gk).sqrt(), a.sqrt()
        g = (_safe_div(gk, norm_k) + c * _safe_div(g0, norm_0)) * (norm_k + norm_0) / 2
    else:
        g = gk + c * g0
    if variant == "official":
        g = g.clamp(-CLIP, CLIP)
    return g.to(g_k.dtype)


def inco_apply(
    old: StateDict,
    new: StateDict,
    pairs: Sequence[tuple[str, str]],
    updated: set[str],
    variant: Literal["official", "paper", "exact"] = "official",
    normalize: bool | None = None,
    optimize: bool = True,
) -> StateDict:
    """``new`` with each paired deep layer k replaced by ``old_k + cross_layer_update(g_k, g_0)``,
    ``g = new - old`` (the aggregated server updates, all taken before any replacement). A pair
    is skipped in a round where its deep layer or its layer 0 is not in ``updated`` (no sampled
    client owns it: its update is not zero but absent)."""
    out = dict(new)
    for deep, layer0 in pairs:
        if deep not in updated or layer0 not in updated:
            continue
        g_k = wide(new[deep]) - wide(old[deep])
        g_0 = wide(new[layer0]) - wide(old[layer0])
        g = cross_layer_update(g_k, g_0, variant, normalize, optimize)
        out[deep] = (wide(old[deep]) + g).to(old[deep].dtype)
    return out


class InCo(WrappingAggregator):
    """InCo<Method>: the ``inner`` aggregator's round, then InCo's cross-layer updates of the
    paired deep layers (docs/algorithms.md section 2.4).

    After ``inner.aggregate``, with ``g = w_new - w_old`` the inner's server update, each paired
    deep layer k becomes ``w_old_k + cross_layer_update(g_k, g_0)`` (:func:`inco_apply`; a pair is
    skipped in a round where no sampled client owns its deep layer or its layer 0); every other key
    keeps the inner's update, and the inner's own state (SCAFFOLD's ``c``, a server optimizer's
    moments) is the inner's. Everything else (payloads, state, deployables, extras, weighting) is
    the inner's.

    InCo overrides ``aggregate`` rather than the ``server_update`` hook (docs/algorithms.md
    section 2.6): it wraps an inner aggregator, whose own hook (a server optimizer, SCAFFOLD's
    ``c``) runs first, and post-processes the inner's whole server update ``w_new - w_old``,
    which only exists once the inner's round is done. It declares no state of its own: its state
    is the inner's, held under ``inner`` (the pair statistics of the last round are transient).

    InCoAvg is ``InCo()`` (inner ``FedAvg(weighting="uniform")``, the paper's mean over owners),
    InCoScaffold ``InCo(inner=Scaffold())``, InCoNova ``InCo(inner=FedNova())``; InCoProx and
    InCoMOON pair ``InCo()`` with those client objectives. In YAML:
    ``inner: {class_path: fedlightning.server.Scaffold}``.

    Args:
        inner: the wrapped aggregator, one with a single global model (a FedAvg subclass without
            ``within_groups``); ``null``: ``FedAvg(weighting="uniform")``.
        variant: ``official`` (default: the authors' code, which produced their tables), ``paper``
            or ``exact`` (Theorem 3.1's projection); see :func:`cross_layer_update`.
        normalize: ``null`` (default): the variant's own form (normalised for ``official`` and
            ``paper``, the plain projection for ``exact``); ``false``: the "w/o N" ablation;
            ``true``: normalised, also for ``exact``.
        optimize: the optimised coefficient c (ablation: ``False`` takes c = 1).
        pair_rule: ``auto`` (every registered rule: ResNet stages, ViT blocks), ``resnet``, ``vit``
            or any rule registered with :func:`register_pair_rule`.
        pairs: explicit ``[[deep key, layer-0 key], ...]`` instead of a rule.
        layer0: ``code`` (default, with ``variant: official`` the authors' code throughout):
            the rule's own pairs (``layer{s}.0.conv2.weight``); ``paper``: the paper's wording,
            layer 0 the first layer of the stage with the shape condition and every later layer
            of the stage with its shape paired with it
            (:func:`~fedlightning.server.inco_pairs.paper_pairs`). They differ in ResNet stage 1.
        update_divisor: the inner's server update of every float entry is divided by this before
            InCo (the InCo ViT code divides the client update by E: set it to
            ``loop.local_epochs``); 1: off.

    :meth:`round_metrics` reports the pairs' ``theta``/``beta`` statistics of the round
    (:func:`fedlightning.server.inco_stats.pair_statistics`), read from the device only then.
    """

    #: the last round's pair statistics, for :meth:`round_metrics` only
    transient_attributes = frozenset({"_products"})

    def __init__(
        self,
        inner: Aggregator | None = None,
        variant: Literal["official", "paper", "exact"] = "official",
        normalize: bool | None = None,
        optimize: bool = True,
        pair_rule: str = "auto",
        pairs: list[list[str]] | None = None,
        layer0: Literal["paper", "code"] = "code",
        update_divisor: float = 1.0,
    ) -> None:
        inner = FedAvg(weighting="uniform") if inner is None else inner
        require(
            isinstance(inner, FedAvg) and not inner.within_groups,
            "loop.aggregator.init_args.inner",
            type(inner).__name__,
            "an aggregator with one global model (FedAvg, Scaffold, FedNova, FedAvgM, FedAdam; "
            "not within_groups)",
        )
        require(variant in VARIANTS, "aggregator.variant", variant, f"one of {', '.join(VARIANTS)}")
        require(
            pair_rule == "auto" or pair_rule in PAIR_RULES,
            "aggregator.pair_rule",
            pair_rule,
            f"'auto' or one of {', '.join(sorted(PAIR_RULES))}",
        )
        require(layer0 in ("paper", "code"), "aggregator.layer0", layer0, "'paper' or 'code'")
        require(update_divisor > 0, "aggregator.update_divisor", update_divisor, "a number > 0")
        self.layer0 = layer0
        self.update_divisor = update_divisor
        self._products: Tensor | None = None  # the last round's pair products, on the device
        self.inner: FedAvg = inner  # type: ignore[assignment]
        self.variant = variant
        self.normalize = normalize
        self.optimize = optimize
        self.pair_rule = pair_rule
        self.explicit_pairs = pairs
        self.pairs: list[tuple[str, str]] = []

    def on_setup(self, initial: StateDict) -> None:
        self.inner.setup(
            initial, self.num_clients, self.seed, self.client_keys, parameters=self.parameters
        )
        self.pairs = inco_pairs(initial, self.pair_rule, self.explicit_pairs, self.layer0)
        if not self.pairs:
            raise ConfigurationError(
                f"aggregator.pair_rule={self.pair_rule!r} finds no layer pairs in this model: InCo needs "
                "ResNet stages or ViT blocks, a registered rule, or explicit aggregator.pairs"
            )

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        inner, old = self.inner, self.inner.weights
        inner.aggregate(round_index, uploads)
        updated = {k for u in uploads for k in u.weights}
        if self.update_divisor != 1:
            inner.weights = {
                k: (wide(o) + (wide(inner.weights[k]) - wide(o)) / self.update_divisor).to(o.dtype)
                if o.is_floating_point() else inner.weights[k]
                for k, o in old.items()
            }  # fmt: skip
        self._products = pair_products(old, inner.weights, self.pairs, updated)
        inner.weights = inco_apply(
            old, inner.weights, self.pairs, updated, self.variant, self.normalize, self.optimize
        )

    def round_metrics(self) -> dict[str, float]:
        return summarize(self._products)
