"""How FederatedLoop's costs grow with the total number of clients N at fixed per-round work.

Synthetic data with a fixed number of samples per client (``--samples-per-client``, one of them
held out as the client's validation split), an IID partition (every client the same size), a tiny
MLP (16 inputs, 16 hidden units, 4 classes); N = 100, 1,000, 10,000 and 100,000 clients in all;
K = 10 and 100 clients per round on the sequential backend and 1,000 on the cohort backend (where
K <= N), one local epoch (one step) each; FedAvg (no per-client state) and SCAFFOLD with
``client_state`` in memory and on disk. A SCAFFOLD run starts with a ``c_i`` for each of its N
clients (``ClientStore.put`` before the run, untimed, then ``os.sync``): the steady state of a long
run, in which every client has trained, not the few clients a short run samples. Each
configuration runs in a fresh process (so that its peak RSS is its own) and prints:

  start-up s   from constructing the data module (the synthetic data drawn, partitioned, split)
               through ``FederatedLoop.fit``'s start-up (checks, identity, aggregator set-up,
               ``partition.csv``, ``partition.png``, loggers) to the first round; imports and the
               untimed c_i left out. ``start-up CPU s`` the same span in this process's CPU
               time (user and system), which other processes on the machine do not stretch.
  round s      the median wall time of the timed rounds (``--rounds``, after one warm-up round):
               sampling, payloads, ClientStore reads, the client fits, failure checks,
               ClientStore writes, aggregation and ``last.ckpt`` written every round. Evaluation
               is kept out: the run evaluates only after its last round (``eval_every`` >
               rounds), which is not timed; ``eval round s`` is that last round, which scores
               every client's validation split (evaluation's own cost per round is issue 24 item
               2's clients-scored option, not this table's).
  vs N=min     round s over the same configuration's round s at the smallest N in the table;
               ``round CPU s`` and ``CPU vs N=min`` the same in CPU time (the disk's waits, the
               fsync of ``last.ckpt`` among them, are in the wall time only).
  peak RSS MB  the process's peak resident memory (``ru_maxrss``) at the end of the run, before the
               run directory is measured and deleted; ``data MB`` the synthetic data
               set (inputs and labels of the training pool and the test set);
               ``RSS - data vs N=min`` how much more the peak RSS less the data is than at the
               smallest N: what grows with N beyond the data itself.
  ckpt KB      ``last.ckpt`` after the run; ``state MB`` the ``client_state`` folder (disk mode:
               one file per client, the state itself).

With ``client_state: memory`` every checkpoint holds every client's state, so a SCAFFOLD row's
round time, RSS and checkpoint grow with N by design (the disk rows are the remedy).

Targets (issue 24): round s within 1.2x from 100 to 100,000 clients; start-up <= 20 s at 100,000;
with disk client state, RSS less data and ckpt KB independent of N. The machine's load moves
seconds between rows (the load average is printed before and after): compare within a run, and
read the CPU columns where the machine is shared.

    nice -n 15 python benchmarks/scale.py --json rows.json     # the whole table (about an hour)
    python benchmarks/scale.py --show rows.json                # its table again
    python benchmarks/scale.py --clients 100 1000 --per-round 10 --rounds 2   # about a minute
    python benchmarks/scale.py --clients 100 100000 --algorithms scaffold --client-state disk
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

CLIENTS = (100, 1_000, 10_000, 100_000)
#: (backend, clients per round)
ROUNDS_OF = (("sequential", 10), ("sequential", 100), ("cohort", 1_000))
#: per algorithm, the client_state modes worth a row (FedAvg keeps no per-client state)
STATE_MODES = {"fedavg": ("memory",), "scaffold": ("memory", "disk")}
COLUMNS = (
    "clients N", "backend", "K", "algorithm", "client state", "start-up s", "start-up CPU s",
    "round s", "vs N=min", "round CPU s", "CPU vs N=min", "eval round s", "peak RSS MB", "data MB",
    "RSS - data vs N=min", "ckpt KB", "state MB",
)  # fmt: skip


def run_one(spec: dict) -> dict:
    """Run one configuration in this process; returns its measurements."""
    import torch

    from fedlightning import FederatedDataModule, FederatedLoop
    from fedlightning.backends import CohortBackend, SequentialBackend
    from fedlightning.clients import ClientModule, ScaffoldClient
    from fedlightning.server import FedAvg, Scaffold

    n, k, samples = spec["clients"], spec["per_round"], spec["samples_per_client"]
    rounds = 1 + spec["rounds"] + 1  # warm-up, timed, the evaluated last round
    started = _clock()
    dm = FederatedDataModule(
        dataset="synthetic", num_clients=n, num_samples=n * samples, num_test=500, num_classes=4,
        sample_shape=(1, 4, 4), partition="iid", val_fraction=1.5 / samples, batch_size=samples,
        seed=0,
    )  # fmt: skip
    scaffold = spec["algorithm"] == "scaffold"
    torch.manual_seed(0)
    model = (ScaffoldClient if scaffold else ClientModule)(
        network="mlp", network_kwargs={"hidden": [16]}, num_classes=4, in_channels=1,
        image_size=4, lr=0.05,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(dir=spec.get("tmp")) as run_dir:
        loop = FederatedLoop(
            rounds=rounds, clients_per_round=k, local_epochs=1, accelerator="cpu",
            aggregator=Scaffold() if scaffold else FedAvg(),
            backend=CohortBackend() if spec["backend"] == "cohort" else SequentialBackend(),
            client_state=spec["client_state"], eval_every=rounds + 1, run_dir=run_dir,
            progress_bar=False, num_threads=1, seed=0,
        )  # fmt: skip
        loop.console.quiet = True
        constructed = _clock() - started
        if scaffold:  # every client has trained before (see the module docstring)
            c_i = {"c_i": {name: torch.zeros_like(p) for name, p in model.trainable()}}
            for cid in range(n):
                loop.store.put(cid, c_i)
            os.sync()  # their write-back would otherwise land in the timed checkpoints' fsyncs
        marks = _round_marks(loop)
        fit_called = _clock()
        loop.fit(model, datamodule=dm)
        # read before the folder is listed and deleted: Path.glob and rmtree list a directory
        # (100,000 entries: ~15 MB each), the benchmark's work, not the run's
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ckpt = Path(run_dir, "last.ckpt").stat().st_size
        state = _folder_bytes(Path(run_dir, "client_state"))
    data = dm.data
    data_bytes = sum(
        t.element_size() * t.numel() for t in (data.train_x, data.train_y, data.test_x, data.test_y)
    )
    rounds_s = [b - a for a, b in zip(marks, marks[1:], strict=False)]  # (wall, CPU) each
    startup = constructed + marks[0] - fit_called
    return {
        **spec,
        "startup_s": float(startup[0]),
        "startup_cpu_s": float(startup[1]),
        # no warm-up, no evaluated round
        "round_s": statistics.median(float(wall) for wall, _ in rounds_s[1:-1]),
        "round_cpu_s": statistics.median(float(cpu) for _, cpu in rounds_s[1:-1]),
        "eval_round_s": float(rounds_s[-1][0]),
        "peak_rss_mb": peak_rss / 1024,
        "data_mb": data_bytes / 2**20,
        "ckpt_kb": ckpt / 1024,
        "state_mb": state / 2**20,
    }


def _folder_bytes(folder: Path) -> int:
    """The size of the files in ``folder`` (0 if there is none), one entry at a time."""
    if not folder.is_dir():
        return 0
    with os.scandir(folder) as entries:
        return sum(entry.stat().st_size for entry in entries if entry.is_file())


def _clock() -> np.ndarray:
    """``[wall, CPU]`` seconds: the wall clock and this process's CPU time (user and system), which
    the machine's load does not stretch (waits for the disk are in the wall time only)."""
    return np.array([time.perf_counter(), time.process_time()])


