"""pfl-research's CIFAR-10 benchmark as the yardstick of a round's speed (docs/algorithms.md
section 9.4).

pfl-research (Granqvist et al., 2024, arXiv:2404.06430; Apple's simulator, measured there as 7-72x
faster than Flower, FedML, FedScale, FLUTE and TFF) times FedAvg on CIFAR-10 with its
``benchmarks/image_classification/configs/baseline.yaml``: 1,000 users of 50 images each, a
cohort of 50 users a central iteration, one local epoch of batch 10 (5 steps) of SGD at local
learning rate 0.1, the unweighted mean of the updates at central learning rate 1.0, 1,500
iterations, an evaluation of the central model on the 10,000 test images every 10 iterations,
and its ``simple_cnn`` (:class:`PflCNN`, 1.63M parameters). Speed does not depend on the pixels,
so the clients hold synthetic CIFAR-shaped data (3x32x32, 10 classes).

In one run, interleaved (every path once per cycle, the first cycle a warm-up when another fits
the budget), each path trains ``--rounds`` rounds:

  sequential    FederatedLoop + SequentialBackend (one client fit after another)
  cohort        FederatedLoop + CohortBackend (the round's clients stacked, one vmap per step)
  vmap by hand  all clients of a round in one torch.func vmap(grad) per step, written by hand
                (the round's batches stacked on the device first, foreach SGD, the mean)

``s/round`` is a path's time per round after the first evaluation period (a period is
``--eval-every`` rounds and its evaluation: the evaluation's cost is spread over its rounds as in
pfl-research's run). The floor is the round's FLOPs (3 x forward FLOPs per training sample x 50
samples x 50 clients, plus a forward pass over the test set every ``--eval-every`` rounds) over
the device's measured fp32 matrix rate. ``1500 rounds`` projects each path's time for the whole
benchmark. pfl-research's own published time for this benchmark is passed with
``--published-minutes`` (from its paper's speed comparison: the figure was not at hand where this
script was written, so it is not stored here); the table then prints the published time over each
path's projected time (above 1: that path is faster).

    python benchmarks/yardstick.py --accelerator cuda --budget-s 90       # the benchmark's size
    python benchmarks/yardstick.py --tiny --threads 1                      # a CPU check, tiny

``--dropout 0`` drops the network's two dropout layers: every path then computes the same
arithmetic and ``max |w - w_seq|`` (each path's final model against the sequential one's) is a
float rounding; with dropout each path draws its own masks. A ``SUMMARY {json}`` line gives the
numbers to ``benchmarks/gpu_all.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile

import torch
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.func import functional_call, grad, vmap

from budget import Budget
from cohort_work import evaluate, gap
from devices import clock, device_name
from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.clients import ClientModule
from fedlightning.determinism import prepare_environment
from fedlightning.loop.sampling import sample_clients
from fedlightning.seeding import derive_seed
from fedlightning.server import FedAvg
from overhead import RoundClock, forward_flops_per_sample, matmul_rate
from startup import spread

#: the benchmark's size (pfl-research's baseline.yaml); ``--tiny`` shrinks it for a CPU check
FULL = dict(clients=1000, samples=50, per_round=50, batch=10, epochs=1, rounds=30, test=10000,
            eval_every=10)  # fmt: skip
TINY = dict(clients=12, samples=20, per_round=4, batch=10, epochs=1, rounds=4, test=100,
            eval_every=2)  # fmt: skip
#: central iterations of pfl-research's benchmark
BENCHMARK_ROUNDS = 1500


class PflCNN(nn.Sequential):
    """pfl-research's ``simple_cnn`` for 32x32x3 inputs: conv 3x3 (32), ReLU, conv 3x3 (64), ReLU,
    max-pool 2, dropout 0.25, dense 128, ReLU, dropout 0.5, dense 10; Glorot-uniform weights
    (1,626,442 parameters)."""

    def __init__(self, num_classes: int = 10, dropout: bool = True) -> None:
        rate = (0.25, 0.5) if dropout else (0.0, 0.0)
        super().__init__(
            nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Dropout(rate[0]), nn.Flatten(), nn.Linear(64 * 14 * 14, 128), nn.ReLU(),
            nn.Dropout(rate[1]), nn.Linear(128, num_classes),
        )  # fmt: skip
        for layer in self:
            if isinstance(layer, nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(layer.weight)


def make(args, seed: int = 0) -> tuple[FederatedDataModule, ClientModule]:
    """The federation and the objective (SGD at lr 0.1, no momentum), seeded."""
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=args.clients * args.samples, num_test=args.test,
        num_classes=10, sample_shape=(3, 32, 32), num_clients=args.clients, partition="iid",
        batch_size=args.batch, val_fraction=0.0, seed=seed,
    )  # fmt: skip
    dm.setup()
    torch.manual_seed(seed)
    network = PflCNN(dropout=args.dropout > 0)
    return dm, ClientModule(network=network, num_classes=10, in_channels=3, image_size=32, lr=0.1)


def round_flops(args) -> float:
    """A round's FLOPs: training (3 x forward per sample) and the evaluation's share."""
    dm, model = make(args)
    x = next(iter(dm.client_train_dataloader(0, 0)))[0]
    forward = forward_flops_per_sample(model.network, x)
    train = 3 * forward * args.samples * args.epochs * args.per_round
    return train + forward * args.test / args.eval_every


def _per_round(marks: list[float], eval_every: int) -> float:
    """Seconds per round from the clock read at each evaluation: the periods after the first
    evaluation (start-up and first-call costs fall before it), each ``eval_every`` rounds and
    one evaluation."""
    periods = [b - a for a, b in zip(marks, marks[1:], strict=False)] or [float("nan")]
    return statistics.mean(periods) / eval_every


def run_loop(args, backend) -> tuple[float, float, dict]:
    """``(s/round, final test_acc, final model)`` of a FederatedLoop run on ``backend``."""
    dm, model = make(args)
    marks = RoundClock(args.accelerator)
    with tempfile.TemporaryDirectory() as run_dir:
        loop = FederatedLoop(
            rounds=args.rounds, clients_per_round=args.per_round, local_epochs=args.epochs,
            aggregator=FedAvg(weighting="uniform"), backend=backend, eval_every=args.eval_every,
            accelerator=args.accelerator, run_dir=run_dir, progress_bar=False, plots=False,
            loggers=[marks], checkpoint_every=args.rounds, num_threads=None,
        )  # fmt: skip
        loop.console.quiet = True
        loop.fit(model, datamodule=dm)
    seconds = _per_round(marks.marks, args.eval_every)
    return seconds, loop.history[-1]["test_acc"], loop.aggregator.global_state()


def vmap_by_hand(args) -> tuple[float, float, dict]:
    """The same rounds written by hand: every sampled client in one ``vmap(grad)`` per step
    (dropout masks drawn per client), SGD as foreach ops, the unweighted mean."""
    device = torch.device(args.accelerator)
    dm, model = make(args)
    net = model.network.to(device).train()
    weights = {k: v.detach().to(device, copy=True) for k, v in net.state_dict().items()}

    def loss(params, x, y):
        return nn.functional.cross_entropy(functional_call(net, params, (x,)), y)

    step = vmap(grad(loss), randomness="different")
    marks, accuracy = [], float("nan")
    for r in range(args.rounds):
        ids = sample_clients(0, r, args.clients, args.per_round)
        loaders = [dm.client_train_dataloader(c, derive_seed(0, "fit", r, c)) for c in ids]
        steps = [
            (torch.stack([b[0] for b in batches]).to(device),
             torch.stack([b[1] for b in batches]).to(device))
            for _ in range(args.epochs) for batches in zip(*loaders, strict=True)
        ]  # fmt: skip
        params = {n: w.expand(len(ids), *w.shape).clone() for n, w in weights.items()}
        for x, y in steps:
            grads = step(params, x, y)
            with torch.no_grad():
                torch._foreach_add_(list(params.values()), list(grads.values()), alpha=-0.1)
        weights = {n: p.mean(0) for n, p in params.items()}
        if (r + 1) % args.eval_every == 0:
            accuracy = evaluate(net.eval(), weights, dm, device)
            net.train()
            marks.append(clock(args.accelerator))
    return _per_round(marks, args.eval_every), accuracy, {k: v.cpu() for k, v in weights.items()}


PATHS = {
    "sequential": lambda args: run_loop(args, SequentialBackend()),
    "cohort": lambda args: run_loop(args, CohortBackend()),
    "vmap by hand": vmap_by_hand,
}


def measure(args, budget: Budget) -> dict[str, list[tuple[float, float, dict]]]:
    """Every path once per cycle; the first cycle is dropped when another fits the budget."""
    runs: dict[str, list] = {name: [] for name in PATHS}
    cycles = 0
    while True:
        start = clock(args.accelerator)
        rows = {name: path(args) for name, path in PATHS.items()}
        last = clock(args.accelerator) - start
        cycles += 1
        if cycles == 1 and args.repeats > 0 and budget.allows(last):
            continue  # a warm-up cycle
        for name, row in rows.items():
            runs[name].append(row)
        if len(runs["sequential"]) >= max(1, args.repeats) or not budget.allows(last):
            return runs


def table(args, runs, floor: float, rate: float) -> tuple[Table, dict]:
    """The paths table and its summary."""
    published = args.published_minutes
    title = (
        f"pfl-research's CIFAR-10 benchmark: {args.clients} clients of {args.samples}, "
        f"{args.per_round}/round, batch {args.batch}, {args.epochs} epoch, eval every "
        f"{args.eval_every} on {args.test}; {device_name(args.accelerator)}, 32-true; median "
        f"(range) of {len(runs['sequential'])}"
    )
    caption = (
        f"floor {floor * 1e3:.2f} ms/round ({floor * rate / 1e9:.1f} GFLOP at "
        f"{rate / 1e12:.2f} TFLOP/s measured, fp32); pfl-research's published time: "
        + (f"{published:g} min" if published else "not given (--published-minutes)")
    )
    out = Table(title=title, caption=caption)
    for column in ("path", "s/round", "vs sequential", "vs vmap by hand", "round/floor",
                   f"{BENCHMARK_ROUNDS} rounds", "pfl-research / it", "test_acc",
                   "max |w - w_seq|"):  # fmt: skip
        out.add_column(column, justify="right", no_wrap=True)
    medians = {name: statistics.median(r[0] for r in rows) for name, rows in runs.items()}
    for name, rows in runs.items():
        seconds = [r[0] for r in rows]
        projected = medians[name] * BENCHMARK_ROUNDS / 60
        versus = f"{published / projected:.2f}x" if published else "-"
        out.add_row(
            name, spread(seconds, 4),
            spread([a / b[0] for a, b in zip(seconds, runs["sequential"], strict=True)]),
            spread([a / b[0] for a, b in zip(seconds, runs["vmap by hand"], strict=True)]),
            f"{medians[name] / floor:.1f}", f"{projected:.1f} min", versus,
            f"{rows[-1][1]:.4f}", f"{gap(rows[0][2], runs['sequential'][0][2]):.1e}",
        )  # fmt: skip
    summary = {"workload": "pfl_cifar10", "floor_s": floor, "s_per_round": medians,
               "published_s_per_round": published * 60 / BENCHMARK_ROUNDS if published else None}  # fmt: skip
    return out, summary


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--accelerator", choices=("cpu", "cuda"), default="cpu")
    add("--tiny", action="store_true", help=f"a CPU check: {TINY} (given options win)")
    for name, default in FULL.items():
        add(f"--{name.replace('_', '-')}", type=int, default=default)
    add("--dropout", type=float, choices=(0.0, 1.0), default=1.0,
        help="1: the network's dropout layers as pfl-research has them; 0: none")  # fmt: skip
    add("--repeats", type=int, default=2,
        help="timed cycles over the paths (at most; 0: one cycle and no warm-up)")  # fmt: skip
    add("--published-minutes", type=float, default=None,
        help="pfl-research's published wall-clock minutes for the 1,500 rounds")  # fmt: skip
    add("--budget-s", type=float, default=None)
    add("--threads", type=int, default=None)
    if parser.parse_known_args(argv)[0].tiny:
        parser.set_defaults(**TINY)
    args = parser.parse_args(argv)
    if args.rounds < 2 * args.eval_every or args.rounds % args.eval_every:
        parser.error("--rounds must be a multiple of --eval-every, at least twice it")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    prepare_environment(True)  # before CUDA starts: the loop's deterministic paths need it
    budget = Budget(args.budget_s)
    device = torch.device(args.accelerator)
    rate = matmul_rate(device, torch.float32, 8192 if device.type == "cuda" else 1024)
    floor = round_flops(args) / rate
    out, summary = table(args, measure(args, budget), floor, rate)
    Console(width=170).print(out)
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
