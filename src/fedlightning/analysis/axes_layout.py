"""Where a figure's parts go: ticks on the evaluated rounds, the legend beside or below the axes by
the figure's width, a long title broken between its parts (issue 38 item 5: figures a paper takes
as they are at a column's width, ``--figsize 5 3.2``)."""

from __future__ import annotations

import textwrap

import numpy as np

#: the most ticks a round axis gets (:func:`round_ticks`)
MAX_ROUND_TICKS = 10
#: figures narrower than this (inches) get their legend below the axes, not to their right
LEGEND_RIGHT_MIN_WIDTH = 7.0


def integer_axis(axis) -> None:
    """Ticks at integers only (rounds, clients, classes are counts)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def round_axis(ax, rounds: np.ndarray, label: str = "Round") -> None:
    """Ticks at evaluated rounds (:func:`round_ticks`), with limits that never fall inside a round
    (one evaluated round no longer spans 1.9-2.1)."""
    rounds = rounds[np.isfinite(rounds)]
    ax.set_xlabel(label)
    integer_axis(ax.xaxis)
    if rounds.size == 0:
        return
    low, high = float(rounds.min()), float(rounds.max())
    ax.set_xticks(round_ticks(rounds))
    pad = max(0.5, 0.03 * (high - low))
    ax.set_xlim(low - pad, high + pad)


def round_ticks(rounds: np.ndarray, most: int = MAX_ROUND_TICKS) -> np.ndarray:
    """The ticks of a round axis, each an evaluated round of ``rounds``: all of them when there
    are at most ``most``; otherwise the multiples of a step that is 1, 2 or 5 times a power of ten
    times the rounds' common divisor, the smallest giving at most ``most`` ticks (``eval_every:
    2`` over 30 rounds: 4, 8, ..., 28, not 5, 10, ..., which were not evaluated). The last round,
    evaluated whatever ``eval_every``, does not count in the divisor."""
    evaluated = np.unique(rounds[np.isfinite(rounds)].astype(int))
    if len(evaluated) <= most:
        return evaluated
    divisor = int(np.gcd.reduce(evaluated[:-1])) or 1
    steps = (divisor * m * 10**power for power in range(12) for m in (1, 2, 5))
    step = next(step for step in steps if evaluated[-1] // step <= most)
    ticks = evaluated[evaluated % step == 0]
    if len(ticks) < 3:  # irregular rounds (a resume that changed eval_every): every k-th one
        ticks = evaluated[:: -(-len(evaluated) // most)]
    return ticks


def legend_below(ax) -> None:
    """The legend of one panel of ``curves.png``, below its axes."""
    if ax.lines:  # in the strip reserved below the axes, never over a line
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)


def place_legend(ax, width: float) -> None:
    """The legend right of the axes in a figure at least :data:`LEGEND_RIGHT_MIN_WIDTH` inches
    wide; below the axes in a narrower one (a paper's column: ``--figsize 5 3.2``), where on the
    right it took almost half the width, in as many columns as its names fit across. The figure's
    constrained layout makes room for it."""
    fig = ax.get_figure()
    if width >= LEGEND_RIGHT_MIN_WIDTH:
        fig.legend(loc="outside right upper", frameon=False)
        return
    names = ax.get_legend_handles_labels()[1]
    per_name = 6.0 * max((len(name) for name in names), default=1) + 35  # text and line, points
    columns = max(1, min(len(names), int((72 * width - 20) // per_name)))
    fig.legend(
        loc="outside lower center", ncol=columns, frameon=False, handlelength=1.5,
        columnspacing=1.0,
    )  # fmt: skip


def fitted_title(title: str, width: float, fontsize: float = 12.0) -> str:
    """``title`` broken into lines between its parts (after a ``·`` or a ``,``, before a
    parenthesis; not inside one), a part broken at spaces only where it alone is too long, to fit
    a figure ``width`` inches wide (about 0.55 em a character)."""
    chars = max(20, int(72 * width / (0.55 * fontsize)))
    lines: list[str] = []
    for part in _title_parts(title):
        if lines and len(lines[-1]) + 1 + len(part) <= chars:
            lines[-1] += " " + part
        else:
            lines += textwrap.wrap(part, chars, break_on_hyphens=False) or [part]
    return "\n".join(lines)


def _title_parts(title: str) -> list[str]:
    """The words of ``title`` between which a line may break (:func:`fitted_title`)."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(title):
        depth += {"(": 1, ")": -1}.get(char, 0)
        after = depth == 0 and char == " " and title[at - 1] in "·,"
        before = depth == 1 and char == "(" and at > start
        if after or before:
            parts.append(title[start:at].strip())
            start = at
    return [part for part in (*parts, title[start:].strip()) if part]