def _round_marks(loop) -> list[np.ndarray]:
    """Clock readings when the rounds start and after each round (the loop advances its progress
    after a round's checkpoint)."""
    marks: list[np.ndarray] = []
    progress = loop.reporter.progress

    @contextmanager
    def timed_progress(total: int, start: int):
        with progress(total, start) as advance:
            marks.append(_clock())

            def timed_advance(description: str) -> None:
                marks.append(_clock())
                advance(description)

            yield timed_advance

    loop.reporter.progress = timed_progress
    return marks


def specs(args) -> list[dict]:
    out = []
    for n in args.clients:
        for backend, k in ROUNDS_OF:
            if k > n or k not in args.per_round:
                continue
            for algorithm in args.algorithms:
                for mode in STATE_MODES[algorithm]:
                    if mode not in args.client_state:
                        continue
                    out.append(dict(
                        clients=n, backend=backend, per_round=k, algorithm=algorithm,
                        client_state=mode, rounds=args.rounds,
                        samples_per_client=args.samples_per_client, tmp=args.tmp,
                    ))  # fmt: skip
    return out


def run_in_process(spec: dict) -> dict:
    """``spec`` measured in a fresh Python process (its own peak RSS)."""
    done = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(spec)],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> Table:
    result = Table(title="FederatedLoop against the total number of clients (fixed work per round)")
    for column in COLUMNS:
        result.add_column(column, justify="left" if column in ("backend", "algorithm") else "right")
    smallest: dict[tuple, dict] = {}
    for row in rows:
        same = (row["backend"], row["per_round"], row["algorithm"], row["client_state"])
        base = smallest.setdefault(same, row)
        beyond_data = (row["peak_rss_mb"] - row["data_mb"]) - (
            base["peak_rss_mb"] - base["data_mb"]
        )
        cpu = "round_cpu_s" in row and "round_cpu_s" in base  # rows of older runs lack them
        result.add_row(
            f"{row['clients']:,}", row["backend"], f"{row['per_round']:,}", row["algorithm"],
            row["client_state"], f"{row['startup_s']:.2f}",
            f"{row['startup_cpu_s']:.2f}" if "startup_cpu_s" in row else "-",
            f"{row['round_s']:.3f}", f"{row['round_s'] / base['round_s']:.2f}",
            f"{row['round_cpu_s']:.3f}" if "round_cpu_s" in row else "-",
            f"{row['round_cpu_s'] / base['round_cpu_s']:.2f}" if cpu else "-",
            f"{row['eval_round_s']:.2f}",
            f"{row['peak_rss_mb']:.0f}", f"{row['data_mb']:.1f}", f"{beyond_data:+.0f}",
            f"{row['ckpt_kb']:.1f}",
            f"{row['state_mb']:.2f}",
        )  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    parser.add_argument("--per-round", type=int, nargs="+", default=[k for _, k in ROUNDS_OF])
    parser.add_argument(
        "--algorithms", nargs="+", choices=list(STATE_MODES), default=list(STATE_MODES)
    )
    parser.add_argument(
        "--client-state", nargs="+", choices=["memory", "disk"], default=["memory", "disk"]
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up)")
    parser.add_argument("--samples-per-client", type=int, default=5)
    parser.add_argument(
        "--tmp", default=None, help="where run directories go (default: the system's)"
    )
    parser.add_argument("--json", help="also write the rows to this file (after each row)")
    parser.add_argument("--show", help="print the table of a --json file (measure nothing)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.show:
        Console(width=250).print(table(json.loads(Path(args.show).read_text())))
        return
    if args.one:  # a child process: one configuration, one thread, quiet
        logging.getLogger("fedlightning").setLevel(logging.ERROR)
        print(json.dumps(run_one(json.loads(args.one))))
        return
    if args.rounds < 1 or args.samples_per_client < 2:
        parser.error("--rounds must be >= 1 and --samples-per-client >= 2 (one is validation)")
    console = Console(width=250)
    console.print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows = []
    for spec in specs(args):
        rows.append(run_in_process(spec))
        console.print(f"  done: {json.dumps(rows[-1])}", highlight=False)
        if args.json:  # after every row, so that an interrupted run keeps what it measured
            Path(args.json).write_text(json.dumps(rows, indent=1))
    console.print(table(rows))
    console.print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
