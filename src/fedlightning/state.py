"""ClientStore: per-client persistent state across rounds (SCAFFOLD's c_i, MOON's previous model,
FML's personal model and optimizer). Kept off the accelerator, in memory or on disk, and part of
every checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch

from fedlightning.errors import ConfigurationError, StorageError
from fedlightning.placement import to_cpu


class ClientStore:
    """A mapping ``client_id -> dict`` of state that a client objective keeps between its rounds.

    ``get`` returns an empty dict for a client that has no state yet; ``put`` copies tensors to
    CPU so that nothing stays on the accelerator between rounds.

    ``mode="disk"`` keeps only an index in memory and each client's state in its own file under
    ``directory``, so memory stays bounded with thousands of clients. Files are never overwritten
    in place: every ``put`` writes a new version and :meth:`commit` (called after a checkpoint is
    safely written) deletes the versions the checkpoint no longer references. A run killed
    mid-round therefore always finds the files its last checkpoint points to.

    Args:
        mode: ``memory`` or ``disk``.
        directory: where ``disk`` mode writes (required for it).
    """

    def __init__(
        self, mode: Literal["memory", "disk"] = "memory", directory: str | Path | None = None
    ) -> None:
        if mode not in ("memory", "disk"):
            raise ValueError(f"client_state must be 'memory' or 'disk', got {mode!r}")
        if mode == "disk" and directory is None:
            raise ValueError("a disk ClientStore needs a directory")
        self.mode = mode
        self.directory = Path(directory) if directory is not None else None
        self._states: dict[int, dict[str, Any]] = {}  # memory mode
        self._files: dict[int, str] = {}  # disk mode: client id -> file name
        self._version = 0

    def get(self, client_id: int) -> dict[str, Any]:
        if self.mode == "memory":
            return self._states.get(client_id, {})
        name = self._files.get(client_id)
        if name is None:
            return {}
        try:
            return torch.load(self.directory / name, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError) as error:
            raise StorageError(
                f"client {client_id}'s state file {str(self.directory / name)!r} cannot be read "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                "was the run directory changed by another process? resume from last.ckpt"
            ) from None

    def put(self, client_id: int, state: dict[str, Any]) -> None:
        if self.mode == "memory":
            if state:
                self._states[client_id] = to_cpu(state, copy=True)
            else:
                self._states.pop(client_id, None)
            return
        if not state:
            self._files.pop(client_id, None)
            return
        self._version += 1
        name = f"{client_id}.{self._version}.pt"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            torch.save(to_cpu(state, copy=True), self.directory / name)
        except (OSError, RuntimeError) as error:
            (self.directory / name).unlink(missing_ok=True)
            raise StorageError(
                f"could not write client {client_id}'s state in {str(self.directory)!r}: "
                f"{str(error).splitlines()[0] if str(error) else type(error).__name__}"
            ) from None
        self._files[client_id] = name

    def __len__(self) -> int:
        return len(self._states) if self.mode == "memory" else len(self._files)

    def client_ids(self) -> list[int]:
        """The clients that hold state, in increasing order."""
        return sorted(self._states if self.mode == "memory" else self._files)

    def __contains__(self, client_id: object) -> bool:
        return client_id in (self._states if self.mode == "memory" else self._files)

    def commit(self, written: dict[str, Any] | None = None) -> None:
        """Delete state files that neither the current index nor ``written`` (the
        :meth:`state_dict` of the checkpoint just written, which later rounds may have moved past)
        references (disk mode)."""
        if self.mode != "disk" or not self.directory.is_dir():
            return
        live = set(self._files.values()) | set((written or {}).get("files", {}).values())
        for entry in os.scandir(self.directory):
            if entry.name.endswith(".pt") and entry.name not in live:
                os.unlink(entry.path)

    def state_dict(self) -> dict[str, Any]:
        """Memory mode: all states. Disk mode: the index of state files (the files stay on disk)."""
        if self.mode == "memory":
            return {"mode": "memory", "states": self._states}
        return {"mode": "disk", "files": dict(self._files), "version": self._version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mode"] != self.mode:
            raise ConfigurationError(
                f"checkpoint holds client_state={state['mode']!r} but this run uses {self.mode!r}: "
                "resume with the same client_state"
            )
        if self.mode == "memory":
            self._states = {int(k): to_cpu(v, copy=True) for k, v in state["states"].items()}
            return
        self._files = {int(k): v for k, v in state["files"].items()}
        self._version = int(state["version"])
        missing = [n for n in self._files.values() if not (self.directory / n).is_file()]
        if missing:
            raise ConfigurationError(
                f"client state files {missing[:5]} are missing from {str(self.directory)!r}: "
                "this checkpoint cannot be resumed here (its client_state folder was changed)"
            )
