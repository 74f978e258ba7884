"""The checkpoint writer as a round component (docs/algorithms.md section 6.2): ``last.ckpt``
every ``loop.checkpoint_every`` rounds and after the last one, written in the background
(:mod:`fedlightning.loop.checkpoint_writer`), holding the state of every round component.

It is the last component of the list, so the checkpoint of a round holds what every other
component did in it. A failed background write stops the run at the start of the next round.
Always on, built by start-up with the run's parts (``loop.checkpoint_every`` is its option); it
keeps no state of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedlightning.loop.checkpoint import make_checkpoint
from fedlightning.loop.checkpoint_writer import CheckpointWriter
from fedlightning.loop.options import RunParts
from fedlightning.loop.run_state import RunState
from fedlightning.round_components import Round, RoundComponent, component_states


class CheckpointSaver(RoundComponent):
    """Writes the run's checkpoints (see the module docstring).

    Args:
        parts: the loop's options and parts (the aggregator, the store, the history...).
        run: the run's state (its identity; its newest checkpoint is recorded there).
        components: the run's round components, whose states each checkpoint holds.
    """

    #: the background writer (its write in flight)
    transient_attributes = frozenset({"writer"})

    def __init__(
        self, parts: RunParts, run: RunState, components: Sequence[RoundComponent]
    ) -> None:
        self.parts = parts
        self.run = run
        self.components = components
        self.path = Path(parts.options.run_dir) / "last.ckpt"
        self.writer = CheckpointWriter(type(parts.aggregator).__name__)

    def on_round_start(self, round: Round) -> None:
        self.writer.poll()  # a failed background write stops the run here

    def on_round_end(self, round: Round) -> None:
        done = round.index + 1
        if done % self.parts.options.checkpoint_every == 0 or round.last:
            self.save(done)

    def on_run_end(self, failing: bool) -> str | None:
        """Wait for the write in flight (before ``global.pt``, and before an error goes up)."""
        self.writer.close(raise_error=not failing)
        return None

    def save(self, rounds_done: int) -> None:
        """Snapshot the run after ``rounds_done`` rounds and write it in the background."""
        parts = self.parts
        clients = parts.store.state_dict()
        checkpoint: dict[str, Any] = make_checkpoint(
            rounds_done, self.run.identity, parts.aggregator.state_dict(), clients,
            parts.history, {"wandb": parts.reporter.wandb_id()},
            component_states(self.components),
        )  # fmt: skip

        def written() -> None:  # on the loop's thread, once the file is on disk
            self.run.last_checkpoint = (rounds_done, str(self.path))
            parts.store.commit(clients)  # the state files this checkpoint no longer needs

        self.writer.submit(checkpoint, self.path, written)
