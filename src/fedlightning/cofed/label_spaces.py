"""The pure partition behind CoFED's label-space tasks: each participant draws its own
superclasses and samples of them, IID or sub-class non-IID (docs/algorithms.md section 3, "Tasks").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from fedlightning.errors import ConfigurationError, require


def label_space_tasks(
    labels: np.ndarray,
    superclass_of: np.ndarray,
    num_participants: int,
    classes_per_participant: tuple[int, int],
    samples_per_class: int,
    distribution: Literal["iid", "noniid"] = "iid",
    noniid_subclasses: Sequence[int] = (1, 2),
    seed: int = 0,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per participant ``(label_space, indices)``: its superclasses and its training samples.

    ``superclass_of[f]`` is the superclass of fine class f (the identity for plain classes). In
    participant order, each draws ``k ~ U{lo..hi}`` of the superclasses present in ``labels``
    (uniformly, without replacement) and, for each superclass c, ``samples_per_class`` samples:

    - ``iid``: spread evenly over all of c's subclasses (``n // m`` each; the ``n mod m`` extra
      samples go to randomly chosen subclasses);
    - ``noniid``: from ``m`` subclasses only, m drawn uniformly from ``noniid_subclasses`` (the
      paper uses 1, or 2), chosen uniformly among the subclasses with enough samples left and
      split evenly as above.

    Samples are drawn without replacement from a seeded shuffle of each fine class, so participants'
    data never overlap. The samples nobody drew are left for a held-out public set.
    """
    require(distribution in ("iid", "noniid"), "distribution", distribution, "'iid' or 'noniid'")
    require(num_participants >= 1, "num_participants", num_participants, "an integer >= 1")
    require(samples_per_class >= 1, "samples_per_class", samples_per_class, "an integer >= 1")
    labels = np.asarray(labels, dtype=np.int64)
    superclass_of = np.asarray(superclass_of, dtype=np.int64)
    lo, hi = classes_per_participant
    rng = np.random.default_rng(seed)
    fine_present = np.unique(labels)
    subclasses = _subclasses(fine_present, superclass_of)
    groups = np.array(sorted(subclasses), dtype=np.int64)
    if not 1 <= lo <= hi <= len(groups):
        raise ConfigurationError(
            f"classes_per_participant={[lo, hi]} is not allowed: expected 1 <= min <= max <= "
            f"{len(groups)} (the number of {'super' if len(groups) < len(fine_present) else ''}classes)"
        )
    pools = {int(f): list(rng.permutation(np.flatnonzero(labels == f))) for f in fine_present}
    tasks = []
    for i in range(num_participants):
        space = np.sort(rng.choice(groups, size=int(rng.integers(lo, hi + 1)), replace=False))
        taken: list[int] = []
        for c in space:
            subs = subclasses[int(c)]
            if distribution == "noniid":
                subs = _noniid_subclasses(subs, pools, samples_per_class, noniid_subclasses, rng)
            taken += _take(i, subs, pools, samples_per_class, num_participants, rng)
        tasks.append((space, np.sort(np.asarray(taken, dtype=np.int64))))
    return tasks


def _subclasses(fine_present: np.ndarray, superclass_of: np.ndarray) -> dict[int, list[int]]:
    """Each superclass of the fine classes ``fine_present`` -> its fine classes present, ascending."""
    if fine_present.max() >= len(superclass_of) or superclass_of[fine_present].min() < 0:
        raise ConfigurationError(
            f"the superclass table covers {len(superclass_of)} classes, which does not map every "
            f"label in the data (labels up to {fine_present.max()})"
        )
    return {
        int(c): [int(f) for f in fine_present if superclass_of[f] == c]
        for c in np.unique(superclass_of[fine_present])
    }


def _noniid_subclasses(
    subs: list[int],
    pools: dict[int, list[int]],
    samples_per_class: int,
    noniid_subclasses: Sequence[int],
    rng: np.random.Generator,
) -> list[int]:
    """The non-IID draw of one superclass: ``m`` of its subclasses ``subs``, m drawn uniformly
    from ``noniid_subclasses``, chosen among those with enough samples left in ``pools``."""
    m = min(int(rng.choice(noniid_subclasses)), len(subs))
    need = -(-samples_per_class // m)
    candidates = [f for f in subs if len(pools[f]) >= need] or subs
    return [int(f) for f in rng.choice(candidates, size=min(m, len(candidates)), replace=False)]


def _take(
    participant: int,
    subs: list[int],
    pools: dict[int, list[int]],
    samples_per_class: int,
    num_participants: int,
    rng: np.random.Generator,
) -> list[int]:
    """Take ``samples_per_class`` rows spread evenly over the subclasses ``subs`` (``n // m``
    each, the ``n mod m`` extra to randomly chosen subclasses) off the front of their ``pools``."""
    counts = np.full(len(subs), samples_per_class // len(subs))
    counts[rng.choice(len(subs), size=samples_per_class % len(subs), replace=False)] += 1
    taken: list[int] = []
    for f, n in zip(subs, counts, strict=True):
        if len(pools[f]) < n:
            raise ConfigurationError(
                f"participant {participant} needs {n} more samples of class {f}, only "
                f"{len(pools[f])} are left: lower samples_per_class={samples_per_class} or "
                f"num_participants={num_participants}"
            )
        taken += pools[f][:n]
        del pools[f][:n]
    return taken
