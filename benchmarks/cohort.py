"""Vectorized cohorts against sequential fits, hand-written loops and Flower's simulation.

Every table is measured in one run and prints ratios within that run (compare ratios, not seconds,
across runs). All paths train the same work: the same partition (IID, equal clients), the same
clients per round (``fedlightning.loop.sampling.sample_clients``; Flower samples its own clients,
the same number of equal-size ones), the same initial weights, the same batches (each client's
shuffle seeded as the loop seeds it), FedAvg weighted by samples and the same evaluation (global
test accuracy and loss every round). ``max |w - w_seq|`` is the largest difference of each path's
final model from the sequential loop's: 0 for the hand-written per-client loop (the same
arithmetic), a float rounding for the vmapped paths.

The paths run interleaved (sequential, cohort, by hand, vmap by hand, flower, sequential, ...):
the first ``--warmup`` rounds of that cycle are dropped, then ``--repeats`` are timed. A path's
``s/round`` is, per run, the mean time of its rounds after the first (the loop's through a
Lightning ``Logger`` called at the end of every round, so its checkpoint and logging count),
printed as the median over the repeats with the range in parentheses; the ratio columns are the
median (range) of the per-repeat ratios, so a load change hits the runs of one repeat alike.

  paths:   sequential  FederatedLoop + SequentialBackend
           cohort      FederatedLoop + CohortBackend
           by hand     a per-client PyTorch loop (SGD, FedAvg mean), no framework
           vmap hand   all clients of a round in one torch.func vmap per step, written by hand
           flower      Flower's run_simulation (``make bench-peers``; skipped with a note if absent)
  floor:   3 x forward FLOPs of a round's training over the device's measured matmul rate, and each
           path's round time over it.
  scaling: round time of sequential and cohort against clients per round and model width
           (interleaved the same way), with the GPU memory peak per configuration on CUDA.

Workloads (``--workload``): ``quickstart`` (the quickstart's CNN, 1x8x8 inputs) and ``fedcross``
(the FedCross paper's CNN setup: the FedAvg CNN on synthetic CIFAR-shaped 3x32x32 data). Defaults
are the paper setup: 100 clients, 10 per round, 500 samples each, batch 50, 5 epochs, SGD lr 0.01,
momentum 0.5; ``--quick`` shrinks it for a CPU.

    python benchmarks/cohort.py --quick --threads 1        # CPU, reduced size
    python benchmarks/cohort.py --accelerator cuda --precision bf16-mixed --rounds 5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.func import functional_call, grad, vmap

from devices import clock, device_name
from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.clients import ClientModule
from fedlightning.loop.sampling import sample_clients
from fedlightning.seeding import derive_seed
from fedlightning.server import FedAvg
from fedlightning.training import cpu_compute
from overhead import RoundClock, average_on_device, forward_flops_per_sample, matmul_rate
from startup import spread

SHAPES = {"quickstart": (1, 8), "fedcross": (3, 32)}
AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
ROOT = Path(__file__).resolve().parent.parent


def make(args, workload: str, width: int = 32, seed: int = 0):
    channels, side = SHAPES[workload]
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=args.clients * args.samples, num_test=args.test,
        num_classes=10, sample_shape=(channels, side, side), num_clients=args.clients,
        partition="iid", batch_size=args.batch, val_fraction=0.0, seed=seed,
    )  # fmt: skip
    dm.setup()
    torch.manual_seed(seed)
    model = ClientModule(
        network="cnn", network_kwargs={"width": width}, num_classes=10, in_channels=channels,
        image_size=side, lr=args.lr, momentum=args.momentum,
    )  # fmt: skip
    return dm, model


def run_loop(args, workload, backend, per_round=None, width=32):
    """``(s/round, final test_acc, final model)`` of one FederatedLoop run."""
    dm, model = make(args, workload, width)
    marks = RoundClock(args.accelerator)
    with tempfile.TemporaryDirectory() as run_dir:
        loop = FederatedLoop(
            rounds=args.rounds, clients_per_round=per_round or args.per_round,
            local_epochs=args.epochs, aggregator=FedAvg(weighting="samples"), backend=backend,
            accelerator=args.accelerator, precision=args.precision, run_dir=run_dir,
            progress_bar=False, plots=False, loggers=[marks],
        )  # fmt: skip
        loop.console.quiet = True
        loop.fit(model, datamodule=dm)
    periods = [b - a for a, b in zip(marks.marks, marks.marks[1:], strict=False)]
    seconds = sum(periods) / len(periods) if periods else float("nan")
    return seconds, loop.history[-1]["test_acc"], loop.aggregator.global_state()


def warm(times: list[float]) -> float:
    """The mean round time without the first round (start-up, first-call costs) when there are more."""
    times = times[1:] if len(times) > 1 else times
    return sum(times) / len(times)


def evaluate(net, params, dm, device) -> float:
    """The test accuracy of ``net`` with ``params`` (and its mean loss, as the loop computes it)."""
    correct = count = 0
    loss = torch.zeros((), device=device)
    with torch.no_grad():
        for x, y in dm.test_dataloader():
            out = functional_call(net, params, (x.to(device),))
            correct += int((out.argmax(1) == y.to(device)).sum())
            loss += torch.nn.functional.cross_entropy(out.float(), y.to(device), reduction="sum")
            count += len(y)
    float(loss)
    return correct / count


def by_hand(args, workload, vectorized: bool):
    """FedAvg written by hand: per client (SGD with momentum) or all clients in one vmap; with
    torch's native CPU convolutions, as the loop's default (``loop.onednn``)."""
    with cpu_compute(None, onednn=False):
        return _by_hand(args, workload, vectorized)


def _by_hand(args, workload, vectorized: bool):
    device = torch.device(args.accelerator)
    dm, model = make(args, workload)
    net = model.network.to(device).train()
    weights = {k: v.detach().to(device, copy=True) for k, v in net.state_dict().items()}
    names = [n for n, _ in net.named_parameters()]
    autocast = AUTOCAST.get(args.precision)
    times = []
    for r in range(args.rounds):
        start = clock(args.accelerator)
        ids = sample_clients(0, r, args.clients, args.per_round)
        loaders = [
            dm.client_train_dataloader(c, derive_seed(0, "fit", r, c)) for c in ids
        ]  # the loop's seeds: the same batches
        if vectorized:
            params = {n: weights[n].expand(len(ids), *weights[n].shape).clone() for n in names}
            bufs = {n: torch.zeros_like(p) for n, p in params.items()}

            def loss(p, x, y):
                with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                    out = functional_call(net, p, (x,))
                return torch.nn.functional.cross_entropy(out.float(), y)

            step = vmap(grad(loss))
            for _ in range(args.epochs):
                for batches in zip(*loaders, strict=True):
                    x = torch.stack([b[0] for b in batches]).to(device)
                    y = torch.stack([b[1] for b in batches]).to(device)
                    g = step(params, x, y)
                    with torch.no_grad():
                        for n in names:
                            bufs[n].mul_(args.momentum).add_(g[n])  # zeros first: SGD's buf = g
                            params[n].sub_(args.lr * bufs[n])
            new = {n: params[n].double().mean(0).float() for n in names}
        else:
            uploads = []
            for loader in loaders:
                net.load_state_dict(weights)
                opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
                for _ in range(args.epochs):
                    for x, y in loader:
                        opt.zero_grad()
                        with torch.autocast(
                            device.type, dtype=autocast, enabled=autocast is not None
                        ):
                            out = net(x.to(device))
                        torch.nn.functional.cross_entropy(out.float(), y.to(device)).backward()
                        opt.step()
                uploads.append({n: p.detach().clone() for n, p in net.named_parameters()})
            # FedAvg as the loop's server computes it (float64, client order): the same bits
            new = average_on_device(uploads, [len(loader.y) for loader in loaders])
        weights.update(new)
        accuracy = evaluate(net.eval(), weights, dm, device)
        net.train()
        times.append(clock(args.accelerator) - start)
    return warm(times), accuracy, {k: v.cpu() for k, v in weights.items()}


def flower(args, workload):
    python = Path(args.peers_python)
    if not python.exists():
        return None, "skipped: no Flower environment (make bench-peers)"
    request = {**vars(args), "workload": workload}
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'benchmarks'}"}
    done = subprocess.run(
        [str(python), str(ROOT / "benchmarks" / "flower_peer.py"), json.dumps(request)],
        capture_output=True, text=True, env=env, timeout=3600,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return None, f"failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return json.loads(lines[-1]), ""


def gap(a: dict, b: dict) -> float:
    # the loop's server state lives on the run's device, the hand-written loops return CPU copies
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in b if k in a)


def paths_table(args, workload, rate, console):
    dm, model = make(args, workload)
    x = next(iter(dm.client_train_dataloader(0, 0)))[0]
    flops = 3 * forward_flops_per_sample(model.network, x) * args.samples * args.epochs
    floor = flops * args.per_round / rate
    paths = {
        "sequential": lambda: run_loop(args, workload, SequentialBackend()),
        "cohort": lambda: run_loop(args, workload, CohortBackend()),
        "by hand": lambda: by_hand(args, workload, vectorized=False),
        "vmap by hand": lambda: by_hand(args, workload, vectorized=True),
    }
    note = "skipped (--no-flower)"
    if args.flower and not Path(args.peers_python).exists():
        note = "skipped: no Flower environment (make bench-peers)"
    elif args.flower:
        note = ""
        paths["flower"] = lambda: _flower_row(args, workload)
    runs: dict[str, list] = {name: [] for name in paths}
    for index in range(args.warmup + args.repeats):  # interleaved: every path once per cycle
        for name, run in paths.items():
            row = run()
            if index >= args.warmup:
                runs[name].append(row)
    table = Table(
        title=f"{workload}: {args.clients} clients, {args.per_round}/round, {args.samples} samples, "
        f"batch {args.batch}, {args.epochs} epochs, {args.rounds} rounds; {device_name(args.accelerator)}, "
        f"{args.precision}; interleaved, median (range) of {args.repeats} after {args.warmup} warm-up",
        caption=f"floor {floor * 1e3:.1f} ms/round ({flops * args.per_round / 1e9:.2f} GFLOP at "
        f"{rate / 1e12:.3f} TFLOP/s){'; flower ' + note if note else ''}",
    )
    for column in ("path", "s/round", "vs sequential", "vs cohort", "vs vmap by hand",
                   "round/floor", "test_acc", "max |w - w_seq|"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=True)
    sequential = runs["sequential"]
    for name, rows in runs.items():
        seconds = [row[0] for row in rows]
        weights = rows[0][2]
        diff = "-" if weights is None else f"{gap(weights, sequential[0][2]):.1e}"
        table.add_row(
            name, spread(seconds, 3), _ratios(seconds, runs["sequential"]),
            _ratios(seconds, runs["cohort"]), _ratios(seconds, runs["vmap by hand"]),
            f"{statistics.median(seconds) / floor:.1f}", f"{rows[0][1]:.4f}", diff,
        )  # fmt: skip
    console.print(table)


def _ratios(seconds: list[float], others: list[tuple]) -> str:
    """``median (range)`` of the per-repeat ratios of ``seconds`` to another path's times."""
    return spread([a / b[0] for a, b in zip(seconds, others, strict=True)])


