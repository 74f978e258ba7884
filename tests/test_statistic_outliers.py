"""Robust statistics stay robust at any outlier size within their breakdown point (issue 43 item
6; docs/algorithms.md section 8, "Outliers of any size"), for every statistic that
``fedlightning.server.statistics`` exports: a new one is covered without editing this file.

A statistic declares a breakdown point when its own ``check_byzantine`` refuses half of the
uploads malicious (the plain mean refuses nothing: it is the baseline an attack breaks). Each is
given the most outliers of ten uploads it accepts, built as the loop builds it (set up, then
``check_byzantine`` with that f), and outliers of size 1e10, 1e38 (float32's largest decade),
Gaussian noise of sigma 1e39 (Inf in float32) and NaN, spread in independent directions or all
along one. The honest uploads are a BatchNorm network's, spread ~0.1 around the server model.
Checked, against the honest uploads alone (no library helper):

- every entry of the result is finite;
- it lies within ``C R`` of the honest uploads' mean, ``R`` their largest distance from it,
  ``C = 2 (1 - e) / (1 - 2 e)`` for the malicious fraction e: the geometric median's guarantee
  (Lopuhaä and Rousseeuw, Annals of Statistics 1991; Minsker, Bernoulli 2015, Lemma 2.1), the
  weakest of the rules';
- the rules that act per coordinate or select whole honest uploads (all but those of
  :data:`NOT_IN_RANGE`) leave every entry within the honest uploads' range of it;
- outliers at 1e38 give the result that outliers along the same directions at 1e10 give (to
  1e-3 R): the outliers' size no longer matters once they are far.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.server import statistics
from fedlightning.server.statistics import Statistic, StatisticContext
from fedlightning.server.statistics.base import setup_statistic

N = 10
#: every exported statistic with its defaults, by name, and the clipped variants (norm bounding)
STATISTICS = {
    name: getattr(statistics, name) for name in statistics.__all__
    if inspect.isclass(getattr(statistics, name))
    and issubclass(getattr(statistics, name), Statistic)
    and not inspect.isabstract(getattr(statistics, name))
} | {
    "Mean(clip_norm=1)": functools.partial(statistics.Mean, clip_norm=1.0),
    "Median(clip_norm=1)": functools.partial(statistics.Median, clip_norm=1.0),
}  # fmt: skip
#: rules whose result is not within the honest uploads' coordinate range, and why
NOT_IN_RANGE = {
    "GeometricMedian": "a point of the uploads' span, within its breakdown bound",
    "CenteredClip": "moves the center by clipped steps, which honest coordinates do not bound",
    "Mean(clip_norm=1)": "a mean of clipped updates, each outlier's bounded but present",
    "Median(clip_norm=1)": "the median of clipped updates, which shrinks the honest ones too",
}
SIZES = ["1e10", "1e38", "gaussian_1e39", "nan"]


def _model() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "fc.weight": torch.randn(6, 5, generator=generator) * 0.3,
        "fc.bias": torch.zeros(6),
        "bn.weight": torch.ones(6),
        "bn.bias": torch.zeros(6),
        "bn.running_mean": torch.randn(6, generator=generator),
        "bn.running_var": torch.rand(6, generator=generator) + 0.5,
        "bn.num_batches_tracked": torch.tensor(7),
    }


def _honest(model, count):
    generator = torch.Generator().manual_seed(1)
    return [
        {k: v + 0.1 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
         for k, v in model.items()}
        for _ in range(count)
    ]  # fmt: skip


def _outliers(model, count, size, aligned):
    """``count`` uploads ``w + size * v``, ``v`` a Gaussian direction scaled to ``max |v| = 1``
    (float32 holds 1e38 * v), each along its own or all along the first; Gaussian noise of sigma
    1e39 (mostly Inf in float32); NaN."""
    generator = torch.Generator().manual_seed(2)
    floating = [k for k, v in model.items() if v.is_floating_point()]
    directions = []
    for _ in range(count):
        noise = {k: torch.randn(model[k].shape, generator=generator, dtype=torch.float64)
                 for k in floating}  # fmt: skip
        peak = max(float(v.abs().max()) for v in noise.values())
        if size != "gaussian_1e39":
            noise = {k: v / peak for k, v in noise.items()}
        directions.append(directions[0] if aligned and directions else noise)
    scale = {"nan": float("nan"), "gaussian_1e39": 1e39}.get(size) or float(size)
    return [
        {**model, **{k: (model[k].double() + scale * v[k]).float() for k in floating}}
        for v in directions
    ]


def _flat(state):
    return torch.cat([v.double().reshape(-1) for v in state.values() if v.is_floating_point()])


def _most_tolerated(cls) -> int:
    """The most malicious uploads of N the statistic accepts (0: it declares no breakdown)."""

    def accepts(f):
        try:
            cls().check_byzantine(N, f)
        except ConfigurationError:
            return False
        return True

    if accepts(N // 2):
        return 0
    return max((f for f in range(1, N // 2) if accepts(f)), default=0)


def _combine(cls, f, outliers):
    model = _model()
    statistic = cls()
    parameters = frozenset(k for k in model if not k.startswith("bn.running"))
    setup_statistic(statistic, model, parameters, N, 0, None, heterogeneous=False)
    statistic.check_byzantine(N, f)
    uploads = _honest(model, N - f) + outliers
    return statistic.combine(uploads, [1.0] * N, StatisticContext(0, 0, model))


@pytest.mark.parametrize("aligned", [False, True], ids=["spread", "aligned"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", [n for n, cls in STATISTICS.items() if _most_tolerated(cls)])
def test_outliers_of_any_size_move_a_robust_statistic_no_more_than_its_guarantee(
    name, size, aligned
):
    cls = STATISTICS[name]
    f = _most_tolerated(cls)
    model = _model()
    honest = torch.stack([_flat(u) for u in _honest(model, N - f)])
    result = _combine(cls, f, _outliers(model, f, size, aligned))
    z = _flat(result)
    assert bool(z.isfinite().all()), f"{name}: non-finite result"
    mean = honest.mean(dim=0)
    radius = float((honest - mean).norm(dim=1).max())
    e = f / N
    assert float((z - mean).norm()) <= 2 * (1 - e) / (1 - 2 * e) * radius
    if name not in NOT_IN_RANGE:
        slack = 1e-6
        assert bool((z >= honest.min(dim=0).values - slack).all())
        assert bool((z <= honest.max(dim=0).values + slack).all())
    if size == "1e38":
        near = _flat(_combine(cls, f, _outliers(model, f, "1e10", aligned)))
        assert float((z - near).norm()) <= 1e-3 * radius


def test_only_the_plain_mean_declares_no_breakdown_point_and_the_outliers_break_it():
    """The statistics left out above are the plain mean alone; the test's outliers are harmful:
    they move it farther than any bound above from the honest uploads, at each size."""
    assert [n for n, cls in STATISTICS.items() if not _most_tolerated(cls)] == ["Mean"]
    model = _model()
    honest = torch.stack([_flat(u) for u in _honest(model, N - 2)])
    for size in SIZES:
        z = _flat(_combine(statistics.Mean, 2, _outliers(model, 2, size, aligned=False)))
        distance = float((z - honest.mean(dim=0)).norm())
        assert not distance < 1e6 * float((honest - honest.mean(dim=0)).norm(dim=1).max())
