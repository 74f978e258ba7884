"""Reporting: ``metrics.csv`` (:mod:`fedlightning.loop.metrics_table`), Lightning loggers (any by
``class_path``, W&B by the ``wandb`` shorthand) with the resolved config and the run's figures
(:mod:`fedlightning.loop.logger_outputs`), the progress display and the plots of a run.

Progress (:mod:`fedlightning.loop.progress`): on a terminal a progress bar; in Jupyter one display
per fit, updated in place; anywhere else (a batch job's log file) one plain, flushed line per
evaluated round (every ``log_every`` rounds, and the last):
``round 3/10 test_acc 0.8123 test_loss 0.5123 time 1.2s failed 0 rejected 0``. A round that
takes longer than ``slow_round_s`` seconds says how many of its clients are done every
``slow_round_s`` seconds (a line; in Jupyter, in the fit's display). The run summary closes it.

Each of them headlines what the run is scored by (:mod:`fedlightning.loop.headline`): a run with
client groups shows ``group_mean_acc``, named, with each group's model's accuracy, instead of the
global model's ``test_acc`` (one group's model in a within-groups run), and its summary says which
model metrics.csv's ``test_acc`` column scores.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from rich.console import Console

from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.errors import require
from fedlightning.loop.headline import UNGROUPED, ScoredModels, headline, scored_line
from fedlightning.loop.logger_outputs import is_wandb, log_config, log_figure
from fedlightning.loop.metrics_table import MetricsTable
from fedlightning.loop.progress import (
    Advance,
    NotebookDisplay,
    notebook_line,
    output_mode,
    rich_bar,
)


class Reporter:
    """Where a run's metrics go.

    Args:
        run_dir: the run directory (``metrics.csv`` and the plots are written there).
        loggers: extra Lightning loggers (TensorBoard, MLflow, W&B...).
        wandb: also log to a WandbLogger made by :func:`fedlightning.tracking.make_wandb_logger`
            with ``wandb_settings`` (offline without an API key; resumed runs continue their run).
        progress_bar: show the progress (a bar on a terminal, one updating display in Jupyter).
        plots: write ``partition.png`` at start and ``curves.png`` at the end (and log them to
            the loggers that take images).
        log_every: off a terminal and outside Jupyter, one plain line every this many rounds.
    """

    def __init__(
        self,
        run_dir: Path,
        loggers: Sequence[Logger] = (),
        wandb: bool = False,
        wandb_settings: dict[str, Any] | None = None,
        progress_bar: bool = True,
        plots: bool = True,
        log_every: int = 1,
    ) -> None:
        require(log_every >= 1, "loop.log_every", log_every, "an integer >= 1")
        self.run_dir = run_dir
        self.extra_loggers = list(loggers)
        self.wandb = wandb
        self.wandb_settings = wandb_settings or {}
        self.progress_bar = progress_bar
        self.plots = plots
        self.loggers: list[Logger] = []
        self.table = MetricsTable(run_dir)
        self.console = Console(stderr=True)
        self.notebook = NotebookDisplay()
        self.log_every = log_every
        self.slow_round_s = 5.0
        self._clients_done = 0
        #: what the run's evaluation scores (its client groups), set by :meth:`open`
        self.scored = UNGROUPED

    @property
    def plain(self) -> bool:
        """Plain log lines: stderr is neither a terminal nor a Jupyter kernel's."""
        return output_mode(self.console) == "log"

    def _line(self, text: str) -> None:
        """One line for the user: in Jupyter, appended to the fit's display."""
        if self.console.quiet:
            return
        if output_mode(self.console) == "notebook":
            self.notebook.show(f"{self.notebook.text}\n{text}".lstrip("\n"))
            return
        self.console.print(text, soft_wrap=True, highlight=False, markup=False)
        self.console.file.flush()

    def round_line(self, metrics: dict[str, float], rounds: int, last: bool) -> None:
        """One plain line for an evaluated round (in a log; every ``log_every``)."""
        r = int(metrics["round"])
        if not self.plain or not (last or r % self.log_every == 0):
            return
        scored = headline(metrics, self.scored) or f"test_acc {float('nan'):.4f}"
        loss = "" if self.scored.grouped else f"test_loss {metrics.get('test_loss', math.nan):.4f} "
        self._line(
            f"round {r}/{rounds} {scored} {loss}"
            f"time {metrics.get('round_time_s', float('nan')):.1f}s "
            f"failed {int(metrics.get('clients_failed', 0))} "
            f"rejected {int(metrics.get('clients_rejected', 0))}"
        )

    def client_done(self, client_id: int) -> None:
        """Called by a backend after each client fit (for the slow-round progress)."""
        self._clients_done += 1

    @contextmanager
    def watch_round(self, round_index: int, num_clients: int) -> Iterator[None]:
        """While a round runs: after ``slow_round_s`` seconds, and every ``slow_round_s`` seconds
        after, say ``round r: k/n clients done, t s``."""
        self._clients_done = 0
        stop = threading.Event()
        start = time.perf_counter()
        before = self.notebook.text

        def watch() -> None:
            while not stop.wait(self.slow_round_s):
                status = (
                    f"round {round_index + 1}: {self._clients_done}/{num_clients} clients done, "
                    f"{time.perf_counter() - start:.0f} s"
                )
                if output_mode(self.console) == "notebook":
                    self.notebook.show(f"{before}\n{status}".lstrip("\n"))
                else:
                    self._line(status)

        watcher = threading.Thread(target=watch, name="fedlightning-round-watch", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()

    def summary(self, lines: Sequence[str]) -> None:
        """The run summary's ``lines``, then, for a run with client groups, what its headline
        and metrics.csv's ``test_acc`` score (:func:`~fedlightning.loop.headline.scored_line`)."""
        last = self.table.rows[-1] if self.table.rows else {}
        for line in [*lines, *scored_line(last, self.scored)]:
            self._line(line)

    def plot_partition(self, dm: FederatedDataModule) -> None:
        """``partition.png``, titled with the data set and partition (from ``config.yaml``)."""
        if self.plots:
            from fedlightning.analysis.labels import describe_run
            from fedlightning.analysis.plots import plot_partition

            description = describe_run(self.run_dir)
            title = f"{description.data}, {description.partition}" if description else dm.dataset
            plot_partition(dm.partition_table(), self.run_dir / "partition.png", title=title)

    def open(
        self,
        history: Sequence[dict[str, float]],
        wandb_id: str | None,
        dm: FederatedDataModule,
        scored: ScoredModels = UNGROUPED,
    ) -> None:
        """Open the loggers; a resumed run first rewrites the rows up to its checkpoint to
        ``metrics.csv``. Every logger gets the resolved config; a new run's partition figure goes
        to those that take images. ``scored``: the run's client groups, which the progress, the
        closing line and the summary headline."""
        self.scored = scored
        self.table.start(history)
        self.notebook = NotebookDisplay()  # this fit's own display
        self.loggers = list(self.extra_loggers)
        log_config(self.loggers, self.run_dir / "config.yaml")
        if self.wandb:  # its own description: the config and the partition table
            from fedlightning.tracking import log_run_description, make_wandb_logger

            logger = make_wandb_logger(self.run_dir, wandb_id, **self.wandb_settings)
            if wandb_id is None:  # a resumed W&B run already has them
                log_run_description(logger, self.run_dir / "config.yaml", dm.partition_table())
            self.loggers.append(logger)
        if not history:
            log_figure(self.loggers, "partition", self.run_dir / "partition.png", step=0)
        for logger in self.loggers:
            logger.save()

    def log(self, metrics: dict[str, float]) -> None:
        self.table.add(metrics)
        for logger in self.loggers:
            logger.log_metrics(metrics, step=int(metrics["round"]))
            logger.save()

    def close(self) -> None:
        """Draw ``curves.png``, log it, and close the loggers."""
        if self.plots and self.table.rows:
            from fedlightning.analysis.plots import plot_curves

            curves = plot_curves(self.run_dir)
            log_figure(self.loggers, "curves", curves, step=int(self.table.rows[-1]["round"]))
        self.release("success")

    def release(self, status: str = "failed") -> None:
        """Finalize the loggers still open with ``status`` and finish the W&B run (WandbLogger
        leaves it open): its transaction log is flushed and closed, with exit code 1 for a run
        that failed, and the process's next W&B run starts clean. Idempotent."""
        loggers, self.loggers = self.loggers, []
        for logger in loggers:
            logger.finalize(status)
            if is_wandb(logger):
                logger.experiment.finish(exit_code=0 if status == "success" else 1)

    def wandb_id(self) -> str | None:
        """The W&B run id (stored in checkpoints so a resumed run continues the same W&B run)."""
        for logger in self.loggers:
            if is_wandb(logger):
                return logger.version
        return None

    @contextmanager
    def progress(self, total: int, start: int) -> Iterator[Advance]:
        """The progress over rounds; yields ``advance(metrics)``, called after each round with
        the latest evaluated metrics."""
        enabled = self.progress_bar and not self.console.quiet
        if output_mode(self.console) == "notebook":
            with notebook_line(self.notebook, total, start, enabled, self.scored) as advance:
                yield advance
        else:
            bar = enabled and not self.plain
            with rich_bar(self.console, total, start, bar, self.scored) as advance:
                yield advance

    def done(
        self, metrics: Mapping[str, float], rounds: int, elapsed: float, note: str = ""
    ) -> None:
        """The closing line: ``done: round R/R, <headline><note>, <time>; run directory ...``;
        a run whose last logged row has no test accuracy (its one evaluated round was skipped:
        nothing scored the saved model) says so in the same line."""
        if "test_acc" in metrics:
            scored = headline(metrics, self.scored) or f"test_acc {metrics['test_acc']:.4f}"
            self._line(
                f"done: round {metrics['round']}/{rounds}, {scored}"
                f"{note}, {elapsed:.1f} s; run directory {self.run_dir}"
            )
        else:
            last = (
                f"round {metrics['round']} was the last" if "round" in metrics else "no round was"
            )
            self._line(
                f"done: {rounds} round(s), no test accuracy logged ({last} evaluated and "
                f"logged; a skipped round is not){note}, {elapsed:.1f} s; "
                f"`fedlightning test {self.run_dir}` scores the saved model"
            )
