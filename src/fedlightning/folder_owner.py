"""Whose client-state folder this is, by identity, not by path (README, "Many clients and
reliability").

A run's ``client_state`` folder holds files its checkpoints need, and a new run deletes every
state file its own (empty) state does not use. The path says nothing about whose folder it is: a
bind mount shows a finished run's folder under a new run directory, with no symbolic link to
refuse. So the folder carries ``.fedlightning.owner``: the device and inode of the folder and of
the run directory that holds it, written when a run takes the folder. Another run directory
that reaches that same folder (same device and inode: a bind mount, or the folder moved into it)
is refused before anything is written or deleted. A copy is a new folder (another inode): the
record is stale and the run that takes the copy writes its own. A folder that moved with its run
directory keeps both identities and stays that run's. A folder without the file (written before
it existed) is taken as it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fedlightning.errors import ConfigurationError

OWNER_NAME = ".fedlightning.owner"


def _identity(path: Path) -> list[int]:
    """``[device, inode]`` of ``path`` (followed if it is a link)."""
    stat = os.stat(path)
    return [stat.st_dev, stat.st_ino]


def other_owner(folder: Path, run_dir: Path) -> str | None:
    """The run directory (as its run recorded it) whose ``folder`` this is, when it is not
    ``run_dir``: the folder is the one that run took (same device and inode) and ``run_dir`` is
    another directory. None when the folder is ``run_dir``'s, a copy, unclaimed or absent, or a
    symbolic link (refused by path where it matters: :meth:`~fedlightning.state.disk.DiskStates.
    check`, naming the link)."""
    if folder.is_symlink():
        return None
    try:
        record = json.loads((folder / OWNER_NAME).read_text())
        here, parent = _identity(folder), _identity(run_dir)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("folder") != here:
        return None
    if record.get("run_dir") == parent:
        return None
    return str(record.get("run_dir_path", "another run directory"))


def refuse_other_owner(folder: Path, run_dir: Path, option: str) -> None:
    """A ConfigurationError naming ``folder`` and the run directory it belongs to, if another
    run's (:func:`other_owner`); ``option`` names where the folder comes from."""
    owner = other_owner(folder, run_dir)
    if owner is None:
        return
    raise ConfigurationError(
        f"{option}: the client state folder {str(folder)!r} is the client state folder of the "
        f"run in {owner!r} (the same folder, by device and inode, reached from "
        f"{str(run_dir)!r} through a bind mount or moved here), and this run would delete that "
        "run's state files: unmount or move it back, or choose another loop.run_dir"
    )


def take(folder: Path, run_dir: Path) -> None:
    """Record ``run_dir`` as ``folder``'s owner (both must exist), unless it is recorded so."""
    record = {
        "folder": _identity(folder),
        "run_dir": _identity(run_dir),
        "run_dir_path": str(run_dir.resolve()),
    }
    path = folder / OWNER_NAME
    try:
        if json.loads(path.read_text()) == record:
            return
    except (OSError, ValueError):
        pass
    temporary = folder / f"{OWNER_NAME}.tmp-{os.getpid()}"
    temporary.write_text(json.dumps(record) + "\n")
    os.replace(temporary, path)
