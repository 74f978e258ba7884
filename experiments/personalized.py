"""Personalized FL against global methods: every personalized method with FedAvg, FedAvg-FT,
FedProx and SCAFFOLD (issue 39 item 4; docs/algorithms.md section 10.15).

Each method runs as a user runs it: ``fedlightning fit`` on its shipped config under
``configs/`` (its optimizer, batch size and options), with the setting of the table given on the
command line: the data set (``digits``, or ``mnist5k``: 5,000 real MNIST images), 20 clients
split pathologically (2 classes each) or by Dirichlet(0.1) label skew, a quarter of each client's
samples its own test split, 10 clients a round, one local epoch, the seed. Global methods are
scored per client too (``loop.personal``: their global model on each client's split; FedAvg-FT
fine-tunes it 5 epochs first).

Columns (mean ± sample std over seeds, after the last round):
  personal_acc  each client's deployed model on its own test split, averaged over clients
  test_acc      the (generic) global model on the global, balanced test set

    python experiments/personalized.py                      # the table: 2 data sets x 2 splits x 3 seeds
    python experiments/personalized.py --rounds 2 --seeds 0 --datasets digits   # a smoke test

Writes ``table.md``, ``runs.csv`` and ``personal_acc.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

from tables import mean_std, over_seeds, smoke_test_line

from fedlightning.cli import main as cli

TABLE_ROUNDS = 30
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: the global methods' shared recipe, as the personalized configs' (docs section 10.8)
GLOBAL = ["--data.batch_size", "10", "--loop.personal", "fedlightning.PersonalEvaluation"]
#: name -> (config, extra options)
METHODS: dict[str, tuple[str, list[str]]] = {
    "FedAvg": ("fedavg", GLOBAL),
    "FedAvg-FT": ("fedavg", [*GLOBAL, "--loop.personal.fine_tune_epochs", "5"]),
    "FedProx": ("fedprox", GLOBAL),
    "SCAFFOLD": ("scaffold", GLOBAL),
    "FedBN": ("fedbn", []), "FedPer": ("fedper", []), "LG-FedAvg": ("lg_fedavg", []),
    "FedRep": ("fedrep", []), "FedBABU": ("fedbabu", []), "Ditto": ("ditto", []),
    "APFL": ("apfl", []), "Per-FedAvg": ("perfedavg", []), "pFedMe": ("pfedme", []),
    "FedRoD": ("fedrod", []), "FedALA": ("fedala", []),
    "IFCA": ("ifca", []), "CFL": ("cfl", []),
}  # fmt: skip
SPLITS = {
    "pathological": ["--data.partition", "pathological", "--data.classes_per_client", "2"],
    "dirichlet": ["--data.partition", "dirichlet", "--data.beta", "0.1"],
}
KEYS = ("personal_acc", "test_acc")


def fit(method: str, dataset: str, split: str, seed: int, rounds: int, run_dir: Path) -> dict:
    """One run's last evaluated row (NaN for a metric it did not log)."""
    config, extra = METHODS[method]
    setting = [
        "--data.dataset", dataset, *SPLITS[split], "--data.num_clients", "20",
        "--data.client_test_fraction", "0.25", "--loop.clients_per_round", "10",
        "--loop.local_epochs", "1", "--loop.rounds", str(rounds), "--loop.eval_every",
        str(rounds), "--loop.seed", str(seed), "--loop.run_dir", str(run_dir),
        "--loop.progress_bar", "false", "--loop.plots", "false", "--loop.num_threads", "1",
    ]  # fmt: skip
    sys.argv = ["fedlightning"]
    cli(["fit", "-c", str(CONFIGS / f"{config}.yaml"), *setting, *extra])
    with open(run_dir / "metrics.csv") as handle:
        row = list(csv.DictReader(handle))[-1]
    return {k: float(row[k]) if row.get(k) else math.nan for k in KEYS}


def table(rows: list[dict], args: argparse.Namespace) -> list[str]:
    """The markdown table: a row per method, a column pair per (data set, split)."""
    settings = [(d, s) for d in args.datasets for s in args.splits]
    head = " | ".join(f"{d} {s}: personal_acc | test_acc" for d, s in settings)
    lines = [f"| method | {head} |", "|---" * (1 + 2 * len(settings)) + "|"]
    for method in args.methods:
        cells = []
        for dataset, split in settings:
            for key in KEYS:
                values = [r[key] for r in rows if (r["method"], r["dataset"], r["split"]) ==
                          (method, dataset, split)]  # fmt: skip
                finite = [v for v in values if math.isfinite(v)]
                cells.append(mean_std(finite) if finite and len(finite) == len(values) else "-")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def figure(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    """personal_acc (mean, sample std as error bars) per method, a panel per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [(d, s) for d in args.datasets for s in args.splits]
    fig, axes = plt.subplots(1, len(settings), figsize=(4 * len(settings), 4.5), squeeze=False)
    for ax, (dataset, split) in zip(axes[0], settings, strict=True):
        means, errors = [], []
        for method in args.methods:
            values = [r["personal_acc"] for r in rows if (r["method"], r["dataset"], r["split"])
                      == (method, dataset, split) and math.isfinite(r["personal_acc"])]  # fmt: skip
            means.append(100 * sum(values) / len(values) if values else math.nan)
            spread = (sum((v - sum(values) / len(values)) ** 2 for v in values)
                      / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0  # fmt: skip
            errors.append(100 * spread)
        ax.barh(args.methods, means, xerr=errors, color="tab:blue")
        ax.set_xlabel("personal_acc (%)")
        ax.set_title(f"{dataset}, {split}")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    """Run the table (or the smaller run ``argv`` asks for); print it, write it and the figure
    under ``--out``, and return its text."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--rounds", type=int, default=TABLE_ROUNDS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"],
                        choices=["digits", "mnist5k"])  # fmt: skip
    parser.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--out", type=Path, default=Path("runs/personalized"))
    args = parser.parse_args(argv)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in args.datasets:
            for split in args.splits:
                for method in args.methods:
                    for seed in args.seeds:
                        run_dir = Path(tmp) / f"{dataset}-{split}-{method}-{seed}"
                        result = fit(method, dataset, split, seed, args.rounds, run_dir)
                        rows.append({"method": method, "dataset": dataset, "split": split,
                                     "seed": seed, **result})  # fmt: skip
                        print(f"{dataset} {split} {method} seed {seed}: " + ", ".join(
                            f"{k} {v:.4f}" for k, v in result.items()), flush=True)  # fmt: skip
    title = (f"\n20 clients (a quarter of each one's samples its test split), 10 a round, one "
             f"local epoch, {args.rounds} rounds; accuracy in %, {over_seeds(args.seeds)}; "
             f"{time.perf_counter() - started:.0f} s in all\n")  # fmt: skip
    smoke = smoke_test_line(args.rounds, TABLE_ROUNDS)
    text = "\n".join([title, *table(rows, args), *([f"\n{smoke}"] if smoke else [])])
    print(text)
    (args.out / "table.md").write_text(text + "\n")
    with open(args.out / "runs.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["method", "dataset", "split", "seed", *KEYS])
        writer.writeheader()
        writer.writerows(rows)
    figure(rows, args, args.out / "personal_acc.png")
    return text


if __name__ == "__main__":
    main()
