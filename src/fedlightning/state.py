"""ClientStore: per-client persistent state across rounds (SCAFFOLD's c_i, MOON's previous model,
FML's personal model and optimizer). Kept on CPU and saved in every checkpoint."""

from __future__ import annotations

from typing import Any

import torch


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


class ClientStore:
    """A mapping ``client_id -> dict`` of state that a client objective keeps between its rounds.

    ``get`` returns an empty dict for a client that has no state yet. ``put`` copies tensors to CPU
    so that nothing stays on the accelerator between rounds.
    """

    def __init__(self) -> None:
        self._states: dict[int, dict[str, Any]] = {}

    def get(self, client_id: int) -> dict[str, Any]:
        return self._states.get(client_id, {})

    def put(self, client_id: int, state: dict[str, Any]) -> None:
        if state:
            self._states[client_id] = _to_cpu(state)
        else:
            self._states.pop(client_id, None)

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._states

    def state_dict(self) -> dict[int, dict[str, Any]]:
        return self._states

    def load_state_dict(self, states: dict[int, dict[str, Any]]) -> None:
        self._states = {int(k): _to_cpu(v) for k, v in states.items()}
