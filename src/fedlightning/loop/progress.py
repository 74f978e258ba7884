"""How a run shows its progress, by where its output goes (:func:`output_mode`):

- ``bar``, a terminal: a rich progress bar over rounds with the elapsed and remaining time and the
  latest evaluated headline (``test_acc``, or a grouped run's ``group_mean_acc`` with each group's
  model: :mod:`fedlightning.loop.headline`) and ``train_loss``;
- ``notebook``, Jupyter: one display that each round updates in place (the same text as the bar,
  then the run's summary and closing line), through IPython's public ``display(...,
  display_id=True)``; one output per fit instead of a line per round;
- ``log``, anything else (a batch job's log file): plain lines (:mod:`fedlightning.loop.reporting`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from fedlightning.loop.headline import UNGROUPED, ScoredModels, headline

Mode = Literal["bar", "notebook", "log"]
#: called after each round with its metrics (the last evaluated row when it was not evaluated)
Advance = Callable[[Mapping[str, float]], None]


def output_mode(console: Console) -> Mode:
    """``notebook`` in Jupyter, ``bar`` on a terminal, ``log`` otherwise."""
    if console.is_jupyter:
        return "notebook"
    return "bar" if console.is_terminal else "log"


def latest(metrics: Mapping[str, float], scored: ScoredModels = UNGROUPED) -> str:
    """The latest evaluated headline (:func:`~fedlightning.loop.headline.headline`: ``test_acc``,
    or ``group_mean_acc`` and each group's model for a run with client groups) and
    ``train_loss`` (the clients' mean training loss), those present and finite."""
    shown = [headline(metrics, scored)]
    loss = metrics.get("train_loss", math.nan)
    shown += [f"train_loss {loss:.4f}"] if math.isfinite(loss) else []
    return "  ".join(part for part in shown if part)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


class NotebookDisplay:
    """One text output of a Jupyter cell, replaced in place at each :meth:`show` (created on the
    first)."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.text = ""

    def show(self, text: str) -> None:
        from IPython.display import display

        self.text = text
        if self.handle is None:
            self.handle = display({"text/plain": text}, raw=True, display_id=True)
        else:
            self.handle.update({"text/plain": text}, raw=True)


@contextmanager
def rich_bar(
    console: Console, total: int, start: int, enabled: bool, scored: ScoredModels = UNGROUPED
) -> Iterator[Advance]:
    """A progress bar over rounds on ``console``: done/total, elapsed, remaining and the latest
    metrics (:func:`latest`)."""
    progress = Progress(
        TextColumn("[bold]rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("<"), TimeRemainingColumn(), TextColumn("{task.description}"),
        console=console, disable=not enabled,
    )  # fmt: skip
    with progress:
        task = progress.add_task("", total=total, completed=start)
        yield lambda metrics: progress.update(task, advance=1, description=latest(metrics, scored))


@contextmanager
def notebook_line(
    display: NotebookDisplay, total: int, start: int, enabled: bool,
    scored: ScoredModels = UNGROUPED,
) -> Iterator[Advance]:  # fmt: skip
    """``round r/R  test_acc ..  train_loss ..  elapsed, ~remaining left`` in ``display``,
    updated after each round (the remaining time from the mean time of this fit's rounds)."""
    began, done = time.perf_counter(), start

    def advance(metrics: Mapping[str, float]) -> None:
        nonlocal done
        done += 1
        elapsed = time.perf_counter() - began
        left = elapsed / (done - start) * (total - done)
        timing = f"{_duration(elapsed)}" + (f", ~{_duration(left)} left" if done < total else "")
        display.show(
            "  ".join(
                part for part in (f"round {done}/{total}", latest(metrics, scored), timing) if part
            )
        )

    if enabled:
        display.show(f"round {start}/{total}")
    yield advance if enabled else (lambda metrics: None)
