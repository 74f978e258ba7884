"""What start-up, the rounds and the round components read of a :class:`~fedlightning.loop.core.
FederatedLoop`: its options, its parts and its records, as one :class:`RunOptions` taken when
``fit`` starts (the CLI sets ``config_text`` after constructing the loop). They depend on this,
not on the loop's class."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlightning.attacks.base import Attack
from fedlightning.backends.base import Backend
from fedlightning.loop.personal_options import PersonalEvaluation
from fedlightning.loop.reporting import Reporter
from fedlightning.loop.summary import RunSummary
from fedlightning.privacy.dp_sgd import DPSGD
from fedlightning.protocol import FitConfig
from fedlightning.server.base import Aggregator
from fedlightning.state import ClientStore


@dataclass(frozen=True)
class RunOptions:
    """The loop's options (as ``FederatedLoop``'s arguments of the same names document them),
    its parts and its records.

    Attributes:
        init_args: every argument the loop was constructed with (the run's config).
        config_text: the CLI's resolved config (``None``: a run started from Python).
        history: the loop's metrics rows (a resume refills it; the checkpoints hold it).
        summary: the loop's run summary (failures, skipped rounds).
    """

    init_args: dict[str, Any]
    config_text: str | None
    rounds: int
    clients_per_round: int | float
    min_clients: int
    seed: int
    client_sampling: str
    run_dir: Path
    overwrite: bool
    checkpoint_every: int
    on_round_failure: str
    eval_every: int
    val_clients: int | str
    max_skipped_fraction: float
    target_acc: float | None
    dp_sgd: DPSGD | None
    personal: PersonalEvaluation | None
    fit_config: FitConfig
    aggregator: Aggregator
    backend: Backend
    attack: Attack | None
    store: ClientStore
    reporter: Reporter
    history: list[dict[str, float]]
    summary: RunSummary

    @property
    def precision(self) -> str:
        return self.fit_config.precision


def fit_config_from(args: dict[str, Any]) -> FitConfig:
    """How every client fit of the run is done, from the loop's arguments ``args``."""
    dp_sgd = args["dp_sgd"]
    return FitConfig(
        local_epochs=args["local_epochs"], local_steps=args["local_steps"],
        precision=args["precision"], accelerator=args["accelerator"], seed=args["seed"],
        gradient_clip_val=args["gradient_clip_val"],
        gradient_clip_algorithm=args["gradient_clip_algorithm"], fit_with=args["fit_with"],
        num_threads=args["num_threads"], onednn=args["onednn"],
        dp_sgd=dp_sgd.settings() if dp_sgd is not None else None,
        deterministic=args["deterministic"],
    )  # fmt: skip


def reporter_from(args: dict[str, Any], run_dir: Path) -> Reporter:
    """The run's reporter (metrics.csv, loggers, progress, plots), from the loop's arguments."""
    wandb = {k: args[f"wandb_{k}"] for k in ("project", "group", "tags", "name")}
    return Reporter(
        run_dir, args["loggers"] or (), args["wandb"], wandb, args["progress_bar"],
        args["plots"], args["log_every"],
    )  # fmt: skip
