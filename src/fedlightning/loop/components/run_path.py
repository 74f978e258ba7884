"""The path a run's rounds took, recorded for a resume and said in the summary (docs/algorithms.md
section 9.3).

A run's path is whose numerics its client fits follow (``backend_results`` of
:mod:`fedlightning.loop.identity`: ``sequential`` or ``cohort`` fits...), on which device, with
how many CPU threads. ``loop.backend: auto`` may leave the cohort for sequential fits mid-run
(:meth:`fedlightning.backends.auto.AutoBackend.run`); so after every round this component writes
the path the round took into the run's identity, which every later checkpoint stores and a
resumed AutoBackend follows: a resume takes the path its checkpoint's last rounds took. It keeps
which rounds took which path (its declared state, ``segments``, so the summary of a resumed run
covers the rounds before the resume) for the summary line::

    path: sequential fits in rounds 1-30 on cpu, 1 intra-op thread (AutoBackend: the rule for ...)
"""

from __future__ import annotations

from typing import Any

import torch

from fedlightning.backends import (
    AutoBackend,
    Backend,
    CohortBackend,
    FlowerBackend,
    RayBackend,
    SequentialBackend,
)
from fedlightning.round_components import Round, RoundComponent
from fedlightning.run_config import plain


def backend_results(backend: Backend) -> Any:
    """Whose numerics ``backend``'s fits follow (``backend_results`` of :mod:`fedlightning.loop.identity`); an AutoBackend must
    have chosen (its ``check`` ran). Exact classes: a subclass may fit differently."""
    if type(backend) is AutoBackend and backend.chosen is not None:
        backend = backend.chosen
    family = {
        SequentialBackend: "sequential",
        RayBackend: "sequential",
        CohortBackend: "cohort",
        FlowerBackend: "flower",
    }.get(type(backend))
    return family if family is not None else plain(backend)  # unknown: any change is refused


class RunPath(RoundComponent):
    """Records the path of each round (see the module docstring). Always on, made by start-up
    once the run's identity and device are resolved
    (:func:`fedlightning.loop.components.closing_components`), right before the checkpoint
    writer.

    State: ``segments``, ``[path, first round, last round]`` (1-based), in order.

    Args:
        backend: the run's backend (an AutoBackend says what it chose and why).
        identity: the run's identity, whose ``backend_results`` this component keeps current.
        device: the device the run computes on.
    """

    name = "run_path"
    #: torch's intra-op threads, read again every round (the summary says the last round's)
    transient_attributes = frozenset({"threads"})

    def __init__(self, backend: Backend, identity: dict[str, Any], device: torch.device) -> None:
        self.backend, self.identity, self.device = backend, identity, device
        self.add_state("segments", [])
        self.threads: int | None = None

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
