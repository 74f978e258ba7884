"""How FederatedLoop's per-round work scales: round time against clients per round and against
model size, and the per-client state that stateful objectives keep (SCAFFOLD, MOON, FML).
``benchmarks/scale.py`` measures the other axis: time, memory and checkpoints against the total
number of clients at fixed per-round work.

Every table is measured in one run and gives ratios within that run (the machine's load changes
between runs; compare ratios, not seconds, across runs). ``--accelerator`` and ``--precision`` set
the device and precision of the clients and model tables (on CUDA the clock is read after
``torch.cuda.synchronize()``); the state table counts bytes, which do not depend on either, and is
measured on the CPU in full precision (SCAFFOLD refuses ``16-mixed``); the cohort table runs only
with ``--accelerator cpu --precision 32-true`` and is skipped with a note otherwise
(``benchmarks/cohort.py`` measures the cohort on CUDA and in mixed precision).

  clients: an MLP on digits, 50 clients, ``local_steps`` steps each; one round with K = 5, 10, 20,
           50 sampled clients. ``s/client`` flat in K means the loop adds no per-round cost that
           grows faster than the work.
  model:   10 clients x ``local_steps`` steps with MLPs of growing width; the time ratio against
           the parameter ratio shows where arithmetic starts to dominate the fixed costs.
  state:   one round of 4 clients per objective; the bytes each fitted client leaves in the
           ClientStore, times ``--state-clients`` (1,000): in memory (``client_state: memory``,
           and in every checkpoint) or as files (``client_state: disk``, where memory keeps one
           integer per client and a checkpoint a few bytes: ``benchmarks/scale.py`` measures both).
  cohort:  the client fits of one round (evaluation and checkpoint left out) sequentially and with
           ``CohortBackend`` on K = 5, 20, 50 clients of two MLP sizes, and the largest difference of
           the resulting global models.

    python benchmarks/scaling.py                   # all tables, about 1-2 minutes on 2 CPU cores
    python benchmarks/scaling.py --table clients --threads 1
    python benchmarks/scaling.py --accelerator cuda --precision bf16-mixed --table clients
    python benchmarks/scaling.py --accelerator cuda --precision bf16-mixed --table model
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from devices import clock, device_name
from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import Backend, CohortBackend, SequentialBackend
from fedlightning.clients import FML, MOON, ClientModule, ScaffoldClient
from fedlightning.server import FedAvg, Scaffold
from fedlightning.state import ClientStore

DIGITS = dict(dataset="digits", partition="iid", batch_size=32, val_fraction=0.0)
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
#: where the clients and model tables run (``--accelerator``, ``--precision``)
CPU_FULL = dict(accelerator="cpu", precision="32-true")


def timed_round(
    model, dm, per_round: int, local_steps: int, compute: dict = CPU_FULL, **loop_kwargs
) -> float:
    """Seconds of one warm round (fit, aggregate, evaluate, checkpoint) of ``per_round`` clients
    on ``compute`` (``accelerator`` and ``precision``)."""
    with tempfile.TemporaryDirectory() as run_dir:
        loop = FederatedLoop(
            rounds=1, clients_per_round=per_round, local_steps=local_steps, run_dir=run_dir,
            progress_bar=False, plots=False, num_threads=None, **compute, **loop_kwargs,
        )  # fmt: skip
        loop.console.quiet = True
        start = clock(compute["accelerator"])
        loop.fit(model, datamodule=dm)
        return clock(compute["accelerator"]) - start


def digits(num_clients: int, **overrides) -> FederatedDataModule:
    dm = FederatedDataModule(num_clients=num_clients, **{**DIGITS, **overrides})
    dm.setup()
    return dm


def mlp(dm: FederatedDataModule, hidden: list[int], **kwargs) -> ClientModule:
    torch.manual_seed(0)
    return ClientModule(
        network="mlp", network_kwargs={"hidden": hidden}, num_classes=dm.num_classes,
        in_channels=dm.in_channels, image_size=dm.image_size, lr=0.05, **kwargs,
    )  # fmt: skip


def clients_table(local_steps: int, compute: dict = CPU_FULL) -> Table:
    dm = digits(50)
    timed_round(mlp(dm, [200, 200]), dm, 2, local_steps, compute)  # warm-up
    table = Table(
        title=f"round time against clients per round (MLP 200-200, {local_steps} steps each, "
        f"{compute['accelerator']}, {compute['precision']})"
    )
    for column in ("clients K", "round s", "s / client", "time ratio vs K=5", "work ratio"):
        table.add_column(column, justify="right")
    base = None
    for k in (5, 10, 20, 50):
        seconds = timed_round(mlp(dm, [200, 200]), dm, k, local_steps, compute)
        base = base or seconds
        table.add_row(
            str(k),
            f"{seconds:.2f}",
            f"{seconds / k * 1e3:.1f} ms",
            f"{seconds / base:.2f}",
            f"{k / 5:.0f}",
        )
    return table


def model_table(local_steps: int, compute: dict = CPU_FULL) -> Table:
    dm = digits(10)
    table = Table(
        title=f"round time against model size (10 clients x {local_steps} steps, "
        f"{compute['accelerator']}, {compute['precision']})"
    )
    for column in ("MLP hidden", "parameters", "round s", "param ratio", "time ratio"):
        table.add_column(column, justify="right")
    base = None
    for hidden in ([32], [200, 200], [1024, 1024], [2048, 2048, 2048]):
        model = mlp(dm, hidden)
        timed_round(model, dm, 2, 2, compute)  # warm-up at this size (allocator, kernels)
        params = sum(p.numel() for p in model.parameters())
        seconds = timed_round(mlp(dm, hidden), dm, 10, local_steps, compute)
        base = base or (params, seconds)
        table.add_row("-".join(map(str, hidden)), f"{params:,}", f"{seconds:.2f}", f"{params / base[0]:.0f}",
                      f"{seconds / base[1]:.1f}")  # fmt: skip
    return table


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def state_table(num_clients: int) -> Table:
    # a validation split per client: FML is personalized, and the loop scores its personal models
    # there (docs/algorithms.md section 10.1)
    dm = digits(20, val_fraction=0.1)
    objectives = {
        "SCAFFOLD": (lambda: ScaffoldClient(**_kwargs(dm)), Scaffold, "c_i (trainable params)"),
        "MOON": (lambda: MOON(**_kwargs(dm)), FedAvg, "previous model"),
        "FML": (lambda: FML(**_kwargs(dm), momentum=0.9), lambda: FedAvg(weighting="uniform"),
                "personal model + SGD momentum"),
    }  # fmt: skip
    table = Table(
        title=f"per-client state (MLP 200-200; bytes after one round, x {num_clients:,} clients; "
        "CPU, 32-true)"
    )
    for column in ("objective", "what", "model MB", "state / client MB", "state / model",
                   f"memory mode, {num_clients:,} clients", "disk mode: on disk"):  # fmt: skip
        table.add_column(column, justify="right" if column not in ("objective", "what") else "left")
    for name, (make, aggregator, what) in objectives.items():
        model = make()
        model_bytes = _tensor_bytes(dict(model.network.state_dict()))
        with tempfile.TemporaryDirectory() as run_dir:
            loop = FederatedLoop(
                rounds=1, clients_per_round=4, local_steps=3, accelerator="cpu", aggregator=aggregator(),
                run_dir=run_dir, progress_bar=False, plots=False, client_state="disk",
                num_threads=None,
            )  # fmt: skip
            loop.console.quiet = True
            loop.fit(model, datamodule=dm)
            store: ClientStore = loop.store
            per_client = sum(
                _tensor_bytes(store.get(c)) for c in range(dm.num_clients) if c in store
            ) / len(store)
            on_disk = sum(
                f.stat().st_size for f in Path(run_dir, "client_state").glob("*.pt")
            ) / len(store)
        mb = 1 / 2**20
        table.add_row(
            name, what, f"{model_bytes * mb:.2f}", f"{per_client * mb:.2f}", f"{per_client / model_bytes:.1f}",
            f"{per_client * num_clients * mb:,.0f} MB", f"{on_disk * num_clients * mb:,.0f} MB",
        )  # fmt: skip
    return table


def _kwargs(dm: FederatedDataModule) -> dict:
    return dict(network="mlp", network_kwargs={"hidden": [200, 200]}, num_classes=dm.num_classes,
                in_channels=dm.in_channels, image_size=dm.image_size, lr=0.05)  # fmt: skip


def timed(backend: Backend) -> Backend:
    """``backend`` adding up the seconds its rounds of client fits take in ``fit_seconds``
    (evaluation and checkpoints left out)."""
    run = backend.run
    backend.fit_seconds = 0.0

    def timed_run(*args, **kwargs):
        start = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            backend.fit_seconds += time.perf_counter() - start

    backend.run = timed_run
    return backend


def cohort_table(local_steps: int, repeats: int) -> Table:
    dm = digits(50)
    table = Table(
        title=f"client fits of one round: sequential against CohortBackend (SGD momentum 0.9, {local_steps} steps "
        f"each; best of {repeats})"
    )
    for column in (
        "MLP hidden",
        "clients K",
        "sequential s",
        "cohort s",
        "speed-up",
        "max |diff| global model",
    ):
        table.add_column(column, justify="right")

    def run(k: int, cohort: bool, hidden: list[int]) -> tuple[float, dict[str, torch.Tensor]]:
        with tempfile.TemporaryDirectory() as run_dir:
            backend = timed(CohortBackend() if cohort else SequentialBackend())
            loop = FederatedLoop(
                rounds=1, clients_per_round=k, local_steps=local_steps, accelerator="cpu", run_dir=run_dir,
                progress_bar=False, plots=False, backend=backend, num_threads=None,
            )  # fmt: skip
            loop.console.quiet = True
            loop.fit(mlp(dm, hidden, momentum=0.9), datamodule=dm)
            return backend.fit_seconds, loop.aggregator.global_state()

    run(2, False, [64]), run(2, True, [64])  # warm-up both paths
    for hidden, k in (([64], 5), ([64], 20), ([64], 50), ([200, 200], 20), ([200, 200], 50)):
        best = {False: math.inf, True: math.inf}
        for _ in range(repeats):  # alternate the paths so that load changes hit both
            states = {}
            for cohort in (False, True):
                seconds, states[cohort] = run(k, cohort, hidden)
                best[cohort] = min(best[cohort], seconds)
            seq, coh = states[False], states[True]
            diff = max(float((seq[key].double() - coh[key].double()).abs().max()) for key in seq)
        table.add_row("-".join(map(str, hidden)), str(k), f"{best[False]:.2f}", f"{best[True]:.2f}",
                      f"{best[False] / best[True]:.1f}x", f"{diff:.1e}")  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--table", choices=["clients", "model", "state", "cohort", "all"], default="all"
    )
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--state-clients", type=int, default=1000)
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed runs per cohort row; the best is kept"
    )
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=PRECISIONS, default="32-true")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: steadiest on a shared machine; 0: torch's default)",
    )
    args = parser.parse_args()
    if args.accelerator == "cuda" and not torch.cuda.is_available():
        parser.error("--accelerator cuda: no CUDA device is available")
    if args.accelerator == "cpu" and args.precision == "16-mixed":
        parser.error("--precision 16-mixed needs CUDA (Lightning runs bf16-mixed instead on CPU)")
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    compute = dict(accelerator=args.accelerator, precision=args.precision)
    console = Console(width=160)
    console.print(
        f"{device_name(args.accelerator)}, {args.precision}, {torch.get_num_threads()} torch threads"
    )
    builders = {
        "clients": lambda: clients_table(args.local_steps, compute),
        "model": lambda: model_table(args.local_steps, compute),
        "state": lambda: state_table(args.state_clients),
        "cohort": lambda: cohort_table(args.local_steps, args.repeats),
    }
    for name, build in builders.items():
        if args.table not in (name, "all"):
            continue
        if name == "cohort" and compute != CPU_FULL:
            console.print(
                f"cohort table skipped: this table runs on the CPU in 32-true only (here "
                f"{args.accelerator}, {args.precision}); benchmarks/cohort.py covers the rest"
            )
            continue
        console.print(build())


if __name__ == "__main__":
    main()
