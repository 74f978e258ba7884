"""A folder owned by one live run: ``fcntl.flock`` on ``<folder>/.fedlightning.lock``.

The lock file holds the holder's pid; the kernel releases the lock when the process exits,
however it exits, so a lock left by a crashed run is stale and never blocks the next one. The run
directory (:mod:`fedlightning.loop.rundir`) and the disk client-state folder
(:mod:`fedlightning.state.disk`) are each locked this way for the life of their run.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

LOCK_NAME = ".fedlightning.lock"


def lock_holder(folder: Path) -> str | None:
    """The pid (as written in the lock file) of a live process holding ``folder``'s lock, else
    None. Only reads: a shared, non-blocking probe of the lock file, if there is one."""
    try:
        handle = open(folder / LOCK_NAME)  # noqa: SIM115 (read-only probe, closed below)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None
    finally:
        handle.close()


class FolderLock:
    """The exclusive lock of one folder, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._handle: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._handle is not None

    def acquire(self) -> str | None:
        """Take the lock (the folder must exist) and write this process's pid into it; return
        None, or, when another process holds it, that process's pid (nothing taken). Raises the
        OSError of a lock file that cannot be opened."""
        if self._handle is not None:
            return None
        handle = open(self.folder / LOCK_NAME, "a+")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            return holder
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle
        return None

    def replaced(self) -> bool:
        """Whether the folder was removed (or replaced) since :meth:`acquire`: the lock file this
        process holds open is no longer the one at the folder's path."""
        if self._handle is None:
            return False
        try:
            here = os.stat(self.folder / LOCK_NAME)
        except OSError:
            return True
        held = os.fstat(self._handle.fileno())
        return (here.st_dev, here.st_ino) != (held.st_dev, held.st_ino)

    def release(self) -> None:
        if self._handle is None:
            return
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None
