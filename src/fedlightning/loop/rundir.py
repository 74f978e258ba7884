"""Run directories that never lose data: checked before anything is written, locked for a run's life.

Policy (README "Run directories"): a run refuses a directory that already holds another run's
results (``metrics.csv``, ``last.ckpt``, ``global.pt``, ``models.pt``; CoFED's ``summary.json``) unless it resumes from a
checkpoint (``--ckpt_path``) or is told ``--loop.overwrite true`` (which deletes those results
first). We chose refusal over Lightning-style ``version_N`` folders so that a run directory keeps
naming exactly one run, and ``--ckpt_path <run_dir>/last.ckpt`` stays the way to continue it.

A run never overwrites (or, told to overwrite, deletes) a file fedlightning did not write. Its
``config.yaml`` starts with :data:`MARK` (:func:`write_marked`): a ``config.yaml`` without it is a
user's (``-c exp/config.yaml --loop.run_dir exp``) and the run is refused, whatever
``overwrite`` says. The other names a run writes (:data:`RUN_FILES`) are fedlightning's in a
directory where a run has run (it holds the lock file below) or that the run resumes from; in any
other directory they are a user's, and the run is refused.

The lock is ``fcntl.flock`` on ``<run_dir>/.fedlightning.lock`` (holding the holder's pid,
:mod:`fedlightning.folder_lock`): the kernel releases it when the process exits, however it exits,
so a lock left by a crashed run is stale and never blocks the next one. A second run on a locked
directory is refused at once with the holder's pid. A run directory removed while its run runs is
named as such (a :class:`~fedlightning.errors.StorageError`), not as the first file that failed.
:func:`check_run_dir` only reads (it probes the lock with a shared, read-only open);
:class:`RunDirectory` creates the directory and takes the lock after every start-up check passed.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from types import TracebackType

from fedlightning.errors import ConfigurationError, RunInterrupted, StorageError, storage_error
from fedlightning.folder_lock import LOCK_NAME, FolderLock, lock_holder
from fedlightning.folder_owner import refuse_other_owner
from fedlightning.signals import stopped_by

#: files whose presence means the directory holds a run's results
RESULT_FILES = (
    "metrics.csv", "last.ckpt", "global.pt", "models.pt", "summary.json", "participants.csv",
)  # fmt: skip
#: what ``overwrite`` deletes (results and the files a run writes beside them)
RUN_FILES = (
    *RESULT_FILES,
    "config.yaml",
    "partition.csv",
    "partition.png",
    "curves.png",
    "hparams.yaml",
    "pseudo_labels.csv",
    "relative_accuracy.png",
)
#: the first line of every config.yaml fedlightning writes, and of no other file
MARK = "# written by fedlightning"
#: a run needs at least this much free space in its directory's file system to start
MIN_FREE_BYTES = 16 * 2**20


def check_run_dir(
    run_dir: str | Path | None,
    option: str = "loop.run_dir",
    resuming: bool = False,
    overwrite: bool = False,
    min_free_bytes: int = MIN_FREE_BYTES,
    python: bool = False,
) -> Path:
    """Check ``run_dir`` can hold a new run, writing nothing; return it as a Path.

    Refused (:class:`ConfigurationError` naming ``option``): an empty path; a path that is a file
    or lies under one; a directory (or nearest existing parent) that is not writable or has less
    than ``min_free_bytes`` free; a directory locked by a live run; a directory holding another
    run's results unless ``resuming`` or ``overwrite`` (the advice is command-line options, or
    with ``python`` the Python API's arguments); a ``client_state`` folder that another run
    directory owns (:mod:`fedlightning.folder_owner`: a bind mount of a finished run's folder,
    which ``overwrite`` or a new run would empty).
    """
    if run_dir is None or not str(run_dir).strip():
        raise ConfigurationError(
            f"{option}={run_dir!r} is not allowed: expected a directory path (an empty path would "
            "write into the current folder)"
        )
    path = Path(run_dir)
    _refuse_long_names(path, option)
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        what = "is a file" if existing == path else f"lies under the file {str(existing)!r}"
        raise ConfigurationError(f"{option}={str(run_dir)!r} {what}: give a directory path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"{option}={str(run_dir)!r} is not writable ({str(existing)!r} is read-only for this "
            "user): choose a writable directory"
        )
    free = shutil.disk_usage(existing).free
    if free < min_free_bytes:
        raise ConfigurationError(
            f"{option}={str(run_dir)!r} has only {free / 2**20:.1f} MiB free on its file system "
            f"(a run needs at least {min_free_bytes / 2**20:.0f} MiB): free space or choose "
            "another directory"
        )
    holder = lock_holder(path)
    if holder is not None:
        raise ConfigurationError(
            f"{option}={str(run_dir)!r} is in use by another run (pid {holder}): wait for it to "
            "end or choose another directory"
        )
    _refuse_foreign(path, option, resuming, ran_here=(path / LOCK_NAME).exists())
    _refuse_results(path, option, resuming, overwrite, python)
    refuse_other_owner(path / "client_state", path, option)
    return path


def written_by_fedlightning(path: Path) -> bool:
    """Whether the file ``path`` starts with :data:`MARK`."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(MARK)) == MARK.encode()
    except OSError:
        return False


