"""``fedlightning test RUN_DIR``: score a run's saved deployables on the test set.

The objective and the data come from ``RUN_DIR/config.yaml``; the deployables from
``RUN_DIR/models.pt`` (a finished run, :mod:`fedlightning.loop.deployables`) or, without it, from
``RUN_DIR/last.ckpt`` (a checkpointed run: the aggregator's state restored as a resume restores
it). Every deployable is scored by the run's scoring path (:mod:`fedlightning.loop.scoring_model`,
:class:`~fedlightning.loop.evaluation.Evaluator`; docs/algorithms.md section 6.1) on the run's
device and precision, so the table shows the numbers the run logged at that round: ``metrics.csv``
is compared within :data:`TOLERANCE` (the largest difference is printed either way), and a value
beyond it is named with as many decimals as tell the two apart (a run evaluated before evaluation
scored in eval mode).
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from fedlightning.cli.fit import FederatedCLI
from fedlightning.compute import Compute
from fedlightning.errors import ConfigurationError
from fedlightning.loop.checkpoint import read_checkpoint
from fedlightning.loop.deployables import MODELS_FILE, read_models
from fedlightning.loop.evaluation import Evaluator
from fedlightning.loop.scoring_model import SavedModel, ScoringModel
from fedlightning.loop.startup import prepare_run
from fedlightning.training import quiet_lightning

#: a score agrees with metrics.csv within this, absolute up to 1 and relative above (a loss): the
#: same float32 quotients, summed in another order by another thread count or device
TOLERANCE = 1e-6
#: loop options a resume may change (fedlightning.loop.identity) that would write or open anything
QUIET = {"loggers": None, "wandb": False, "plots": False, "progress_bar": False}


def test_command(argv: list[str]) -> None:
    """Parse ``argv`` (the arguments after ``test``), score the run and print the table."""
    parser = argparse.ArgumentParser(
        prog="fedlightning test",
        description="Score a run's saved deployables (models.pt, or last.ckpt) on the test set, "
        "through the scoring path of a run's evaluation.",
        allow_abbrev=False,  # one spelling per option (fedlightning.config_checks)
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished or checkpointed run")
    run_dir = Path(parser.parse_args(argv).run_dir)
    saved, checkpoint = _saved(run_dir)
    sys.argv = sys.argv[:1]  # the arguments are the config's (LightningCLI warns about both)
    cli = FederatedCLI(args=_config(run_dir), run=False)
    loop, model, dm = cli.trainer, cli.model, cli.datamodule
    notes = []
    if saved is not None:
        rounds, models = saved
        dm.setup("fit")
        with quiet_lightning():
            compute = Compute.resolve(loop.fit_config.accelerator, loop.precision)
        scoring = ScoringModel.for_run(model, compute)
        _check_fits(run_dir, models, scoring)
        notes = _newer_checkpoint(run_dir, rounds)
        loaders = {name: functools.partial(scoring.load_saved, e) for name, e in models.items()}
        architectures = {name: entry["architecture"] for name, entry in models.items()}
        source = f"{MODELS_FILE} (round {rounds})"
    else:
        run = prepare_run(loop.parts(), model, dm, str(checkpoint))
        scoring, deployables = run.scoring, loop.aggregator.deployables()
        scoring.prepare(loop.store, deployables)
        loaders = {name: functools.partial(scoring.load, w) for name, w in deployables.items()}
        architectures = {name: scoring.architecture(w) for name, w in deployables.items()}
        rounds = run.first_round
        source = f"last.ckpt (round {rounds})"
    results = Evaluator(scoring).test_models(loaders, dm.test_dataloader)
    print(_table(run_dir, source, dm, architectures, results, _logged(run_dir, rounds)))
    print(*notes, sep="\n", end="\n" if notes else "")


def _check_fits(run_dir: Path, models: dict[str, SavedModel], scoring: ScoringModel) -> None:
    """Refuse, in one line, a ``models.pt`` whose models the run's config does not build (a file
    copied from a run with another network size)."""
    for name, entry in models.items():
        reason = scoring.misfit(entry)
        if reason is not None:
            raise ConfigurationError(
                f"{run_dir / MODELS_FILE}: its model {name!r} does not fit the network "
                f"{run_dir / 'config.yaml'} builds: {reason}; was the file copied from another "
                "run?"
            )


def _newer_checkpoint(run_dir: Path, rounds: int) -> list[str]:
    """A note when ``last.ckpt`` holds more rounds than the scored ``models.pt`` (of round
    ``rounds``): a resume that did not finish, whose rounds this table does not score."""
    checkpoint = run_dir / "last.ckpt"
    if not checkpoint.is_file():
        return []
    try:
        newer = read_checkpoint(str(checkpoint))["round"]
    except ConfigurationError as error:
        return [f"note: {checkpoint} is there too, but cannot be read: {error}"]
    if newer <= rounds:
        return []
    return [
        f"note: {checkpoint} is newer (round {newer}): a resume that stopped before its end; "
        f"this table scores {MODELS_FILE}, which holds round {rounds}: resume the run to its "
        f"end (--ckpt_path {checkpoint}) to score its later rounds"
    ]


def _saved(run_dir: Path) -> tuple[tuple[int, dict[str, SavedModel]] | None, Path | None]:
    """``(models.pt's round and entries, None)`` of a finished run, ``(None, last.ckpt)`` of a
    checkpointed one; any problem is a one-line ConfigurationError."""
    if not run_dir.is_dir():
        raise ConfigurationError(f"RUN_DIR={str(run_dir)!r} is not a directory")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigurationError(
            f"RUN_DIR={str(run_dir)!r} holds no config.yaml: not a fedlightning fit run directory"
        )
    if (run_dir / MODELS_FILE).is_file():
        return read_models(run_dir / MODELS_FILE), None
    if (run_dir / "last.ckpt").is_file():
        read_checkpoint(str(run_dir / "last.ckpt"))  # a bad file: one line
        return None, run_dir / "last.ckpt"
    raise ConfigurationError(
        f"RUN_DIR={str(run_dir)!r} holds neither {MODELS_FILE} (a finished run) nor last.ckpt (a "
        "checkpointed one): nothing to score"
    )


def _config(run_dir: Path) -> dict[str, Any]:
    """The run's config groups, with the run directory as given and nothing that logs or plots."""
    path = run_dir / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigurationError(f"{path} cannot be read: {error}") from None
    if not isinstance(config, dict) or not all(
        isinstance(config.get(group), dict) for group in ("loop", "model", "data")
    ):
        raise ConfigurationError(f"{path} is not a fit run's config (loop, model and data)")
    config = {group: dict(config[group]) for group in ("loop", "model", "data")}
    config["loop"].update(QUIET, run_dir=str(run_dir))
    return config


def _logged(run_dir: Path, rounds: int) -> dict[str, float]:
    """The test metrics of ``metrics.csv``'s row of round ``rounds`` (empty: no such row)."""
    try:
        with open(run_dir / "metrics.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError:
        return {}
    for row in rows:
        if row.get("round") and int(float(row["round"])) == rounds:
            tested = {k: v for k, v in row.items() if k.endswith(("test_acc", "test_loss"))}
            return {**{k: float(v) for k, v in tested.items() if v}, "round": float(rounds)}
    return {}


def _table(
    run_dir: Path,
    source: str,
    dm: Any,
    architectures: dict[str, str | None],
    results: dict[str, float],
    logged: dict[str, float],
) -> str:
    """The printed table, and one line on how the numbers compare with ``metrics.csv``."""
    lines = [f"{run_dir}: {source}, scored on the {dm.dataset} test set"]
    width = max(len(name) for name in (*architectures, "model"))
    arch_width = max(len(str(a)) for a in (*architectures.values(), "architecture"))
    lines.append(f"{'model':<{width}}  {'architecture':<{arch_width}}  test_acc  test_loss")
    for name, architecture in architectures.items():
        prefix = "" if name == "global" else f"{name}/"
        acc, loss = results[f"{prefix}test_acc"], results[f"{prefix}test_loss"]
        lines.append(f"{name:<{width}}  {str(architecture):<{arch_width}}  {acc:8.4f}  {loss:9.4f}")
    if "group_mean_acc" in results:
        lines.append(f"group_mean_acc {results['group_mean_acc']:.4f}")
    if not logged:
        lines.append("metrics.csv has no row for this round to compare with")
        return "\n".join(lines)
    lines.append(compare_logged(results, logged))
    return "\n".join(lines)


def compare_logged(results: dict[str, float], logged: dict[str, float]) -> str:
    """How the scores compare with ``metrics.csv``'s row ``logged``: the same within
    :data:`TOLERANCE`, or each value beyond it (printed to as many decimals as tell the two
    apart), and always the largest difference."""
    keys = [key for key in results if key in logged]
    gaps = {key: _gap(logged[key], results[key]) for key in keys}
    rounds = int(logged["round"])
    if not gaps:
        return f"metrics.csv round {rounds} has none of these metrics to compare with"
    widest = max(gaps, key=lambda key: gaps[key])
    largest = f"largest difference {gaps[widest]:.2g} ({widest}), tolerance {TOLERANCE:g}"
    differ = [key for key in keys if gaps[key] > TOLERANCE * max(1.0, abs(logged[key]))]
    if not differ:
        return f"metrics.csv round {rounds}: the same numbers ({largest})"
    shown = ", ".join(f"{key} {_apart(logged[key], results[key])}" for key in differ)
    return f"metrics.csv round {rounds} logged otherwise: {shown}; {largest}"


def _gap(logged: float, now: float) -> float:
    """``|logged - now|``; 0 when both are NaN, infinite when one is."""
    if math.isnan(logged) or math.isnan(now):
        return 0.0 if math.isnan(logged) and math.isnan(now) else math.inf
    return abs(logged - now)


def _apart(logged: float, now: float) -> str:
    """``0.5000 (now 0.4375)``: 4 decimals, more (up to 12) when 4 print both alike."""
    digits = 4
    while digits < 12 and f"{logged:.{digits}f}" == f"{now:.{digits}f}":
        digits += 1
    return f"{logged:.{digits}f} (now {now:.{digits}f})"
