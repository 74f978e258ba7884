"""``fedlightning fit ... --seeds S [S ...]`` as solid as one ``fit`` (:mod:`fedlightning.cli.runs`
runs the seeds): checked whole before the first seed trains, a failing seed named, and a sweep
stopped by SIGINT or SIGTERM at any seed saying what finished and the commands that finish it.

- :func:`check_sweep`: the options once, then every seed's (``loop.seed`` S, which also seeds the
  partition: a seed can leave a client without samples) and its run directory
  ``<run_dir>/seed_S`` (:func:`fedlightning.loop.rundir.check_run_dir`: a directory holding an
  earlier run's results is refused), before anything is trained or written.
- :class:`Sweep`: the seeds finished and running; :meth:`Sweep.reporting` turns what stops the
  sweep into one message: a failure names the seed and its run directory (and the seeds that
  finished), a signal becomes a :class:`~fedlightning.errors.RunInterrupted` whose lines name
  the seeds finished, then a command per seed with a checkpoint written by this sweep
  (``--loop.seed S --loop.run_dir RUN_DIR/seed_S --ckpt_path RUN_DIR/seed_S/last.ckpt``) and
  one for the seeds left (``--seeds ...``). Each command is a plain ``fit`` or ``--seeds`` that
  the options check accepts: the sweep's own ``--loop.run_dir`` is replaced, not repeated.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fedlightning.backends.ray import RayBackend
from fedlightning.cli.errors import configuration_error, one_line_error, without_option
from fedlightning.cli.fit import FederatedCLI
from fedlightning.errors import (
    ConfigurationError,
    PluginError,
    RunInterrupted,
    RunStopped,
    StorageError,
)
from fedlightning.loop.rundir import RESULT_FILES, check_run_dir
from fedlightning.signals import StopSignal, signal_number, stopped_by


@dataclass(frozen=True)
class SweepPlan:
    """What the checked options say about the sweep as a whole."""

    base: Path  # the run directory the seeds' ``seed_S`` folders go into
    plots: bool  # ``loop.plots``: draw ``seeds.png``
    ray: RayBackend | None  # the backend when it is Ray: the seeds run as Ray tasks


def seed_folder(base: Path, seed: int) -> Path:
    """``<base>/seed_<seed>``: where seed ``seed``'s run goes."""
    return base / f"seed_{seed}"


def check_sweep(args: Sequence[str], seeds: Sequence[int], sweep: Sweep) -> SweepPlan:
    """Check the options (``args``: ``fit`` and its arguments), then each seed's options and run
    directory, naming the seed that is refused; nothing is trained or written."""
    plan = FederatedCLI(args=list(args[1:]), run=False)
    loop = plan.trainer
    result = SweepPlan(
        loop.options.run_dir, loop.reporter.plots,
        loop.backend if isinstance(loop.backend, RayBackend) else None,
    )  # fmt: skip
    del plan, loop  # its data module: no copy of the data set held through the sweep
    sweep.base = result.base
    for seed in seeds:
        with sweep.running_seeds(seed):
            cli = FederatedCLI(
                args=[*args[1:], "--loop.seed", str(seed)], run=False,
                subdirectory=f"seed_{seed}",
            )  # fmt: skip
            options = cli.trainer.options
            if not options.overwrite:
                sweep.refuse_results(seed)
            check_run_dir(options.run_dir, overwrite=options.overwrite)
            cli.datamodule.setup("fit")  # the seed's partition
    return result


