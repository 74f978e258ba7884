"""The path a run's rounds took, recorded for a resume and said in the summary (docs/algorithms.md
section 9.3).

A run's path is whose numerics its client fits follow (``backend_results`` of
:mod:`fedlightning.loop.identity`: ``sequential`` or ``cohort`` fits...), on which device, with
how many CPU threads. ``loop.backend: auto`` may leave the cohort for sequential fits mid-run
(:meth:`fedlightning.backends.auto.AutoBackend.run`); so after every round this component writes
the path the round took into the run's identity, which every later checkpoint stores and a
resumed AutoBackend follows: a resume takes the path its checkpoint's last rounds took. It keeps
which rounds took which path (its checkpointed state, so the summary of a resumed run covers the
rounds before the resume) for the summary line::

    path: sequential fits in rounds 1-30 on cpu, 1 intra-op thread (AutoBackend: the rule for ...)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedlightning.backends import AutoBackend, Backend
from fedlightning.loop.identity import backend_results
from fedlightning.round_components import Round, RoundComponent


class RunPath(RoundComponent):
    """Records the path of each round (see the module docstring).

    Args:
        backend: the run's backend (an AutoBackend says what it chose and why).
        identity: the run's identity, whose ``backend_results`` this component keeps current.
        device: the device the run computes on.
    """

    name = "run_path"

    def __init__(self, backend: Backend, identity: dict[str, Any], device: torch.device) -> None:
        self.backend, self.identity, self.device = backend, identity, device
        #: ``[path, first round, last round]`` (1-based), in order
        self.segments: list[list[Any]] = []
        self.threads: int | None = None  # torch's intra-op threads in the rounds

    def on_round_end(self, round: Round) -> None:
        path = backend_results(self.backend)
        self.identity["backend_results"] = path  # what the next checkpoint records
        self.threads = torch.get_num_threads()  # inside the run's cpu_compute
        label = path if isinstance(path, str) else type(self.backend).__name__
        done = round.index + 1
        last = self.segments[-1] if self.segments else None
        if last is not None and last[0] == label and last[2] == done - 1:
            last[2] = done
        else:
            self.segments.append([label, done, done])

    def summary_lines(self) -> list[str]:
        if not self.segments:
            return []
        rounds = ", ".join(
            f"{path} fits in round{'s' if first < last else ''} "
            f"{first}{'-' + str(last) if first < last else ''}"
            for path, first, last in self.segments
        )
        threads = f", {self.threads} intra-op thread{'s' if self.threads != 1 else ''}"
        why = type(self.backend).__name__
        if isinstance(self.backend, AutoBackend):
            why += f": {self.backend.reason}"
        return [f"path: {rounds} on {self.device.type}{threads} ({why})"]

    def state_dict(self) -> dict[str, Any]:
        return {"segments": [list(segment) for segment in self.segments]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.segments = [list(segment) for segment in state.get("segments", [])]
