"""Mixed precision on the current device: FedAvg and FedCross trained in ``32-true``, ``16-mixed``
and ``bf16-mixed``, and SCAFFOLD's precision rule (``16-mixed`` refused before training,
``bf16-mixed`` trains).

Setup (every run the same federation, initial model and client sampling: seed 0): scikit-learn's
bundled digits (offline), 20 clients with Dirichlet(0.5) label skew, the FedAvg CNN, 10 rounds x
10 clients x 2 local epochs of SGD (lr 0.05, momentum 0.5, batch 32). FedAvg: ClientModule +
FedAvg; FedCross: ClientModule + FedCross (its defaults: alpha 0.99, lowest similarity, one
middleware model per sampled client); SCAFFOLD: ScaffoldClient + Scaffold.

Columns:
  test_acc   the global model on the global test set after the last round
  left out   client fits left out over the run (failed, or NaN/Inf uploads: a 16-mixed symptom)
  wall s     the whole run (fits, aggregation, evaluation every round, one checkpoint); a short
             warm-up run goes first so that the first row does not pay CUDA/cuDNN start-up

``--budget-s`` bounds the whole script: a row whose predicted time (the slowest run so far) does
not fit what is left is printed as skipped; the SCAFFOLD refusal (which trains nothing) always runs.

The SCAFFOLD 16-mixed run must raise a ConfigurationError before its first client fit (no
partition file, no checkpoint); its message is printed, and the script exits with status 1 if it
is not refused. Python API only: no CLI, no W&B.

On a CPU, Lightning has no fp16 AMP (it would run ``bf16-mixed`` instead), so the ``16-mixed``
FedAvg/FedCross runs are skipped there with a note; the SCAFFOLD refusal is checked all the same.

    python benchmarks/gpu_check.py --accelerator cuda             # about a minute on a GPU
    python benchmarks/gpu_check.py --accelerator cpu --rounds 1   # a quick look on a CPU
    python benchmarks/gpu_check.py --accelerator cuda --budget-s 60
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.fabric.utilities.seed import seed_everything
from rich.console import Console
from rich.table import Table

from budget import Budget
from devices import clock, device_name
from fedlightning import ConfigurationError, FederatedDataModule, FederatedLoop
from fedlightning.clients import ClientModule, ScaffoldClient
from fedlightning.determinism import prepare_environment
from fedlightning.server import FedAvg, FedCross, Scaffold

RECIPE = dict(
    network="cnn", num_classes=10, in_channels=1, image_size=8, optimizer="sgd", lr=0.05, momentum=0.5
)  # fmt: skip
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
#: name -> (client objective factory, aggregator factory)
ALGORITHMS = {
    "FedAvg": (lambda: ClientModule(**RECIPE), FedAvg),
    "FedCross": (lambda: ClientModule(**RECIPE), FedCross),
}


def run(
    make_client, make_aggregator, precision: str, args: argparse.Namespace, run_dir: Path, **kw
) -> tuple[dict[str, float], int, float]:
    """One run: ``(last metrics, client fits left out, wall seconds)``."""
    seed_everything(args.seed, verbose=False)  # the initial model, as the CLI does with loop.seed
    model = make_client()
    dm = FederatedDataModule(
        dataset="digits", num_clients=20, partition="dirichlet", beta=0.5, batch_size=32,
        seed=args.seed,
    )  # fmt: skip
    settings = dict(
        rounds=args.rounds, clients_per_round=10, local_epochs=2, aggregator=make_aggregator(),
        precision=precision, accelerator=args.accelerator, seed=args.seed,
        checkpoint_every=args.rounds, run_dir=str(run_dir), progress_bar=False, plots=False,
        num_threads=None,  # the process's threads (--threads), which the header prints
    )  # fmt: skip
    loop = FederatedLoop(**{**settings, **kw})
    loop.console.quiet = True
    start = clock(args.accelerator)
    metrics = loop.fit(model, datamodule=dm)
    seconds = clock(args.accelerator) - start
    left_out = sum(int(m["clients_failed"] + m["clients_rejected"]) for m in loop.history)
    return metrics, left_out, seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--budget-s", type=float, default=None, help="finish inside this")
    args = parser.parse_args()
    budget, slowest = Budget(args.budget_s), 0.0
    prepare_environment(True)  # cuBLAS's workspace variable, before the device name starts CUDA
    if args.accelerator == "cuda" and not torch.cuda.is_available():
        parser.error("--accelerator cuda: no CUDA device is available")
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=120)
    console.print(
        f"{device_name(args.accelerator)}; {torch.get_num_threads()} torch threads; torch {torch.__version__}"
    )

    table = Table(
        title=f"digits, 20 clients, Dirichlet(0.5), CNN, {args.rounds} rounds x 10 clients x 2 "
        f"epochs ({args.accelerator})"
    )
    for column in ("algorithm", "precision", "test_acc", "left out", "wall s"):
        table.add_column(column, justify="left" if column == "algorithm" else "right")
    notes: list[str] = []
    refused = False
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        warm = dict(rounds=1, clients_per_round=2, checkpoint_every=1)
        run(*ALGORITHMS["FedAvg"], "32-true", args, tmp / "warm-up", **warm)
        for name, (make_client, make_aggregator) in ALGORITHMS.items():
            for precision in PRECISIONS:
                if precision == "16-mixed" and args.accelerator == "cpu":
                    table.add_row(name, precision, "skipped", "-", "-")
                    continue
                if not budget.allows(2 * slowest):  # this row and the SCAFFOLD bf16 one
                    table.add_row(name, precision, "skipped (budget)", "-", f"~{slowest:.0f}")
                    continue
                metrics, left_out, seconds = run(
                    make_client, make_aggregator, precision, args, tmp / f"{name}-{precision}"
                )
                slowest = max(slowest, seconds)
                table.add_row(name, precision, f"{metrics['test_acc']:.4f}", str(left_out),
                              f"{seconds:.1f}")  # fmt: skip
        if args.accelerator == "cpu":
            notes.append(
                "16-mixed FedAvg/FedCross skipped: Lightning has no fp16 AMP on CPU (it would "
                "silently run bf16-mixed)"
            )

        # SCAFFOLD: 16-mixed can skip optimizer steps (gradient scaler), which SCAFFOLD would
        # still count in K_i: refused before any client fit
        run_dir = tmp / "SCAFFOLD-16-mixed"
        start = time.perf_counter()
        try:
            run(lambda: ScaffoldClient(**RECIPE), Scaffold, "16-mixed", args, run_dir)
        except ConfigurationError as error:
            refused = True
            before_training = not (run_dir / "partition.csv").exists()
            table.add_row(
                "SCAFFOLD", "16-mixed", "refused", "-", f"{time.perf_counter() - start:.1f}"
            )
            notes.append(
                f"SCAFFOLD 16-mixed: ConfigurationError "
                f"({'before training' if before_training else 'AFTER the run started'}): {error}"
            )
            refused = refused and before_training
        else:
            table.add_row("SCAFFOLD", "16-mixed", "NOT refused", "-", "-")
            notes.append("SCAFFOLD 16-mixed was NOT refused")
        metrics, left_out, seconds = run(
            lambda: ScaffoldClient(**RECIPE), Scaffold, "bf16-mixed", args, tmp / "SCAFFOLD-bf16"
        )
        acc = metrics["test_acc"]
        table.add_row("SCAFFOLD", "bf16-mixed", f"{acc:.4f}", str(left_out), f"{seconds:.1f}")
        if not math.isfinite(acc):
            notes.append("SCAFFOLD bf16-mixed: test_acc is not finite")
    console.print(table)
    for note in notes:
        console.print(note, soft_wrap=True)
    if not refused:
        sys.exit(1)


if __name__ == "__main__":
    main()
