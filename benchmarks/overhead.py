"""Loop overhead: the same FedAvg rounds through FederatedLoop and through a hand-written PyTorch
loop, interleaved, beside the compute floor of that work on the device.

Both sides do the same work, round for round: the same model from the same initial weights, the
same client tensors, the same client sampling (``(seed, round)``), the same per-client shuffles and
SGD steps, on the same device in the same precision, FedAvg weighted by samples (float64
accumulation), then the global model's test accuracy and loss and, where the case holds validation
splits, every client's validation accuracy (the loop's ``val_acc``). The loop runs as a user runs
it: ``last.ckpt`` written every round (in the background), ``metrics.csv`` and the round line every
round (``plots`` off: drawing is reporting). ``max |diff|`` is the largest difference between the
two final global models: 0 means the loop adds no numerical change.

Timing: each side records the clock at the end of every round (the loop through a Lightning
``Logger``, called once per evaluated round; the hand-written loop after its evaluation), so a
round's time is the interval between two such marks: everything the round does, its checkpoint
snapshot and logging included. Round 1 (first calls, allocator) is left out of every run. The two
sides run alternately (hand-written, loop, hand-written, loop, ...); the first ``--warmup`` pairs
are dropped, then ``--repeats`` pairs are timed. ``ms/round`` prints, per side, the median over the
repeats of each run's mean round time, with the range in parentheses; ``ratio`` the median (range)
of the per-pair ratios loop/hand (a load change hits both runs of a pair alike); ``fit() ratio`` the
same for the whole call (the loop's in-process start-up: checks, set-up, writing the run
directory's start files; the hand-written loop's copy of the data to the device).

The hand-written side keeps every client's data as tensors on the device (copied there once) and
the model on the device (FedAvg's mean computed there, as the loop's server does); in
``bf16-mixed``/``16-mixed`` it runs forward and loss under ``torch.autocast(device, dtype)``, with
a ``torch.amp.GradScaler`` per client fit for ``16-mixed`` (as Lightning's precision plugin does).
Both sides run under the same oneDNN setting (``--onednn``, :func:`fedlightning.training.cpu_compute`;
no effect on GPU kernels). On CUDA the clock is read after ``torch.cuda.synchronize()``.

Compute floor (``floor ms``): 3 x the forward FLOPs of a round's local training (forward +
backward; forward FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` on one batch of the
real model, per sample, times the samples the clients process; evaluation left out) over the
device's matrix-multiply rate measured in the same run (mean of 10 timed square matmuls after 3
warm-ups, 1024 on CPU, 8192 on CUDA, in the run's dtype: fp32 with TF32 off for ``32-true``, bf16
for ``bf16-mixed``, fp16 for ``16-mixed``). ``hand/floor`` and ``loop/floor`` say how far each
side is from the arithmetic alone. On CUDA, ``32-true`` convolutions may use TF32 (cuDNN's
default), which the fp32 matmul rate does not: the CNN's ``loop/floor`` can then fall below 1. On
a CPU without bf16 instructions a large bf16 matmul runs slower per FLOP than the small ones of
these models (``hand/floor`` below 1): there the floor means something for ``32-true`` only.

Cases:
  tiny:       MLP on digits, 20 clients x 20 local steps per round, no validation (overhead-bound).
  quickstart: configs/quickstart.yaml's work (digits, 20 clients with Dirichlet(0.5) label skew and
              10% validation, the FedAvg CNN, 10 clients x 2 epochs per round, SGD lr 0.05 with
              momentum 0.5, batch 32).
  cnn:        the FedAvg CNN on synthetic 3x32x32 data, 20 clients x 250 samples, batch 50
              (compute-bound).

Whole process against rounds only (CPU runs): a second table runs the quickstart as fresh processes,
``fedlightning fit`` against the same work written by hand (``benchmarks/startup.py``, whose
docstring defines the columns). ``--process-rounds 0`` leaves it out.

    python benchmarks/overhead.py --threads 1                 # every case, CPU, one thread
    python benchmarks/overhead.py --case tiny --rounds 8 --repeats 7 --threads 1 --process-rounds 0
    python benchmarks/overhead.py --onednn on                 # oneDNN CPU kernels on both sides
    python benchmarks/overhead.py --accelerator cuda --precision bf16-mixed --process-rounds 0
    python benchmarks/overhead.py --accelerator cuda --precision 32-true --process-rounds 0
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import statistics
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from rich.console import Console
from rich.table import Table
from torch.utils.flop_counter import FlopCounterMode

from devices import clock, device_name
from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
from fedlightning.data.loader import TensorBatches
from fedlightning.loop import sample_clients
from fedlightning.seeding import derive_seed
from fedlightning.server import FedAvg
from fedlightning.training import cpu_compute
from startup import measure as measure_processes
from startup import spread


@dataclass
class Case:
    name: str
    description: str
    data: dict
    network: str
    network_kwargs: dict
    per_round: int
    local_steps: int | None
    local_epochs: int = 1
    momentum: float = 0.0
    rounds: int = 8  #: default rounds per run (round 1 is not timed)


CASES = {
    "tiny": Case(
        "tiny", "MLP, digits, 20 clients x 20 steps",
        dict(dataset="digits", num_clients=20, partition="iid", batch_size=32, val_fraction=0.0),
        "mlp", {"hidden": [200, 200]}, per_round=20, local_steps=20, rounds=10,
    ),
    "quickstart": Case(
        "quickstart", "FedAvg CNN, digits, 10 of 20 clients x 2 epochs",
        dict(dataset="digits", num_clients=20, partition="dirichlet", beta=0.5, batch_size=32),
        "cnn", {}, per_round=10, local_steps=None, local_epochs=2, momentum=0.5, rounds=6,
    ),
    "cnn": Case(
        "cnn", "FedAvg CNN, synthetic 3x32x32, 20 clients x 250 samples, batch 50",
        dict(dataset="synthetic", num_samples=5000, num_test=500, sample_shape=(3, 32, 32), num_clients=20,
             partition="iid", batch_size=50, val_fraction=0.0),
        "cnn", {}, per_round=20, local_steps=None, rounds=4,
    ),
}  # fmt: skip

LR = 0.05
#: the autocast dtype of each precision (None: full precision, no autocast)
AUTOCAST = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


@dataclass
class Setup:
    """Where and how both sides compute."""

    accelerator: str
    precision: str
    onednn: bool

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.accelerator == "cuda" else "cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the matmuls that bound the arithmetic."""
        return AUTOCAST[self.precision] or torch.float32


