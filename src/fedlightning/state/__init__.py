"""ClientStore: per-client persistent state across rounds (SCAFFOLD's c_i, MOON's previous model,
FML's personal model and optimizer). Kept off the accelerator, in memory or on disk, and part of
every checkpoint: in memory, the states themselves; on disk, a version of the folder that holds
them (:mod:`fedlightning.state.disk`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedlightning.errors import ConfigurationError
from fedlightning.placement import to_cpu
from fedlightning.state.disk import DiskStates


class ClientStore:
    """A mapping ``client_id -> dict`` of state that a client objective keeps between its rounds.

    ``get`` returns an empty dict for a client that has no state yet; ``put`` copies tensors to
    CPU so that nothing stays on the accelerator between rounds.

    ``mode="disk"`` keeps each client's state in its own file under ``directory`` and, in memory,
    two integers per client (:class:`~fedlightning.state.disk.DiskStates`): memory and checkpoints
    stay the same size however many clients hold state. Files are never overwritten in place:
    every ``put`` writes a new version, and :meth:`commit` (called once a checkpoint is safely
    written) deletes the versions that checkpoint no longer needs, so a run killed at any moment
    finds the files its last checkpoint names. :meth:`open` (the loop calls it before the first
    round, under the run directory's lock) takes the folder's own lock until :meth:`close` and
    deletes the files of a run killed before its next checkpoint; each file carries its client's
    id and is checked against its content digest when read.

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
        self._disk = DiskStates(self.directory) if mode == "disk" else None

    def get(self, client_id: int) -> dict[str, Any]:
        if self._disk is not None:
            return self._disk.get(client_id)
        return self._states.get(client_id, {})

    def put(self, client_id: int, state: dict[str, Any]) -> None:
        if self._disk is not None:
            self._disk.put(client_id, state)
        elif state:
            self._states[client_id] = to_cpu(state, copy=True)
        else:
            self._states.pop(client_id, None)

    def __len__(self) -> int:
        return len(self._disk) if self._disk is not None else len(self._states)

    def client_ids(self) -> list[int]:
        """The clients that hold state, in increasing order."""
        return self._disk.client_ids() if self._disk is not None else sorted(self._states)

    def __contains__(self, client_id: object) -> bool:
        if self._disk is not None:
            return isinstance(client_id, int | np.integer) and self._disk.version_of(client_id) > 0
        return client_id in self._states

    def check(self) -> None:
        """At start-up, before anything is written (disk mode): refuse a folder this run cannot
        own (a symbolic link, or one another live run holds), naming it."""
        if self._disk is not None:
            self._disk.check()

    def open(self) -> None:
        """Before the first round (disk mode): take the folder's lock for the run and delete the
        state files no checkpoint needs."""
        if self._disk is not None:
            self._disk.open()

    def close(self) -> None:
        """When the run ends (disk mode): release the folder's lock."""
        if self._disk is not None:
            self._disk.close()

    def commit(self, state: dict[str, Any] | None = None) -> None:
        """Once the checkpoint holding ``state`` (a :meth:`state_dict`; default: the current
        state) is durable, delete the state files it no longer needs (disk mode)."""
        if self._disk is not None:
            self._disk.commit(state)

    def state_dict(self) -> dict[str, Any]:
        """Memory mode: all states (a snapshot of the mapping, the states are never changed in
        place). Disk mode: the version of the folder (:meth:`DiskStates.state_dict`)."""
        if self._disk is not None:
            return self._disk.state_dict()
        return {"mode": "memory", "states": dict(self._states)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mode"] != self.mode:
            raise ConfigurationError(
                f"checkpoint holds client_state={state['mode']!r} but this run uses {self.mode!r}: "
                "resume with the same client_state"
            )
        if self._disk is not None:
            self._disk.load_state_dict(state)
            return
        self._states = {int(k): to_cpu(v, copy=True) for k, v in state["states"].items()}
