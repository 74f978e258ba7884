"""The ClientStore's disk tier: each client's state in its own versioned file, the checkpoint
naming one version of the whole folder.

Every ``put`` writes a new file ``<client>.<version>.pt`` (``version`` counts the puts of the run;
a client whose state is cleared gets an empty ``<client>.<version>.none``), never overwriting one.
A checkpoint holds only :meth:`DiskStates.state_dict`: the newest version ``V``, how many clients
hold state and a digest of their ``(client, version)`` pairs; whatever the number of clients, a
few bytes. The state at ``V`` is, for each client, its newest file of version ``<= V`` (none, or a
``.none``: no state). So the folder holds every checkpoint's state as long as the files it needs
are kept:

- a file superseded by version ``v`` is deleted only by :meth:`DiskStates.commit` once a
  checkpoint of version ``>= v`` is durable (a ``.none`` goes with the file it hides), so a run
  killed at any moment, even during ``commit``, finds the files of its last checkpoint;
- files of versions above the checkpoint's (written by a run killed before its next checkpoint)
  are never part of a state: :meth:`DiskStates.open`, under the run directory's lock before the
  first round, deletes them, and every other file no state needs, before their version numbers
  are written again;
- resuming reads the folder once (:meth:`DiskStates.load_state_dict`) and compares the count and
  digest with the checkpoint's: a folder that does not hold the checkpoint's state (files deleted
  since, another run's folder) is refused, never resumed with wrong state.

Per round this costs one file per stateful client trained and the deletion of the files it
superseded; memory holds one int64 per client id (its live version). Files are not fsynced: a
killed process loses nothing the kernel has, a power failure may.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlightning.errors import ConfigurationError, StorageError
from fedlightning.placement import to_cpu

#: ``<client>.<version>.pt`` (a state) or ``<client>.<version>.none`` (its state cleared)
FILE_NAME = re.compile(r"(\d+)\.(\d+)\.(pt|none)")


def entry_hash(client_id: int, version: int) -> int:
    """A 64-bit hash of one ``(client, version)`` pair; the digest is their XOR."""
    digest = hashlib.blake2b(f"{client_id}.{version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class DiskStates:
    """Client states as versioned files under ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._version = 0  # the newest version written (or loaded)
        self._live = np.zeros(0, dtype=np.int64)  # client id -> version of its state (0: none)
        self._count = 0  # clients with state
        self._digest = 0  # XOR of entry_hash over the live (client, version) pairs
        #: (version, file): deleted once a checkpoint of at least that version is durable
        self._superseded: deque[tuple[int, str]] = deque()

    # -- reading and writing states ---------------------------------------------------------------
    def version_of(self, client_id: int) -> int:
        return int(self._live[client_id]) if 0 <= client_id < len(self._live) else 0

    def get(self, client_id: int) -> dict[str, Any]:
        version = self.version_of(client_id)
        if not version:
            return {}
        path = self.directory / f"{client_id}.{version}.pt"
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError) as error:
            raise StorageError(
                f"client {client_id}'s state file {str(path)!r} cannot be read "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                "was the run directory changed by another process? resume from last.ckpt"
            ) from None

    def put(self, client_id: int, state: dict[str, Any]) -> None:
        old = self.version_of(client_id)
        if not state and not old:
            return
        version = self._version + 1
        name = f"{client_id}.{version}.{'pt' if state else 'none'}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if state:
                torch.save(to_cpu(state, copy=True), self.directory / name)
            else:
                (self.directory / name).touch()
        except (OSError, RuntimeError) as error:
            (self.directory / name).unlink(missing_ok=True)
            raise StorageError(
                f"could not write client {client_id}'s state in {str(self.directory)!r}: "
                f"{str(error).splitlines()[0] if str(error) else type(error).__name__}"
            ) from None
        self._version = version
        if old:
            self._digest ^= entry_hash(client_id, old)
            self._superseded.append((version, f"{client_id}.{old}.pt"))
        if state:
            self._digest ^= entry_hash(client_id, version)
            self._count += not old
        else:  # the .none hides the old file until a checkpoint without it is durable
            self._count -= 1
            self._superseded.append((version, name))
        if client_id >= len(self._live):
            grown = np.zeros(max(client_id + 1, 2 * len(self._live)), dtype=np.int64)
            grown[: len(self._live)] = self._live
            self._live = grown
        self._live[client_id] = version if state else 0

    def __len__(self) -> int:
        return self._count

    def client_ids(self) -> list[int]:
        return np.flatnonzero(self._live).tolist()

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: the version, the count and the digest (a few bytes)."""
        return {
            "mode": "disk", "version": self._version, "clients": self._count,
            "digest": f"{self._digest:016x}",
        }  # fmt: skip

    def commit(self, state: dict[str, Any] | None = None) -> None:
        """Delete the files superseded up to the version of ``state`` (a :meth:`state_dict`;
        default: the current version), to be called once the checkpoint holding it is durable."""
        durable = self._version if state is None else int(state["version"])
        while self._superseded and self._superseded[0][0] <= durable:
            _, name = self._superseded.popleft()
            (self.directory / name).unlink(missing_ok=True)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state at the checkpoint's version, read from the folder and checked against the
        checkpoint's count and digest (a ConfigurationError if the folder does not hold it)."""
        if "files" in state:  # written before checkpoints named a version: an index of files
            files = {int(k): str(v) for k, v in state["files"].items()}
            missing = [n for n in files.values() if not (self.directory / n).is_file()]
            if missing:
                raise ConfigurationError(
                    f"client state files {missing[:5]} are missing from {str(self.directory)!r}: "
                    "this checkpoint cannot be resumed here (its client_state folder was changed)"
                )
            live = {cid: int(name.split(".")[1]) for cid, name in files.items()}
        else:
            newest: dict[int, tuple[int, str]] = {}  # per client, its newest file <= the version
            for cid, version, kind in self._scan():
                if newest.get(cid, (0, ""))[0] < version <= state["version"]:
                    newest[cid] = (version, kind)
            live = {cid: version for cid, (version, kind) in newest.items() if kind == "pt"}
        digest = 0
        for cid, version in live.items():
            digest ^= entry_hash(cid, version)
        if "files" not in state and (len(live), f"{digest:016x}") != (
            state["clients"], state["digest"]
        ):  # fmt: skip
            raise ConfigurationError(
                f"the client_state folder {str(self.directory)!r} does not hold this checkpoint's "
                f"client states ({state['clients']} clients with state, digest {state['digest']}; "
                f"found {len(live)}, digest {digest:016x}): its files were deleted or changed "
                "since (by a later run in this directory, or this is another run's folder); "
                "resume from the run's own last.ckpt"
            )
        self._version, self._count, self._digest = int(state["version"]), len(live), digest
        self._live = np.zeros(max(live, default=-1) + 1, dtype=np.int64)
        self._live[list(live)] = list(live.values())
        self._superseded.clear()

    def open(self) -> None:
        """Before the first round, under the run directory's lock: delete every state file that
        the loaded state (none for a new run) does not use: files of a run killed before its next
        checkpoint, superseded versions, ``.none`` files (after the files they hide)."""
        stale = [
            f"{cid}.{version}.{kind}"
            for cid, version, kind in self._scan()
            if kind == "none" or self.version_of(cid) != version
        ]
        for name in sorted(stale, key=lambda name: name.endswith(".none")):  # .none files last
            (self.directory / name).unlink(missing_ok=True)

    def _scan(self) -> Iterator[tuple[int, int, str]]:
        """``(client, version, "pt" or "none")`` of every state file in the folder, one at a time
        (a list of them would be a Python tuple per client: ~13 MB at 100,000 clients)."""
        if not self.directory.is_dir():
            return
        with os.scandir(self.directory) as entries:
            for entry in entries:
                match = FILE_NAME.fullmatch(entry.name)
                if match:
                    yield int(match[1]), int(match[2]), match[3]