@dataclass
class Sweep:
    """The seeds of one ``--seeds`` command as they run (see the module docstring).

    Args:
        args: ``fit`` and its arguments, without ``--seeds``.
        seeds: the seeds, in order.
        base: the run directory the seeds' folders go into (known once the options are read).
    """

    args: list[str]
    seeds: list[int]
    base: Path | None = None
    finished: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    began: bool = False  # a seed has started training (before: only checks ran)
    started: float = field(default_factory=time.time)

    @contextmanager
    def running_seeds(self, *seeds: int) -> Iterator[None]:
        """Within the block, ``seeds`` run: what fails or stops there is theirs (an exception
        leaves them named for :meth:`reporting`)."""
        self.running = list(seeds)
        yield
        self.running = []

    @contextmanager
    def reporting(self) -> Iterator[None]:
        """Within the block, a failure names its seed and a signal names what resumes the
        sweep (module docstring)."""
        try:
            yield
        except (KeyboardInterrupt, StopSignal) as stop:
            raise self.interrupted(stop) from None
        except Exception as error:
            named = self.named(error)
            if named is None:  # a traceback: the note says which seed it came from
                error.add_note(f"(in {self._which()})")
                raise
            raise named from None

    def _which(self) -> str:
        """``seed 1 (runs/x/seed_1) of --seeds 0 1 2; seed 0 finished``."""
        where = ", ".join(
            f"seed {s}" + (f" ({seed_folder(self.base, s)})" if self.base else "")
            for s in self.running
        )
        listed = " ".join(str(s) for s in self.seeds)
        done = f"; {self._finished()}" if self.finished else ""
        return f"{where or 'the sweep'} of --seeds {listed}{done}"

    def _finished(self) -> str:
        folders = ", ".join(str(seed_folder(self.base, s)) for s in self.finished if self.base)
        seeds = ", ".join(str(s) for s in self.finished)
        return f"seed{'s' * (len(self.finished) > 1)} {seeds} finished ({folders})"

    def named(self, error: Exception) -> Exception | None:
        """``error`` with its seed named in front of its one-line message, or None when the CLI
        would not print it in one line."""
        which = f"{self._which()}: " if self.running or self.finished else ""
        if isinstance(error, RunStopped | PluginError | StorageError):
            return type(error)(f"{which}{error}")
        cause = configuration_error(error) or one_line_error(error)
        return None if cause is None else ConfigurationError(f"{which}{cause}")

    def interrupted(self, stop: BaseException) -> RunInterrupted:
        """The stop of the whole sweep by ``stop``'s signal: one line on where it stopped, then
        the commands that finish the seeds left."""
        signum = signal_number(stop)
        how = stopped_by(signum)
        if not self.began:  # still checking: nothing was written
            return RunInterrupted(f"{how} during start-up: nothing was written", signum)
        line = f"--seeds {' '.join(map(str, self.seeds))} {how}"
        if self.running:
            line += f" in seed{'s' * (len(self.running) > 1)} {', '.join(map(str, self.running))}"
            if isinstance(stop, RunInterrupted) and len(self.running) == 1:
                line += (
                    f" after its round {stop.rounds}"
                    if stop.rounds
                    else ", before its first checkpoint"
                )
        lines = [line + (f"; {self._finished()}" if self.finished else "")]
        left = [s for s in self.seeds if s not in self.finished]
        resumable = [s for s in self.running if self._checkpointed(s)]
        lines += [f"to resume seed {s}: {self._resume_command(s)}" for s in resumable]
        rest = [str(s) for s in left if s not in resumable]
        if rest:
            command = shlex.join(["fedlightning", *self.args, "--seeds", *rest])
            then = "then " if resumable else ""
            lines.append(f"{then}to run seed{'s' * (len(rest) > 1)} {' '.join(rest)}: {command}")
        return RunInterrupted("\n".join(lines), signum)

    def refuse_results(self, seed: int) -> None:
        """Refuse seed ``seed``'s folder when it holds a run's results: a sweep starts every
        seed afresh (the advice: the command that resumes that seed alone, when it can)."""
        folder = seed_folder(self.base, seed)
        results = [name for name in RESULT_FILES if (folder / name).exists()]
        if not results:
            return
        resume = ""
        if (folder / "last.ckpt").is_file():
            resume = f"; or resume that seed on its own: {self._resume_command(seed)}"
        raise ConfigurationError(
            f"loop.run_dir={str(folder)!r} already holds another run's results "
            f"({', '.join(results)}), and --seeds starts every seed afresh: replace them with "
            f"--loop.overwrite true, or choose another --loop.run_dir{resume}"
        )

    def _checkpointed(self, seed: int) -> bool:
        """Whether seed ``seed`` has a checkpoint this sweep wrote (an older one, in a folder
        told to be overwritten that a queued Ray task did not reach, does not count; 2 s for
        file systems that keep coarse times)."""
        checkpoint = seed_folder(self.base, seed) / "last.ckpt"
        return checkpoint.is_file() and checkpoint.stat().st_mtime >= self.started - 2

    def _resume_command(self, seed: int) -> str:
        folder = seed_folder(self.base, seed)
        kept = without_option(self.args, "--loop.run_dir")
        return shlex.join([
            "fedlightning", *kept, "--loop.seed", str(seed), "--loop.run_dir", str(folder),
            "--ckpt_path", str(folder / "last.ckpt"),
        ])  # fmt: skip