def _flower_row(args, workload):
    result, note = flower(args, workload)
    if result is None:
        raise SystemExit(f"flower {note}")
    return result["round_s"], result["test_acc"], None


def scaling_table(args, console):
    table = Table(
        title=f"fedcross CNN: round time vs clients per round and width ({device_name(args.accelerator)}, "
        f"{args.precision}); interleaved, median of {args.repeats} after {args.warmup} warm-up"
    )
    for column in ("clients/round", "width", "sequential s", "cohort s", "cohort speed-up",
                   "peak GPU MiB seq/coh"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=True)
    for per_round in args.scale_clients:
        for width in args.scale_widths:
            local = argparse.Namespace(**{**vars(args), "clients": max(args.clients, per_round)})
            times: list[list[float]] = [[], []]
            peaks: list[float | None] = [None, None]
            for index in range(args.warmup + args.repeats):
                for side, backend in enumerate((SequentialBackend(), CohortBackend())):
                    if args.accelerator == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    seconds = run_loop(local, "fedcross", backend, per_round, width)[0]
                    if args.accelerator == "cuda":
                        peaks[side] = torch.cuda.max_memory_allocated() / 2**20
                    if index >= args.warmup:
                        times[side].append(seconds)
            peak = "-" if peaks[0] is None else f"{peaks[0]:.0f}/{peaks[1]:.0f}"
            speedups = [a / b for a, b in zip(times[0], times[1], strict=True)]
            table.add_row(str(per_round), str(width), spread(times[0], 3), spread(times[1], 3),
                          f"{spread(speedups)}x", peak)  # fmt: skip
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--precision", choices=("32-true", "bf16-mixed", "16-mixed"), default="32-true"
    )
    parser.add_argument("--workload", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="timed cycles over the paths")
    parser.add_argument("--warmup", type=int, default=1, help="untimed cycles first")
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--scale-clients", type=int, nargs="*", default=[10, 50, 100, 500])
    parser.add_argument("--scale-widths", type=int, nargs="*", default=[16, 32, 64])
    parser.add_argument(
        "--tables", nargs="+", choices=("paths", "scaling"), default=["paths", "scaling"]
    )
    parser.add_argument("--no-flower", dest="flower", action="store_false")
    parser.add_argument("--peers-python", default=str(ROOT / ".venv-peers" / "bin" / "python"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CPU size: 20 clients, 4/round, 100 samples, 1 epoch, 3 rounds",
    )
    args = parser.parse_args()
    if args.quick:
        args.clients, args.per_round, args.samples, args.epochs, args.rounds = 20, 4, 100, 1, 3
        args.test, args.scale_clients, args.scale_widths = 200, [4, 8, 16], [16, 32]
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    console = Console(width=150)
    device = torch.device(args.accelerator)
    rate = matmul_rate(
        device, AUTOCAST.get(args.precision, torch.float32), 8192 if device.type == "cuda" else 1024
    )
    if "paths" in args.tables:
        for workload in args.workload:
            paths_table(args, workload, rate, console)
    if "scaling" in args.tables:
        scaling_table(args, console)


if __name__ == "__main__":
    sys.exit(main())
