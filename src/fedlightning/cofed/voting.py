"""CoFED's pseudo-label vote: Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task
learning via co-training", arXiv:2202.08603 (docs/algorithms.md section 3, steps 2-4).

Pure numpy over the participants' probability matrices on the shared public set; nothing but
labels leaves this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedlightning.errors import ConfigurationError


def vote_scores(
    probs: Sequence[Any],
    label_spaces: Sequence[Sequence[int]],
    margin: float = 0.3,
    weights: Sequence[float] | None = None,
    num_classes: int | None = None,
) -> np.ndarray:
    """The ``M x C`` matrix ``score(s, c) = sum_{i votes c on s} w_i / sum_{i in owners(c)} w_i``.

    Participant i votes for class ``label_spaces[i][k]`` on sample s when k is its top-1 column and
    ``p_top1 - p_top2 > margin``. ``margin = 0`` disables the filter: every participant votes its
    top-1 (ties go to the first column in label-space order, as ``argmax``). A participant with a
    single class cannot rank alternatives (its probability is identically 1), so it never votes; it
    still counts in ``owners(c)``, so its abstention weighs against its class. A class whose owners
    weigh 0 in total (or that nobody owns) scores 0. ``C`` is ``num_classes`` (default: the largest
    class id + 1).
    """
    probs = [_as_array(p) for p in probs]
    spaces = [np.asarray(space, dtype=np.int64) for space in label_spaces]
    w = _check(probs, spaces, margin, weights)
    num_samples = probs[0].shape[0]
    largest = max((int(space.max()) for space in spaces if len(space)), default=-1)
    num_classes = largest + 1 if num_classes is None else num_classes
    if num_classes <= largest:
        raise ConfigurationError(
            f"num_classes={num_classes} is too small for class id {largest} in the label spaces"
        )
    votes = np.zeros(num_samples * num_classes)
    owners = np.zeros(num_classes)
    for p, space, w_i in zip(probs, spaces, w, strict=True):
        np.add.at(owners, space, w_i)
        if p.shape[1] < 2:
            continue
        top2 = np.partition(p, -2, axis=1)[:, -2:]  # [:, 1] is the largest, [:, 0] the second
        confident = np.ones(num_samples, bool) if margin == 0 else top2[:, 1] - top2[:, 0] > margin
        samples = np.flatnonzero(confident)
        classes = space[p[samples].argmax(axis=1)]
        np.add.at(votes, samples * num_classes + classes, w_i)
    votes = votes.reshape(num_samples, num_classes)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(owners > 0, votes / np.where(owners > 0, owners, 1.0), 0.0)


def vote(
    probs: Sequence[Any],
    label_spaces: Sequence[Sequence[int]],
    alpha: float = 0.3,
    margin: float = 0.3,
    weights: Sequence[float] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """CoFED's pseudo labels for every participant.

    Args:
        probs: ``probs[i]`` is participant i's ``M x |Y_i|`` probability matrix on the public set
            (numpy or torch), its columns in the order of ``label_spaces[i]``.
        label_spaces: ``label_spaces[i]`` lists participant i's global class ids (distinct, >= 0).
        alpha: score threshold in [0, 1]: ``S_c = {s : score(s, c) > alpha}`` (see
            :func:`vote_scores`; ``alpha = 1`` labels nothing).
        margin: confidence margin in [0, 1] on ``p_top1 - p_top2`` (0 disables it).
        weights: finite credibility weights ``w_i >= 0`` (default all 1).

    Returns:
        Per participant, ``(indices, labels)``: the public samples
        ``R_i = {(s, c) : c in Y_i, s in S_c}`` in ascending order and their global class ids, after
        dropping every s that lies in ``S_c`` for two or more of i's own classes (contradictory).

    Example:
        Two participants own classes {0, 1} and {1, 2}; on sample 0 both are confident of class 1,
        on sample 1 the first says 0 and the second 2:

        >>> import numpy as np
        >>> p0 = np.array([[0.1, 0.9], [0.8, 0.2]])
        >>> p1 = np.array([[0.9, 0.1], [0.1, 0.9]])
        >>> [(idx.tolist(), lab.tolist()) for idx, lab in vote([p0, p1], [[0, 1], [1, 2]])]
        [([0, 1], [1, 0]), ([0, 1], [1, 2])]
    """
    if not 0.0 <= alpha <= 1.0:
        raise ConfigurationError(f"alpha={alpha!r} is not allowed: expected a number in [0, 1]")
    score = vote_scores(probs, label_spaces, margin, weights)
    selected = score > alpha
    result = []
    for space in label_spaces:
        space = np.asarray(space, dtype=np.int64)
        mine = selected[:, space]
        unique = np.flatnonzero(mine.sum(axis=1) == 1)
        result.append((unique, space[mine[unique].argmax(axis=1)]))
    return result


def _as_array(p: Any) -> np.ndarray:
    if hasattr(p, "detach"):  # a torch tensor
        p = p.detach().cpu().numpy()
    array = np.asarray(p, dtype=np.float64)
    if array.ndim != 2:
        raise ConfigurationError(
            f"each probability matrix must be M x |Y_i|, got shape {array.shape}"
        )
    return array


def _check(
    probs: list[np.ndarray],
    spaces: list[np.ndarray],
    margin: float,
    weights: Sequence[float] | None,
) -> np.ndarray:
    if not probs or len(probs) != len(spaces):
        raise ConfigurationError(
            f"vote needs one probability matrix per label space, got {len(probs)} and {len(spaces)}"
        )
    if not 0.0 <= margin <= 1.0:
        raise ConfigurationError(f"margin={margin!r} is not allowed: expected a number in [0, 1]")
    for i, (p, space) in enumerate(zip(probs, spaces, strict=True)):
        if p.shape != (probs[0].shape[0], len(space)):
            raise ConfigurationError(
                f"participant {i}: probabilities of shape {p.shape} do not match "
                f"{probs[0].shape[0]} public samples x {len(space)} classes of its label space"
            )
        if len(np.unique(space)) != len(space) or (len(space) and space.min() < 0):
            raise ConfigurationError(
                f"participant {i}: label space {space.tolist()} must hold distinct class ids >= 0"
            )
    w = np.ones(len(probs)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(probs),) or not np.all((w >= 0) & np.isfinite(w)):
        raise ConfigurationError(
            f"weights={np.atleast_1d(w).tolist()} is not allowed: expected {len(probs)} finite "
            "numbers >= 0, one credibility weight per participant"
        )
    return w