@dataclass
class Run:
    """One timed run of one side."""

    fit_s: float  #: the whole call
    round_s: list[float]  #: each round's time but the first's
    state: dict[str, torch.Tensor]  #: the final global model
    samples: list[int] = field(default_factory=list)  #: training samples per timed round

    @property
    def mean_round_s(self) -> float:
        return sum(self.round_s) / len(self.round_s)


class RoundClock(Logger):
    """A Lightning logger that only reads the clock each time a round's metrics are logged."""

    def __init__(self, accelerator: str) -> None:
        super().__init__()
        self.accelerator = accelerator
        self.marks: list[float] = []

    @property
    def name(self) -> str:
        return "round-clock"

    @property
    def version(self) -> str:
        return ""

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.marks.append(clock(self.accelerator))


def matmul_rate(
    device: torch.device, dtype: torch.dtype, size: int, warmup: int = 3, repeats: int = 10
) -> float:
    """FLOP/s of a ``size x size`` matmul in ``dtype`` on ``device`` (fp32: TF32 off), the mean
    time of ``repeats`` timed products after ``warmup`` untimed ones."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device, dtype)
    b = torch.randn(size, size, generator=gen).to(device, dtype)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # fp32 stays fp32 (no TF32 on CUDA)
    try:
        for _ in range(warmup):
            a @ b
        seconds = 0.0
        for _ in range(repeats):
            start = clock(device.type)
            a @ b
            seconds += clock(device.type) - start
    finally:
        torch.set_float32_matmul_precision(before)
    return 2 * size**3 / (seconds / repeats)


def forward_flops_per_sample(net: torch.nn.Module, x: torch.Tensor) -> float:
    """Forward FLOPs of ``net`` per sample, counted on the batch ``x`` (on a CPU copy of ``net``)."""
    net = copy.deepcopy(net).to("cpu").eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(x.to("cpu"))
    return counter.get_total_flops() / len(x)


def make(case: Case, seed: int) -> tuple[FederatedDataModule, ClientModule]:
    dm = FederatedDataModule(seed=seed, **case.data)
    dm.setup()
    torch.manual_seed(seed)
    model = ClientModule(
        network=case.network, network_kwargs=case.network_kwargs, num_classes=dm.num_classes,
        in_channels=dm.in_channels, image_size=dm.image_size, lr=LR, momentum=case.momentum,
    )  # fmt: skip
    return dm, model


def run_loop(case: Case, rounds: int, seed: int, setup: Setup, fit_with: str = "auto") -> Run:
    dm, model = make(case, seed)
    marks = RoundClock(setup.device.type)
    with tempfile.TemporaryDirectory() as run_dir:
        loop = FederatedLoop(
            rounds=rounds, clients_per_round=case.per_round, local_epochs=case.local_epochs,
            local_steps=case.local_steps, aggregator=FedAvg(weighting="samples"),
            accelerator=setup.accelerator, precision=setup.precision, onednn=setup.onednn,
            seed=seed, run_dir=run_dir, progress_bar=False, plots=False, fit_with=fit_with,
            loggers=[marks], num_threads=None,  # the process's threads, as the hand-written side
        )  # fmt: skip
        loop.console.quiet = True
        start = clock(setup.device.type)
        loop.fit(model, datamodule=dm)
        fit_s = clock(setup.device.type) - start
    periods = [b - a for a, b in zip(marks.marks, marks.marks[1:], strict=False)]
    return Run(fit_s, periods, loop.aggregator.global_state())


def run_by_hand(case: Case, rounds: int, seed: int, setup: Setup) -> Run:
    """FedAvg written directly in PyTorch: the baseline the loop is measured against."""
    dm, module = make(case, seed)
    device, dtype = setup.device, AUTOCAST[setup.precision]
    net = module.network.to(device)
    marks: list[float] = []
    samples: list[int] = []
    with cpu_compute(None, setup.onednn):
        start = clock(device.type)
        data = {}  # every client's training tensors, on the device once
        for cid in range(dm.num_clients):
            batches = dm.client_train_dataloader(cid, 0)
            data[cid] = (batches.x.to(device), batches.y.to(device))
        test = dm.test_dataloader()
        x_test, y_test = test.x.to(device), test.y.to(device)
        x_val, y_val, owner = (t.to(device) for t in dm.client_val_data())
        global_state = {k: v.clone() for k, v in net.state_dict().items()}
        for r in range(rounds):
            uploads, sizes, processed = [], [], 0
            for cid in sample_clients(seed, r, dm.num_clients, case.per_round):
                fit_seed = derive_seed(seed, "fit", r, cid)
                torch.manual_seed(fit_seed % (2**32))
                net.load_state_dict(global_state)
                net.train()
                opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=case.momentum)
                scaler = (
                    torch.amp.GradScaler(device.type) if setup.precision == "16-mixed" else None
                )
                # the same shuffles as dm.client_train_dataloader(cid, fit_seed), on device tensors
                batches = TensorBatches(*data[cid], dm.batch_size, shuffle=True, seed=fit_seed)
                steps, target = 0, case.local_steps or len(batches) * case.local_epochs
                while steps < target:
                    for x, y in batches:
                        opt.zero_grad()
                        with _autocast(device, dtype):
                            loss = F.cross_entropy(net(x), y)
                        if scaler is None:
                            loss.backward()
                            opt.step()
                        else:
                            scaler.scale(loss).backward()
                            scaler.step(opt)
                            scaler.update()
                        processed += len(y)
                        steps += 1
                        if steps == target:
                            break
                uploads.append({k: v.detach().clone() for k, v in net.state_dict().items()})
                sizes.append(dm.client_num_samples(cid))
            global_state = average_on_device(uploads, sizes)
            net.load_state_dict(global_state)
            evaluate(net.eval(), x_test, y_test, x_val, y_val, owner, dtype)
            marks.append(clock(device.type))
            samples.append(processed)
        fit_s = clock(device.type) - start
    periods = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    return Run(fit_s, periods, global_state, samples[1:])


def evaluate(net, x_test, y_test, x_val, y_val, owner, dtype) -> tuple[float, float, float]:
    """Test accuracy and mean loss, and the mean over clients of their validation accuracy."""
    with torch.no_grad(), _autocast(x_test.device, dtype):
        logits = net(x_test)
        accuracy = float((logits.argmax(1) == y_test).sum()) / len(y_test)
        loss = float(F.cross_entropy(logits.float(), y_test))
        val_acc = float("nan")
        if len(y_val):
            hits = (net(x_val).argmax(1) == y_val).double()
            counts = torch.bincount(owner)
            val_acc = float((torch.bincount(owner, hits)[counts > 0] / counts[counts > 0]).mean())
    return accuracy, loss, val_acc


def average_on_device(
    states: list[dict[str, torch.Tensor]], weights: list[int]
) -> dict[str, torch.Tensor]:
    """The arithmetic of :func:`fedlightning.server.functional.weighted_average` (float64
    accumulation in client order, integer entries from the first state) on the states' device."""
    total = float(sum(weights))
    out = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first.clone()
            continue
        acc = torch.zeros(first.shape, dtype=torch.float64, device=first.device)
        for weight, state in zip(weights, states, strict=True):
            acc.add_(state[key].to(torch.float64), alpha=float(weight) / total)
        out[key] = acc.to(first.dtype)
    return out


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def compare(case: Case, args: argparse.Namespace, setup: Setup) -> tuple[list[Run], list[Run]]:
    """Both sides, interleaved: the timed runs of each (warm-up pairs dropped)."""
    rounds = args.rounds or case.rounds
    hand, loop = [], []
    for index in range(args.warmup + args.repeats):
        by_hand = run_by_hand(case, rounds, args.seed, setup)
        ours = run_loop(case, rounds, args.seed, setup, args.fit_with)
        if index >= args.warmup:
            hand.append(by_hand)
            loop.append(ours)
    return hand, loop


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds per run (default: the case's)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="timed pairs of runs")
    parser.add_argument("--warmup", type=int, default=1, help="untimed pairs of runs first")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--fit-with", choices=["auto", "trainer"], default="auto")
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=list(AUTOCAST), default="32-true")
    parser.add_argument(
        "--onednn", choices=["on", "off"], default="off", help="oneDNN CPU kernels (both sides)"
    )
    parser.add_argument(
        "--matmul-size", type=int, default=None, help="matmul of the rate (1024 CPU, 8192 CUDA)"
    )
    parser.add_argument(
        "--process-rounds", type=int, default=30,
        help="rounds of the whole-process table (the quickstart: 30; 0 leaves the table out)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.rounds is not None and args.rounds < 3:
        parser.error("--rounds must be at least 3 (round 1 is not timed; two marks per interval)")
    if args.accelerator == "cuda" and not torch.cuda.is_available():
        parser.error("--accelerator cuda: no CUDA device is available")
    if args.accelerator == "cpu" and args.precision == "16-mixed":
        parser.error("--precision 16-mixed needs CUDA (Lightning runs bf16-mixed instead on CPU)")
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    setup = Setup(args.accelerator, args.precision, args.onednn == "on")
    device = setup.device
    size = args.matmul_size or (8192 if device.type == "cuda" else 1024)
    with cpu_compute(None, setup.onednn):
        rate = matmul_rate(device, setup.dtype, size)
    where = device_name(device.type)
    if device.type == "cpu":
        where += f", {torch.get_num_threads()} threads"

    table = Table(
        title=f"FedAvg: FederatedLoop vs hand-written PyTorch ({where}, {args.precision}, fit_with "
        f"{args.fit_with}, oneDNN {args.onednn}); interleaved, median (range) of {args.repeats} "
        f"pairs after {args.warmup} warm-up pair(s), round 1 of each run not timed",
        caption=f"matmul rate {rate / 1e12:.3f} TFLOP/s ({str(setup.dtype).removeprefix('torch.')} "
        f"{size}x{size}); floor = 3 x forward FLOPs x training samples / rate",
    )
    columns = ("case", "rounds", "hand ms/round", "loop ms/round", "ratio", "fit() ratio",
               "floor ms", "hand/floor", "loop/floor", "max |diff|")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "case" else "right", no_wrap=True)
    cases = CASES.values() if args.case == "all" else [CASES[args.case]]
    for case in cases:
        dm, module = make(case, args.seed)
        batch = next(iter(dm.client_train_dataloader(0, args.seed)))[0]
        per_sample = forward_flops_per_sample(module.network, batch)
        hand, loop = compare(case, args, setup)
        hand_ms = [run.mean_round_s * 1e3 for run in hand]
        loop_ms = [run.mean_round_s * 1e3 for run in loop]
        samples = statistics.mean(s for run in hand for s in run.samples)
        floor_ms = 3 * per_sample * samples / rate * 1e3
        diff = max(
            float((run.state[k].double().cpu() - other.state[k].double().cpu()).abs().max())
            for run, other in zip(hand, loop, strict=True)
            for k in run.state
        )
        table.add_row(
            case.name, str(args.rounds or case.rounds), spread(hand_ms, 1), spread(loop_ms, 1), spread([b / a for a, b in zip(hand_ms, loop_ms, strict=True)], 3),
            spread([b.fit_s / a.fit_s for a, b in zip(hand, loop, strict=True)], 3),
            f"{floor_ms:.2f}", _times(statistics.median(hand_ms) / floor_ms),
            _times(statistics.median(loop_ms) / floor_ms), f"{diff:.1e}",
        )  # fmt: skip
    console = Console(width=200)
    console.print(table)
    for case in cases:
        console.print(f"  {case.name}: {case.description}")
    if args.process_rounds > 0 and device.type == "cpu":
        processes, imports = measure_processes(
            args.process_rounds, args.repeats, args.threads or torch.get_num_threads(), args.warmup
        )
        Console(width=150).print(processes)
        for line in imports:
            print(line)


def _times(ratio: float) -> str:
    return f"{ratio:.1f}" if ratio < 100 else f"{ratio:,.0f}"


if __name__ == "__main__":
    main()
