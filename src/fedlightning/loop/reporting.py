"""Reporting: metrics to Lightning loggers (CSV always, any others by ``class_path``, W&B by the
``wandb`` shorthand), the progress bar, and the plots of a run.

For clusters: when stderr is not a terminal (a batch job's log file) there is no progress bar but
one plain, flushed line per evaluated round (every ``log_every`` rounds, and the last):
``round 3/10 test_acc 0.8123 test_loss 0.5123 time 1.2s failed 0 rejected 0``. A round that
takes longer than ``slow_round_s`` seconds prints how many of its clients are done every
``slow_round_s`` seconds (on a terminal too). The run summary closes the log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedlightning.data.datamodule import FederatedDataModule


class Reporter:
    """Where a run's metrics go.

    Args:
        run_dir: the run directory (``metrics.csv`` and the plots are written there).
        loggers: extra Lightning loggers (TensorBoard, MLflow, W&B...).
        wandb: also log to a WandbLogger made by :func:`fedlightning.tracking.make_wandb_logger`
            with ``wandb_settings`` (offline without an API key; resumed runs continue their run).
        progress_bar: show a rich progress bar over rounds.
        plots: write ``partition.png`` at start and ``curves.png`` at the end.
        log_every: with stderr not a terminal, one plain line every this many rounds.
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
        self.run_dir = run_dir
        self.extra_loggers = list(loggers)
        self.wandb = wandb
        self.wandb_settings = wandb_settings or {}
        self.progress_bar = progress_bar
        self.plots = plots
        self.loggers: list[Logger] = []
        self.console = Console(stderr=True)
        self.log_every = log_every
        self.slow_round_s = 5.0
        self._clients_done = 0

    @property
    def plain(self) -> bool:
        """Plain log lines instead of a progress bar: stderr is not a terminal."""
        return not self.console.is_terminal

    def _line(self, text: str) -> None:
        self.console.print(text, soft_wrap=True, highlight=False, markup=False)
        self.console.file.flush()

    def round_line(self, metrics: dict[str, float], rounds: int, last: bool) -> None:
        """One plain line for an evaluated round (stderr not a terminal; every ``log_every``)."""
        r = int(metrics["round"])
        if not self.plain or not (last or r % self.log_every == 0):
            return
        self._line(
            f"round {r}/{rounds} test_acc {metrics.get('test_acc', float('nan')):.4f} "
            f"test_loss {metrics.get('test_loss', float('nan')):.4f} "
            f"time {metrics.get('round_time_s', float('nan')):.1f}s "
            f"failed {int(metrics.get('clients_failed', 0))} "
            f"rejected {int(metrics.get('clients_rejected', 0))}"
        )

    def client_done(self, client_id: int) -> None:
        """Called by a backend after each client fit (for the slow-round progress lines)."""
        self._clients_done += 1

    @contextmanager
    def watch_round(self, round_index: int, num_clients: int) -> Iterator[None]:
        """While a round runs: after ``slow_round_s`` seconds, and every ``slow_round_s`` seconds
        after, print ``round r: k/n clients done, t s``."""
        self._clients_done = 0
        stop = threading.Event()
        start = time.perf_counter()

        def watch() -> None:
            while not stop.wait(self.slow_round_s):
                self._line(
                    f"round {round_index + 1}: {self._clients_done}/{num_clients} clients done, "
                    f"{time.perf_counter() - start:.0f} s"
                )

        watcher = threading.Thread(target=watch, name="fedlightning-round-watch", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()

    def summary(self, lines: Sequence[str]) -> None:
        for line in lines:
            self._line(line)

    def plot_partition(self, dm: FederatedDataModule) -> None:
        if self.plots:
            from fedlightning.analysis.plots import plot_partition

            plot_partition(
                dm.partition_table(),
                self.run_dir / "partition.png",
                title=f"{dm.dataset} partition",
            )

    def open(
        self, history: Sequence[dict[str, float]], wandb_id: str | None, dm: FederatedDataModule
    ) -> None:
        """Open the loggers; a resumed run first rewrites the rows up to its checkpoint to CSV."""
        csv = CSVLogger(save_dir=str(self.run_dir), name="", version="")
        for row in history:
            csv.log_metrics(row, step=int(row["round"]))
        self.loggers = [csv, *self.extra_loggers]
        if self.wandb:
            from fedlightning.tracking import log_run_description, make_wandb_logger

            logger = make_wandb_logger(self.run_dir, wandb_id, **self.wandb_settings)
            if wandb_id is None:  # a resumed W&B run already has them
                log_run_description(logger, self.run_dir / "config.yaml", dm.partition_table())
            self.loggers.append(logger)
        for logger in self.loggers:
            logger.save()

    def log(self, metrics: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step=int(metrics["round"]))
            logger.save()

    def close(self) -> None:
        for logger in self.loggers:
            logger.finalize("success")
            if type(logger).__name__ == "WandbLogger":
                logger.experiment.finish()  # flush and close the W&B run (WandbLogger leaves it open)
        if self.plots and (self.run_dir / "metrics.csv").is_file():
            from fedlightning.analysis.plots import plot_curves

            plot_curves(self.run_dir)

    def wandb_id(self) -> str | None:
        """The W&B run id (stored in checkpoints so a resumed run continues the same W&B run)."""
        for logger in self.loggers:
            if type(logger).__name__ == "WandbLogger":
                return logger.version
        return None

    @contextmanager
    def progress(self, total: int, start: int) -> Iterator[Any]:
        """A progress bar over rounds; yields ``advance(description)``."""
        progress = Progress(
            TextColumn("[bold]rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=self.console,
            disable=not self.progress_bar or self.plain,
        )  # fmt: skip
        with progress:
            task = progress.add_task("", total=total, completed=start)
            yield lambda description: progress.update(task, advance=1, description=description)

    def done(self, metrics: dict[str, float], rounds: int, elapsed: float, note: str = "") -> None:
        if "test_acc" in metrics:
            self.console.print(
                f"[bold]done[/]: round {metrics['round']}/{rounds}, test_acc {metrics['test_acc']:.4f}"
                f"{note}, {elapsed:.1f} s; run directory {self.run_dir}",
                soft_wrap=True,  # one line however narrow the terminal (or 80 columns off one)
            )
