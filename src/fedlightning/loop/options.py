"""The loop's options, grouped, and the parts of a run: what start-up, the rounds and the round
components read of a :class:`~fedlightning.loop.core.FederatedLoop`.

``FederatedLoop.__init__`` takes the CLI's ``loop:`` options one by one and puts each in its
group, by name, once:

- :class:`RunOptions`: the run's own options (rounds, sampling, seed, evaluation cadence, run
  directory, checkpoints, the failure policy), each checked here;
- :class:`~fedlightning.protocol.FitConfig`: how every client fit runs (epochs or steps,
  precision, accelerator, clipping, threads, DP-SGD, determinism;
  :func:`fedlightning.loop.arguments.check_fit_config`);
- the reporter (:class:`~fedlightning.loop.reporting.Reporter`: loggers, W&B, progress, plots);
- the parts: the aggregator, the backend, the round components
  (:func:`fedlightning.loop.components.configured_components`), the client store.

:class:`RunParts` is all of it plus the loop's records (history, summary), taken when ``fit``
starts (the CLI sets ``config_text`` after constructing the loop); start-up, the rounds and the
components depend on it, not on the loop's class. So an option is followed from the CLI to its
use in one read: ``loop.eval_every`` is ``FederatedLoop(eval_every=...)``, then
``RunOptions.eval_every``, read by :class:`~fedlightning.loop.rounds.Rounds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlightning.backends.base import Backend
from fedlightning.errors import require
from fedlightning.loop.checks import check_seed
from fedlightning.loop.reporting import Reporter
from fedlightning.loop.sampling import SAMPLINGS
from fedlightning.loop.summary import RunSummary
from fedlightning.protocol import FitConfig
from fedlightning.round_components import RoundComponent, Row
from fedlightning.server.base import Aggregator
from fedlightning.state import ClientStore

#: where a run started from Python writes without ``run_dir`` (the CLI names it after its config)
DEFAULT_RUN_DIR = Path("runs/run")


@dataclass(frozen=True)
class RunOptions:
    """The run's own options: each field is ``loop.<name>``, documented by the
    :class:`~fedlightning.loop.core.FederatedLoop` argument of that name, and checked here (a bad
    value is a ConfigurationError naming the option)."""

    rounds: int = 10
    clients_per_round: int | float = 10
    client_sampling: str = "fixed"
    min_clients: int = 1
    seed: int = 0
    eval_every: int = 1
    val_clients: int | str = 100
    run_dir: Path = DEFAULT_RUN_DIR
    overwrite: bool = False
    checkpoint_every: int = 1
    on_round_failure: str = "skip"
    max_skipped_fraction: float = 0.5

    def __post_init__(self) -> None:
        check_seed(self.seed)
        per_round = self.clients_per_round
        require(
            self.client_sampling in SAMPLINGS,
            "loop.client_sampling", self.client_sampling, f"one of {', '.join(SAMPLINGS)}",
        )  # fmt: skip
        require(
            0 <= self.max_skipped_fraction <= 1,
            "loop.max_skipped_fraction", self.max_skipped_fraction, "a number in [0, 1]",
        )  # fmt: skip
        require(self.rounds >= 1, "loop.rounds", self.rounds, "an integer >= 1")
        require(
            per_round > 0 and (isinstance(per_round, int) or per_round <= 1),
            "loop.clients_per_round", per_round, "an integer >= 1 or a fraction in (0, 1]",
        )  # fmt: skip
        require(self.eval_every >= 1, "loop.eval_every", self.eval_every, "an integer >= 1")
        require(
            self.val_clients == "all" or (type(self.val_clients) is int and self.val_clients >= 1),
            "loop.val_clients", self.val_clients, "'all' or an integer >= 1",
        )  # fmt: skip
        require(
            self.checkpoint_every >= 1,
            "loop.checkpoint_every", self.checkpoint_every, "an integer >= 1",
        )  # fmt: skip
        require(self.min_clients >= 1, "loop.min_clients", self.min_clients, "an integer >= 1")
        require(
            self.on_round_failure in ("skip", "stop"),
            "loop.on_round_failure", self.on_round_failure, "'skip' or 'stop'",
        )  # fmt: skip


def run_directory(run_dir: str | None) -> Path:
    """``loop.run_dir`` as a path (``None``: :data:`DEFAULT_RUN_DIR`); an empty one is refused
    (it would write into the current folder)."""
    require(
        run_dir is None or bool(str(run_dir).strip()),
        "loop.run_dir", run_dir, "a directory path (an empty one would write into the current folder)",
    )  # fmt: skip
    return Path(run_dir) if run_dir is not None else DEFAULT_RUN_DIR


@dataclass(frozen=True)
class RunParts:
    """The loop's options, parts and records, taken when ``fit`` starts (module docstring).

    Attributes:
        options: the run's own options.
        fit_config: how every client fit runs (before the round components' changes).
        aggregator, backend: ``loop.aggregator`` and ``loop.backend`` (their defaults made).
        components: the configured round components (``loop.components`` with the shorthands
            ``loop.attack`` and ``loop.target_acc``), before the built-ins join them.
        store: the ClientStore (``loop.client_state``).
        reporter: metrics.csv, loggers, progress and plots.
        history: the loop's metrics rows (a resume refills it; the checkpoints hold it).
        summary: the loop's run summary (failures, skipped rounds).
        config_text: the CLI's resolved config (``None``: a run started from Python).
        loop_args: the arguments the loop was constructed with (a Python run's config).
    """

    options: RunOptions
    fit_config: FitConfig
    aggregator: Aggregator
    backend: Backend
    components: tuple[RoundComponent, ...]
    store: ClientStore
    reporter: Reporter
    history: list[Row]
    summary: RunSummary
    config_text: str | None
    loop_args: dict[str, Any]