def write_marked(path: Path, text: str, what: str) -> Path:
    """Write ``text`` to ``path`` (a run's ``config.yaml``) after a :data:`MARK` line saying
    ``what`` it is."""
    path.write_text(f"{MARK} ({what})\n{text}")
    return path


def _refuse_foreign(path: Path, option: str, resuming: bool, ran_here: bool) -> None:
    """Refuse a directory holding a file of a run's names that fedlightning did not write (see
    the module docstring)."""
    config = path / "config.yaml"
    if config.is_file() and not written_by_fedlightning(config):
        raise ConfigurationError(
            f"{option}={str(path)!r} holds a config.yaml that fedlightning did not write (its "
            f"first line is not {MARK!r}), and a run writes its own config.yaml there: move your "
            "config out of the run directory (e.g. to configs/) and pass it with -c from there, "
            "or choose another directory"
        )
    foreign = [name for name in RUN_FILES if (path / name).exists()]
    if foreign and not (ran_here or resuming):
        raise ConfigurationError(
            f"{option}={str(path)!r} holds {', '.join(foreign)}, which no fedlightning run wrote "
            f"(no run has used this directory: it has no {LOCK_NAME}), and a run writes files of "
            "these names: move them out or choose another directory"
        )


#: the longest file name (one path component) Linux file systems allow, in bytes
NAME_MAX = 255


def _refuse_long_names(path: Path, option: str) -> None:
    for part in path.parts:
        if len(part.encode()) > NAME_MAX:
            raise ConfigurationError(
                f"{option}={str(path)[:60]!r}... is not allowed: its name {part[:30]!r}... is "
                f"{len(part.encode())} bytes long, more than the {NAME_MAX} bytes a file name may "
                "have; choose a shorter name"
            )


def _refuse_results(
    path: Path, option: str, resuming: bool, overwrite: bool, python: bool = False
) -> None:
    results = [name for name in RESULT_FILES if (path / name).exists()]
    if results and not (resuming or overwrite):
        # only a run with a checkpoint resumes (CoFED's one-shot runs have none)
        checkpoint = path / "last.ckpt" if (path / "last.ckpt").exists() else None
        held = f"{option}={str(path)!r} already holds another run's results ({', '.join(results)})"
        if python:  # FederatedLoop(run_dir=...).fit(...)
            resume = (
                f"resume it with fit(..., ckpt_path={str(checkpoint)!r}), " if checkpoint else ""
            )
            raise ConfigurationError(
                f"{held}: {resume}replace it with FederatedLoop(..., overwrite=True), or give "
                "FederatedLoop another run_dir"
            )
        flag = (
            "--overwrite" if option == "run_dir" else f"--{option.replace('run_dir', 'overwrite')}"
        )
        resume = f"resume it with --ckpt_path {checkpoint}, " if checkpoint else ""
        raise ConfigurationError(
            f"{held}: {resume}replace it with {flag} true, or choose another directory "
            f"(--{option} DIR)"
        )


