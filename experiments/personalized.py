"""Personalized FL against global methods: every personalized method with FedAvg, FedAvg-FT,
FedProx and SCAFFOLD (issue 39 item 4; docs/algorithms.md section 10.15).

Each method runs as a user runs it: ``fedlightning fit`` on its shipped config under
``configs/`` (its optimizer, batch size and options), with the setting of the table given on the
command line: the data set (``digits``, or ``mnist5k``: 5,000 real MNIST images), 20 clients
split pathologically (2 classes each) or by Dirichlet(0.1) label skew, a quarter of each client's
samples its own test split, 10 clients a round, one local epoch (FedRep: its head's 10, then one
of the body), the seed. Global methods are
scored per client too (``loop.personal``: their global model on each client's split; FedAvg-FT
fine-tunes it 5 epochs first).

Columns (mean ± sample std over seeds, after the last round):
  personal_acc  each client's deployed model on its own test split, averaged over clients
  test_acc      the (generic) global model on the global, balanced test set

    python experiments/personalized.py                      # the table: 2 data sets x 2 splits x 3 seeds
    python experiments/personalized.py --rounds 2 --seeds 0 --datasets digits   # a smoke test

    python experiments/personalized.py --jobs 2             # on two processes

Writes ``table.md``, ``runs.csv`` (a row per finished run, appended as each ends: a rerun with
the same ``--out`` and ``--rounds`` runs only the missing ones) and ``personal_acc.png`` under
``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging
import math
import multiprocessing
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
#: FedBN's BatchNorm CNN and Per-FedAvg's two half-batches cannot train on a last batch of one
#: sample, which some Dirichlet clients of mnist5k have (the run is refused in one line): such a
#: batch joins the one before it (docs section 4.1); a run without one is unchanged
NO_SINGLE_SAMPLE_BATCH = ["--data.min_batch_size", "2"]
#: name -> (config, extra options)
METHODS: dict[str, tuple[str, list[str]]] = {
    "FedAvg": ("fedavg", GLOBAL),
    "FedAvg-FT": ("fedavg", [*GLOBAL, "--loop.personal.fine_tune_epochs", "5"]),
    "FedProx": ("fedprox", GLOBAL),
    "SCAFFOLD": ("scaffold", GLOBAL),
    "FedBN": ("fedbn", NO_SINGLE_SAMPLE_BATCH), "FedPer": ("fedper", []), "LG-FedAvg": ("lg_fedavg", []),
    "FedRep": ("fedrep", []), "FedBABU": ("fedbabu", []), "Ditto": ("ditto", []),
    "APFL": ("apfl", []), "Per-FedAvg": ("perfedavg", NO_SINGLE_SAMPLE_BATCH), "pFedMe": ("pfedme", []),
    "FedRoD": ("fedrod", []), "FedALA": ("fedala", []),
    "IFCA": ("ifca", []), "CFL": ("cfl", []),
}  # fmt: skip
#: local epochs where a method's one epoch of shared training is not the fit's whole length:
#: FedRep trains its head 10 epochs, then the shared body 1 (its paper's schedule, its config's
#: ``local_epochs: 11``); with ``local_epochs 1`` its body would see a tenth of an epoch
EPOCHS = {"FedRep": 11}
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
        "--loop.local_epochs", str(EPOCHS.get(method, 1)), "--loop.rounds", str(rounds),
        "--loop.eval_every",
        str(rounds), "--loop.seed", str(seed), "--loop.run_dir", str(run_dir),
        "--loop.progress_bar", "false", "--loop.plots", "false", "--loop.num_threads", "1",
        # a run whose model goes non-finite for most rounds is a "diverged" cell of the table,
        # not a failed table: the CLI's exit 1 for it (over half its rounds skipped) is lifted
        "--loop.max_skipped_fraction", "1",
    ]  # fmt: skip
    sys.argv = ["fedlightning"]
    cli(["fit", "-c", str(CONFIGS / f"{config}.yaml"), *setting, *extra])
    metrics = run_dir / "metrics.csv"  # absent when its one evaluated round (the last) was skipped
    rows = list(csv.DictReader(metrics.read_text().splitlines())) if metrics.exists() else []
    if not rows or int(rows[-1]["round"]) != rounds:  # its model went non-finite: "diverged"
        return dict.fromkeys(KEYS, math.nan)
    return {k: float(rows[-1][k]) if rows[-1].get(k) else math.nan for k in KEYS}


def _cell(values: list[float]) -> str:
    """A cell over seeds; a run that logged no accuracy after the last round (its last round
    skipped: a non-finite model) is counted, never averaged in."""
    finite = [v for v in values if math.isfinite(v)]
    if not values:
        return "-"
    if not finite:
        return f"diverged ({len(values)} of {len(values)})"
    if len(finite) < len(values):
        return f"{mean_std(finite)} ({len(values) - len(finite)} of {len(values)} diverged)"
    return mean_std(finite)


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
                cells.append(_cell(values))
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


def _run(cell: tuple[str, str, str, int, int, str]) -> dict:
    """One cell of the table in a fresh run directory (a worker process's task)."""
    method, dataset, split, seed, rounds, tmp = cell
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    run_dir = Path(tmp) / f"{dataset}-{split}-{method}-{seed}"
    try:
        result = fit(method, dataset, split, seed, rounds, run_dir)
    except SystemExit as stop:
        if stop.code not in (1, 2):  # a signal's exit (130, 143): this process ends with it
            raise
        # a run the CLI failed (1) or refused (2): the table stops with it, in a pool too (a
        # worker's SystemExit would leave the pool waiting for its result)
        raise RuntimeError(f"{method} on {dataset} {split} seed {seed}: exit {stop.code}") from None
    return {"method": method, "dataset": dataset, "split": split, "seed": seed, **result}


def _read(path: Path, rounds: int) -> list[dict]:
    """The cells ``runs.csv`` already holds at ``rounds`` rounds (a rerun skips them)."""
    if not path.exists():
        return []
    with open(path) as handle:
        rows = [r for r in csv.DictReader(handle) if int(r["rounds"]) == rounds]
    return [{**r, "seed": int(r["seed"]), **{k: float(r[k]) for k in KEYS}} for r in rows]


def main(argv: list[str] | None = None) -> str:
    """Run the table (or the smaller run ``argv`` asks for); print it, write it and the figure
    under ``--out``, and return its text. Each finished cell is appended to ``runs.csv`` at once,
    and a rerun with the same ``--out`` and ``--rounds`` runs only the cells it lacks."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--rounds", type=int, default=TABLE_ROUNDS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"],
                        choices=["digits", "mnist5k"])  # fmt: skip
    parser.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one thread each)")
    parser.add_argument("--out", type=Path, default=Path("runs/personalized"))
    args = parser.parse_args(argv)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "runs.csv"
    done = {(r["method"], r["dataset"], r["split"], r["seed"]) for r in _read(path, args.rounds)}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        todo = [(method, dataset, split, seed, args.rounds, tmp)
                for dataset in args.datasets for split in args.splits
                for method in args.methods for seed in args.seeds
                if (method, dataset, split, seed) not in done]  # fmt: skip
        fresh = not path.exists()
        with open(path, "a", newline="") as handle:
            writer = csv.DictWriter(
                handle, fieldnames=["method", "dataset", "split", "seed", "rounds", *KEYS]
            )
            if fresh:
                writer.writeheader()
            # a pool's workers end with it, a failed run's too (its exit leaves the others' folders)
            pool = multiprocessing.get_context("spawn").Pool(args.jobs) if args.jobs > 1 else None
            with pool or contextlib.nullcontext():
                results = pool.imap_unordered(_run, todo) if pool else map(_run, todo)
                for row in results:
                    writer.writerow({**row, "rounds": args.rounds})
                    handle.flush()
                    print(f"{row['dataset']} {row['split']} {row['method']} seed {row['seed']}: "
                          + ", ".join(f"{k} {row[k]:.4f}" for k in KEYS), flush=True)  # fmt: skip
    rows = [r for r in _read(path, args.rounds) if r["seed"] in args.seeds]
    title = (f"\n20 clients (a quarter of each one's samples its test split), 10 a round, one "
             f"local epoch, {args.rounds} rounds; accuracy in %, {over_seeds(args.seeds)}; "
             f"{len(todo)} run(s) now, {time.perf_counter() - started:.0f} s\n")  # fmt: skip
    smoke = smoke_test_line(args.rounds, TABLE_ROUNDS)
    text = "\n".join([title, *table(rows, args), *([f"\n{smoke}"] if smoke else [])])
    print(text)
    (args.out / "table.md").write_text(text + "\n")
    figure(rows, args, args.out / "personal_acc.png")
    return text


if __name__ == "__main__":
    main()
