"""FedCross against FedAvg on the bundled digits (or mnist5k) data, rounds to a target accuracy,
and the paper's Table 2 ablation shape.

Study 1 (paper Table 1 shape): 20 clients, 5 per round, Dirichlet beta in {0.1, 0.5}, the FedAvg
CNN, equal rounds, 3 seeds: FedAvg vs FedCross (lowest similarity, alpha 0.99).
Study 2 (paper Table 2 shape, one beta): collaborator rule x alpha in {0.5, 0.9, 0.99, 0.999}.

Every run uses the library end to end (FederatedDataModule, ClientModule, FederatedLoop and the
aggregator); a seed fixes the partition, the initial model, sampling and the client fits, and the
two algorithms of a seed share all of them. Accuracy is the global model's test accuracy on the
360 held-out digits: ``final`` = mean over the last 5 evaluations, ``best`` = best evaluation.

    python experiments/fedcross.py                            # both studies, about 12 min, 1 thread
    python experiments/fedcross.py --rounds 20 --seeds 1 --no-ablation   # a smoke test (says so)
    python experiments/fedcross.py --rounds 300 --seeds 1 --no-ablation --eval-every 5 \
        --out runs/experiments/fedcross_long                  # the long horizon, about 8 min
    python experiments/fedcross.py --recipe paper --dataset mnist5k --betas 0.1 --rounds 300 \
        --no-ablation --out runs/experiments/fedcross_mnist5k   # the paper's recipe, >= 300 rounds

``--recipe paper`` is the FedCross paper's client recipe (SGD lr 0.01, momentum 0.5, batch 50,
5 local epochs). ``--targets`` (default 0.95 0.97) adds rounds-to-accuracy: the first evaluated
round whose test accuracy reaches each target (resolution ``--eval-every``; "-" if never).

With alpha 0.99 a middleware model takes 1% of a collaborator per round, so the K models need on
the order of 1 / (1 - alpha) = 100 rounds to mix: at 70 rounds FedCross still trails FedAvg, and
it draws level or ahead only on the long horizon.

Writes ``results.csv`` (every evaluation of every run), ``curves.png`` and ``tables.md`` under
``--out`` (default ``runs/experiments/fedcross``).
"""

from __future__ import annotations

import argparse
import csv
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from lightning.fabric.utilities.seed import seed_everything
from rich.console import Console
from rich.table import Table
from tables import mean_std, over_seeds, smoke_test_line

from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
from fedlightning.analysis.plots import round_axis
from fedlightning.server import FedAvg, FedCross

#: the tables' rounds; fewer make a smoke test, and the output says so
TABLE_ROUNDS = 70
ALPHAS = (0.5, 0.9, 0.99, 0.999)
RULES = ("lowest_similarity", "in_order", "highest_similarity")
#: off a terminal (a log file, a pipe) lines and tables keep their full width, not 80 columns
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 1000)


@dataclass(frozen=True)
class Run:
    algorithm: str  # "fedavg" or "fedcross"
    beta: float
    seed: int
    selection: str = "lowest_similarity"
    alpha: float = 0.99

    @property
    def label(self) -> str:
        return (
            "FedAvg" if self.algorithm == "fedavg" else f"FedCross({self.selection}, {self.alpha})"
        )