def resumes_in(ckpt_path: str | Path, run_dir: str | Path) -> bool:
    """Whether ``ckpt_path`` lies in ``run_dir`` (a resume that continues that directory's run)."""
    return Path(ckpt_path).resolve().parent == Path(run_dir).resolve()


class RunDirectory:
    """Context manager: create ``path``, take its exclusive lock, delete old results if
    ``overwrite``; on exit release the lock, and if the run failed before writing anything,
    remove the directory it created.

    Raises :class:`ConfigurationError` when another process holds the lock and
    :class:`StorageError` when the directory cannot be created.
    """

    def __init__(
        self,
        path: Path,
        overwrite: bool = False,
        option: str = "loop.run_dir",
        resuming: bool = False,
    ) -> None:
        self.path = Path(path)
        self.overwrite = overwrite
        self.resuming = resuming
        self.option = option
        self._lock = FolderLock(self.path)
        self._created = False

    def __enter__(self) -> RunDirectory:
        self._created = not self.path.exists()
        ran_here = (self.path / LOCK_NAME).exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            holder = self._lock.acquire()
        except OSError as error:
            raise storage_error(error, self.path, "create the run directory") from None
        if holder is not None:
            raise ConfigurationError(
                f"{self.option}={str(self.path)!r} is in use by another run (pid {holder}): wait "
                "for it to end or choose another directory"
            )
        try:  # again under the lock: a run that ended since check_run_dir may have left results
            _refuse_foreign(self.path, self.option, self.resuming, ran_here)
            _refuse_results(self.path, self.option, self.resuming, self.overwrite)
            refuse_other_owner(self.path / "client_state", self.path, self.option)
        except ConfigurationError:
            self.__exit__(ConfigurationError, None, None)
            raise
        if self.overwrite:
            self.clear()
        return self

    def clear(self) -> None:
        """Delete a previous run's files (``overwrite``); other files in the directory stay."""
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.path / "client_state", ignore_errors=True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if not self._lock.held:
            return
        vanished = self._lock.replaced()
        failed_empty = (
            kind is not None
            and self._created
            and not vanished
            and {p.name for p in self.path.iterdir()} <= {LOCK_NAME}
        )
        if failed_empty:
            (self.path / LOCK_NAME).unlink(missing_ok=True)
        self._lock.release()
        if failed_empty:
            try:
                self.path.rmdir()
            except OSError:
                pass
        if vanished and kind is not None and issubclass(kind, Exception):
            raise StorageError(
                f"{self.option}={str(self.path)!r} was removed while the run was running (by "
                "another process): the run's files there are gone; start the run again"
            ) from None


def interrupted(
    last_checkpoint: tuple[int, str] | None, signum: int = signal.SIGINT
) -> RunInterrupted:
    """The message of a run stopped by ``signum`` (SIGINT: "interrupted", SIGTERM: "terminated
    (SIGTERM)"): after which round it stopped and the checkpoint that resumes it
    (``last_checkpoint`` is ``(rounds done, path)`` of the newest checkpoint, or None)."""
    how = stopped_by(signum)
    if last_checkpoint is None:
        return RunInterrupted(
            f"{how} before the first checkpoint was written: nothing to resume, start again",
            signum,
        )
    rounds, path = last_checkpoint
    return RunInterrupted(
        f"{how} after round {rounds}; resume with --ckpt_path {path}", signum, path, rounds
    )
