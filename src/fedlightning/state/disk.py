"""The ClientStore's disk tier: each client's state in its own versioned file, the checkpoint
naming one version of the whole folder, the folder owned by one run.

Every ``put`` writes a new file ``<client>.<version>.<digest>.pt`` (``version`` counts the puts of
the run; ``digest``, 16 hex digits, is the BLAKE2b-64 of the file's bytes; a client whose state is
cleared gets an empty ``<client>.<version>.none``), never overwriting one. A file holds its
client's id beside the state, and every read checks both the digest and the id: a file changed,
swapped with another client's or copied in from another run is an error naming it, never state
trained on. A checkpoint holds only :meth:`DiskStates.state_dict`: the newest version ``V``, how
many clients hold state and a digest of their ``(client, version, content digest)`` triples;
whatever the number of clients, a few bytes. The state at ``V`` is, for each client, its newest
file of version ``<= V`` (none, or a ``.none``: no state). So the folder holds every checkpoint's
state as long as the files it needs are kept:

- a file superseded by version ``v`` is deleted only by :meth:`DiskStates.commit` once a
  checkpoint of version ``>= v`` is durable (a ``.none`` goes with the file it hides), so a run
  killed at any moment, even during ``commit``, finds the files of its last checkpoint;
- files of versions above the checkpoint's (written by a run killed before its next checkpoint)
  are never part of a state: :meth:`DiskStates.open`, before the first round, deletes them, and
  every other file no state needs, before their version numbers are written again;
- resuming reads the folder's file names once (:meth:`DiskStates.load_state_dict`) and compares
  the count and digest with the checkpoint's: a folder that does not hold the checkpoint's state
  (files deleted or replaced since, another run's folder) is refused, never resumed with wrong
  state.

The folder belongs to one run: :meth:`DiskStates.open` refuses a folder that is a symbolic link
(another run's folder reached through a link) or that another run directory owns (the same
folder by device and inode, reached through a bind mount: :mod:`fedlightning.folder_owner`), and
takes its lock (:mod:`fedlightning.folder_lock`) for the run's life, so a second live run
reaching the folder another way is refused, naming it, before it deletes anything;
:meth:`DiskStates.check` says the same before anything is written. Per round this costs one file per stateful client trained
(serialized in memory, hashed, written in one plain write: a full disk is "no space left on the
device" naming the folder) and the deletion of the files it superseded; memory holds two 64-bit
integers per client id (its live version and content digest). Files are not fsynced: a killed
process loses nothing the kernel has, a power failure may.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlightning.errors import ConfigurationError, StorageError, storage_error
from fedlightning.folder_lock import FolderLock, lock_holder
from fedlightning.folder_owner import refuse_other_owner, take
from fedlightning.placement import to_cpu

#: ``<client>.<version>.<digest>.pt`` (a state) or ``<client>.<version>.none`` (its state cleared)
FILE_NAME = re.compile(r"(\d+)\.(\d+)\.(?:([0-9a-f]{16})\.pt|none)")
#: what a checkpoint's disk state says of the files it names (older ones carry no content digest)
FORMAT = "content-digest-1"
OPTION = "loop.client_state"


def content_digest(data: bytes | memoryview) -> int:
    """The 64-bit BLAKE2b digest of a state file's bytes."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def entry_hash(client_id: int, version: int, digest: int) -> int:
    """A 64-bit hash of one ``(client, version, content digest)`` triple; the folder's digest is
    their XOR."""
    text = f"{client_id}.{version}.{digest:016x}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class DiskStates:
    """Client states as versioned files under ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._version = 0  # the newest version written (or loaded)
        self._live = np.zeros(0, dtype=np.int64)  # client id -> version of its state (0: none)
        self._sums = np.zeros(0, dtype=np.uint64)  # client id -> content digest of that file
        self._count = 0  # clients with state
        self._digest = 0  # XOR of entry_hash over the live (client, version, digest) triples
        #: (version, file): deleted once a checkpoint of at least that version is durable
        self._superseded: deque[tuple[int, str]] = deque()
        self._lock = FolderLock(self.directory)

    # -- reading and writing states ---------------------------------------------------------------
    def version_of(self, client_id: int) -> int:
        return int(self._live[client_id]) if 0 <= client_id < len(self._live) else 0

    def _file(self, client_id: int) -> Path:
        digest = int(self._sums[client_id])
        return self.directory / f"{client_id}.{self.version_of(client_id)}.{digest:016x}.pt"

    def get(self, client_id: int) -> dict[str, Any]:
        if not self.version_of(client_id):
            return {}
        path = self._file(client_id)
        changed = "was the client_state folder changed by another process? resume from last.ckpt"
        try:
            data = path.read_bytes()
            if content_digest(data) != int(self._sums[client_id]):
                raise StorageError(
                    f"client {client_id}'s state file {str(path)!r} does not hold what this run "
                    f"wrote (its content digest differs); {changed}"
                )
            record = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError) as error:
            raise StorageError(
                f"client {client_id}'s state file {str(path)!r} cannot be read "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                f"{changed}"
            ) from None
        if record.get("client") != client_id:
            raise StorageError(
                f"client {client_id}'s state file {str(path)!r} holds client "
                f"{record.get('client')}'s state; {changed}"
            )
        return record["state"]

    def put(self, client_id: int, state: dict[str, Any]) -> None:
        old = self.version_of(client_id)
        if not state and not old:
            return
        version = self._version + 1
        digest = 0
        if state:
            buffer = io.BytesIO()  # serialized in memory: a full disk is one plain write's OSError
            torch.save({"client": client_id, "state": to_cpu(state)}, buffer)
            digest = content_digest(buffer.getbuffer())
            name = f"{client_id}.{version}.{digest:016x}.pt"
        else:
            name = f"{client_id}.{version}.none"
        path = self.directory / name
        try:
            if not self._lock.held:  # a store used on its own (an opened run's folder exists)
                self.directory.mkdir(parents=True, exist_ok=True)
            path.write_bytes(buffer.getbuffer() if state else b"")
        except OSError as error:
            path.unlink(missing_ok=True)
            raise storage_error(
                error, self.directory, f"write client {client_id}'s state"
            ) from None
        self._version = version
        if old:  # _file still names the old version's file here
            self._digest ^= entry_hash(client_id, old, int(self._sums[client_id]))
            self._superseded.append((version, self._file(client_id).name))
        if state:
            self._digest ^= entry_hash(client_id, version, digest)
            self._count += not old
        else:  # the .none hides the old file until a checkpoint without it is durable
            self._count -= 1
            self._superseded.append((version, name))
        self._grow(client_id + 1)
        self._live[client_id] = version if state else 0
        self._sums[client_id] = digest

    def _grow(self, size: int) -> None:
        if size <= len(self._live):
            return
        size = max(size, 2 * len(self._live))
        self._live = np.concatenate([self._live, np.zeros(size - len(self._live), np.int64)])
        self._sums = np.concatenate([self._sums, np.zeros(size - len(self._sums), np.uint64)])

    def __len__(self) -> int:
        return self._count

    def client_ids(self) -> list[int]:
        return np.flatnonzero(self._live).tolist()

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: the version, the count and the digest (a few bytes)."""
        return {
            "mode": "disk", "format": FORMAT, "version": self._version, "clients": self._count,
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
        """The state at the checkpoint's version, read from the folder's file names and checked
        against the checkpoint's count and digest (a ConfigurationError if the folder does not
        hold it)."""
        if state.get("format") != FORMAT:
            raise ConfigurationError(
                "the checkpoint's disk client state was written by an older fedlightning, whose "
                "state files carry no content digest: resume it with that version, or start anew"
            )
        newest: dict[int, tuple[int, int | None]] = {}  # per client, its newest file <= version
        for cid, version, digest in self._scan():
            if newest.get(cid, (0, None))[0] < version <= state["version"]:
                newest[cid] = (version, digest)
        live = {cid: (v, d) for cid, (v, d) in newest.items() if d is not None}  # .none: no state
        folder = 0
        for cid, (version, digest) in live.items():
            folder ^= entry_hash(cid, version, digest)
        if (len(live), f"{folder:016x}") != (state["clients"], state["digest"]):
            raise ConfigurationError(
                f"the client_state folder {str(self.directory)!r} does not hold this checkpoint's "
                f"client states ({state['clients']} clients with state, digest {state['digest']}; "
                f"found {len(live)}, digest {folder:016x}): its files were deleted, replaced or "
                "changed since (by a later run in this directory, or this is another run's "
                "folder); resume from the run's own last.ckpt"
            )
        self._version, self._count, self._digest = int(state["version"]), len(live), folder
        size, ids = max(live, default=-1) + 1, list(live)
        self._live = np.zeros(size, dtype=np.int64)
        self._sums = np.zeros(size, dtype=np.uint64)
        self._live[ids] = [version for version, _ in live.values()]
        self._sums[ids] = np.array([digest for _, digest in live.values()], dtype=np.uint64)
        self._superseded.clear()

    # -- the folder's owner -------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse (ConfigurationError naming the folder) a folder this run cannot own: a
        symbolic link, another run directory's folder reached from here (a bind mount:
        :mod:`fedlightning.folder_owner`), or one locked by another live run. Only reads."""
        if self.directory.is_symlink():
            raise ConfigurationError(
                f"{OPTION}='disk' keeps client state in {str(self.directory)!r}, which is a "
                f"symbolic link (to {os.path.realpath(self.directory)!r}): a run's client state "
                "folder is its own, never shared through a link; remove the link or choose "
                "another loop.run_dir"
            )
        refuse_other_owner(self.directory, self.directory.parent, f"{OPTION}='disk'")
        holder = lock_holder(self.directory)
        if holder is not None and not self._lock.held:
            raise self._in_use(holder)

    def _in_use(self, holder: str) -> ConfigurationError:
        return ConfigurationError(
            f"{OPTION}='disk': the client state folder {str(self.directory)!r} is in use by "
            f"another run (pid {holder}): wait for it to end or choose another loop.run_dir"
        )

    def open(self) -> None:
        """Before the first round: take the folder (:meth:`check`, then its lock, held until
        :meth:`close`, and its owner record) and delete every state file that the loaded state
        (none for a new run) does not use: files of a run killed before its next checkpoint,
        superseded versions, ``.none`` files (after the files they hide)."""
        self.check()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            holder = self._lock.acquire()
        except OSError as error:
            raise storage_error(error, self.directory, "create the client state folder") from None
        if holder is not None:
            raise self._in_use(holder)
        try:
            take(self.directory, self.directory.parent)
        except OSError as error:
            raise storage_error(error, self.directory, "record the folder's owner") from None
        stale = [
            (cid, version, digest)
            for cid, version, digest in self._scan()
            if digest is None or self.version_of(cid) != version or int(self._sums[cid]) != digest
        ]
        for cid, version, digest in sorted(stale, key=lambda entry: entry[2] is None):
            suffix = "none" if digest is None else f"{digest:016x}.pt"  # .none files last
            (self.directory / f"{cid}.{version}.{suffix}").unlink(missing_ok=True)

    def close(self) -> None:
        """Release the folder's lock (the run ended)."""
        self._lock.release()

    def _scan(self) -> Iterator[tuple[int, int, int | None]]:
        """``(client, version, content digest or None for a .none)`` of every state file in the
        folder, one at a time (a list of them would be a Python tuple per client: ~13 MB at
        100,000 clients)."""
        if not self.directory.is_dir():
            return
        with os.scandir(self.directory) as entries:
            for entry in entries:
                match = FILE_NAME.fullmatch(entry.name)
                if match:
                    digest = int(match[3], 16) if match[3] else None
                    yield int(match[1]), int(match[2]), digest