def train(run: Run, args: argparse.Namespace) -> list[tuple[int, float]]:
    """One federated run; the global model's ``(round, test_acc)`` at every evaluation."""
    seed_everything(run.seed, verbose=False)  # the CLI does the same before building the model
    dm = FederatedDataModule(
        dataset=args.dataset, num_clients=args.clients, partition="dirichlet", beta=run.beta, batch_size=args.batch_size, seed=run.seed
    )  # fmt: skip
    side = 28 if args.dataset == "mnist5k" else 8
    model = ClientModule(
        network=args.network, num_classes=10, in_channels=1, image_size=side, lr=args.lr, momentum=args.momentum
    )  # fmt: skip
    aggregator = (
        FedAvg()
        if run.algorithm == "fedavg"
        else FedCross(alpha=run.alpha, selection=run.selection, independent_init=args.independent_init)
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as run_dir:
        loop = FederatedLoop(
            rounds=args.rounds, clients_per_round=args.per_round, local_epochs=args.local_epochs,
            aggregator=aggregator, seed=run.seed, eval_every=args.eval_every, run_dir=run_dir,
            checkpoint_every=args.rounds, progress_bar=False, num_threads=args.threads,
        )  # fmt: skip
        loop.console.quiet = True
        loop.fit(model, datamodule=dm)
    return [(int(row["round"]), float(row["test_acc"])) for row in loop.history]


def final(curve: list[tuple[int, float]]) -> float:
    return statistics.fmean(acc for _, acc in curve[-5:])


def best(curve: list[tuple[int, float]]) -> float:
    return max(acc for _, acc in curve)


def rounds_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated round with test accuracy >= ``target`` (None: never)."""
    return next((rnd for rnd, acc in curve if acc >= target), None)


def mean_rounds(values: list[int | None]) -> str:
    reached = [v for v in values if v is not None]
    if not reached:
        return "-"
    text = f"{statistics.fmean(reached):.0f}"
    return text if len(reached) == len(values) else f"{text} ({len(reached)}/{len(values)} reach)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=TABLE_ROUNDS)
    parser.add_argument("--dataset", choices=["digits", "mnist5k"], default="digits")
    parser.add_argument("--network", default="cnn")
    parser.add_argument("--recipe", choices=["default", "paper"], default="default")
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.95, 0.97])
    parser.add_argument("--independent-init", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--betas", type=float, nargs="+", default=[0.1, 0.5])
    parser.add_argument("--ablation-beta", type=float, default=0.5)
    parser.add_argument("--ablation-seeds", type=int, default=1)
    parser.add_argument("--no-ablation", action="store_true")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/experiments/fedcross"))
    args = parser.parse_args()
    if args.recipe == "paper":  # FedCross section 4.1: SGD lr 0.01, momentum 0.5, B 50, E 5
        args.lr, args.momentum, args.batch_size, args.local_epochs = 0.01, 0.5, 50, 5
    torch.set_num_threads(args.threads)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)

    runs = [
        Run(a, b, s) for b in args.betas for s in range(args.seeds) for a in ("fedavg", "fedcross")
    ]
    if not args.no_ablation:
        runs += [Run("fedavg", args.ablation_beta, s) for s in range(args.ablation_seeds)]
        runs += [
            Run("fedcross", args.ablation_beta, s, rule, alpha)
            for s in range(args.ablation_seeds) for rule in RULES for alpha in ALPHAS
        ]  # fmt: skip
    runs = list(dict.fromkeys(runs))  # the main study's runs are reused by the ablation
    curves: dict[Run, list[tuple[int, float]]] = {}
    started = time.perf_counter()
    with open(args.out / "results.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["algorithm", "selection", "alpha", "beta", "seed", "round", "test_acc"])
        for n, run in enumerate(runs, start=1):
            t0 = time.perf_counter()
            curves[run] = train(run, args)
            for rnd, acc in curves[run]:
                writer.writerow(
                    [run.algorithm, run.selection, run.alpha, run.beta, run.seed, rnd, acc]
                )
            handle.flush()
            console.print(
                f"[{n}/{len(runs)}] {run.label} beta={run.beta} seed={run.seed}: final {100 * final(curves[run]):.2f} "
                f"best {100 * best(curves[run]):.2f} ({time.perf_counter() - t0:.0f} s)"
            )
    elapsed = time.perf_counter() - started

    tables = [
        main_table(curves, args),
        *([] if args.no_ablation else [ablation_table(curves, args)]),
    ]
    with open(args.out / "tables.md", "w") as handle:
        for table in tables:
            console.print(table)
            handle.write(markdown(table) + "\n")
    plot(curves, args, args.out / "curves.png")
    console.print(f"{len(runs)} runs in {elapsed / 60:.1f} min; results in {args.out}")
    smoke = smoke_test_line(args.rounds, TABLE_ROUNDS)
    if smoke:
        console.print(smoke)


def main_table(curves: dict[Run, list], args: argparse.Namespace) -> Table:
    table = Table(
        title=f"{args.dataset}, {args.clients} clients, {args.per_round}/round, {args.rounds} rounds, {over_seeds(list(range(args.seeds)))}: final (best) test acc %, rounds to target"
    )
    columns = ["beta", "FedAvg final", "FedCross final", "FedAvg best", "FedCross best"]
    for target in args.targets:
        columns += [f"FedAvg rounds to {target:.0%}", f"FedCross rounds to {target:.0%}"]
    for column in columns:
        table.add_column(column)
    for beta in args.betas:
        avg = [curves[Run("fedavg", beta, s)] for s in range(args.seeds)]
        cross = [curves[Run("fedcross", beta, s)] for s in range(args.seeds)]
        table.add_row(
            str(beta),
            mean_std([final(c) for c in avg]), mean_std([final(c) for c in cross]),
            mean_std([best(c) for c in avg]), mean_std([best(c) for c in cross]),
            *[
                mean_rounds([rounds_to(c, t) for c in curves_])
                for t in args.targets for curves_ in (avg, cross)
            ],
        )  # fmt: skip
    return table


def ablation_table(curves: dict[Run, list], args: argparse.Namespace) -> Table:
    seeds = range(args.ablation_seeds)
    reference = mean_std([final(curves[Run("fedavg", args.ablation_beta, s)]) for s in seeds])
    table = Table(
        title=f"ablation, beta {args.ablation_beta}, {args.rounds} rounds, {over_seeds(list(seeds))}: final test acc % (FedAvg {reference})"
    )
    table.add_column("selection")
    for alpha in ALPHAS:
        table.add_column(f"alpha {alpha}")
    for rule in RULES:
        cells = [
            mean_std(
                [final(curves[Run("fedcross", args.ablation_beta, s, rule, a)]) for s in seeds]
            )
            for a in ALPHAS
        ]
        table.add_row(rule, *cells)
    return table


def markdown(table: Table) -> str:
    headers = [str(c.header) for c in table.columns]
    rows = list(zip(*[list(c.cells) for c in table.columns], strict=True))
    lines = [
        f"**{table.title}**",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
    ]
    return "\n".join(lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]) + "\n"


def mean_curve(curves: list[list[tuple[int, float]]]) -> tuple[list[int], list[float]]:
    rounds = [r for r, _ in curves[0]]
    return rounds, [statistics.fmean(c[i][1] for c in curves) for i in range(len(rounds))]


def plot(curves: dict[Run, list], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(args.betas) + (0 if args.no_ablation else 1)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    for ax, beta in zip(axes[0], args.betas, strict=False):
        for algorithm, label in (("fedavg", "FedAvg"), ("fedcross", "FedCross (lowest, 0.99)")):
            ax.plot(
                *mean_curve([curves[Run(algorithm, beta, s)] for s in range(args.seeds)]),
                label=label,
                marker=".",  # a short run has few evaluations: a line of one point is a dot
            )
        ax.set(
            title=f"{args.dataset}, Dirichlet beta {beta} (mean of {args.seeds} seeds)",
            xlabel="round",
            ylabel="test accuracy",
        )
    if not args.no_ablation:
        ax = axes[0][-1]
        beta, seeds = args.ablation_beta, range(args.ablation_seeds)
        ax.plot(
            *mean_curve([curves[Run("fedavg", beta, s)] for s in seeds]),
            label="FedAvg",
            color="black",
            marker=".",
        )
        for rule in RULES:
            ax.plot(
                *mean_curve([curves[Run("fedcross", beta, s, rule, 0.99)] for s in seeds]),
                label=f"{rule}, 0.99",
                marker=".",
            )
        ax.plot(
            *mean_curve(
                [curves[Run("fedcross", beta, s, "lowest_similarity", 0.999)] for s in seeds]
            ),
            label="lowest, 0.999",
            linestyle="--",
            marker=".",
        )
        ax.set(title=f"ablation, beta {beta}", xlabel="round", ylabel="test accuracy")
    for ax in axes[0]:
        round_axis(ax, np.array([x for line in ax.lines for x in line.get_xdata()], dtype=float))
        for target in args.targets:
            ax.axhline(target, linestyle=":", color="grey", linewidth=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
