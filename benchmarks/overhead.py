"""Loop overhead: the same FedAvg work through FederatedLoop and through a hand-written PyTorch loop,
beside the compute floor of that work on the device.

Both sides train the same model from the same initial weights on the same client tensors, with the
same client sampling, the same per-client shuffles and the same SGD steps, on the same device in
the same precision, then evaluate the final global model on the test set once; the table prints
both wall times, their ratio, and the largest difference between the two final models (0 means the
loop adds no numerical change; with ``bf16-mixed``/``16-mixed`` the loop fits every client with a
Lightning Trainer and its precision plugin, and a small difference is rounding). The loop's time
includes its per-round evaluation, metrics and checkpoint (``plots`` off: drawing the curves is
reporting, not training). ``--fit-with trainer`` fits every client with a Lightning Trainer (mixed
precision always does).

The hand-written side keeps every client's data as tensors on the device (copied there once,
inside its timed region) and the client and global models on the device (FedAvg's float64 weighted
mean computed there; the loop uploads to and averages on the CPU); in ``bf16-mixed``/``16-mixed``
it runs forward and loss under ``torch.autocast(device, dtype)``, with a ``torch.amp.GradScaler``
per client fit for ``16-mixed`` (as Lightning's precision plugin does). Both sides run under the same oneDNN setting
(``--onednn``, :func:`fedlightning.training.cpu_compute`; no effect on GPU kernels). On CUDA the
clock is read after ``torch.cuda.synchronize()``.

Compute floor (``floor s``): 3 x the forward FLOPs of the local training work (forward + backward;
forward FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` on one batch of the real
model, per sample, times the samples the clients process; evaluation left out) over the device's
matrix-multiply rate measured in the same run (mean of 10 timed square matmuls after 3 warm-ups,
1024 on CPU, 8192 on CUDA, in the run's dtype: fp32 with TF32 off for ``32-true``, bf16 for
``bf16-mixed``, fp16 for ``16-mixed``). ``hand/floor`` and ``loop/floor`` say how far each side is
from the arithmetic alone. On CUDA, ``32-true`` convolutions may use TF32 (cuDNN's default), which
the fp32 matmul rate does not: the CNN's ``loop/floor`` can then fall below 1. On a CPU without
bf16 instructions a large bf16 matmul runs slower per FLOP than the small ones of these models
(``hand/floor`` below 1): there the floor means something for ``32-true`` only.

Cases:
  tiny: MLP on digits, 20 clients x 20 local steps per round (overhead-bound).
  cnn:  the FedAvg CNN on synthetic 3x32x32 data, 20 clients x 250 samples, batch 50 (compute-bound).

Whole process against rounds only (CPU runs): a second table runs the quickstart as fresh processes,
``fedlightning fit`` against the same work written by hand (``benchmarks/startup.py``, whose
docstring defines the columns): ``whole s`` (interpreter start, imports, data, set-up, rounds,
results, exit), ``rounds s`` (inside the rounds) and ``outside s`` (their difference, the front
door's cost), each with its ratio. ``--process-rounds 0`` leaves it out.

    python benchmarks/overhead.py                 # both cases, 3 rounds each, CPU
    python benchmarks/overhead.py --case tiny --rounds 5 --repeats 3 --threads 1
    python benchmarks/overhead.py --onednn on     # oneDNN CPU kernels on both sides
    python benchmarks/overhead.py --case tiny --process-rounds 0   # in-process table only
    python benchmarks/overhead.py --accelerator cuda --precision bf16-mixed --repeats 3
    python benchmarks/overhead.py --accelerator cuda --precision 32-true --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import math
import tempfile
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch.utils.flop_counter import FlopCounterMode

from devices import clock, device_name
from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
from fedlightning.data.loader import TensorBatches
from fedlightning.loop import sample_clients
from fedlightning.seeding import derive_seed
from fedlightning.training import cpu_compute
from startup import measure as measure_processes


@dataclass
class Case:
    name: str
    description: str
    data: dict
    network: str
    network_kwargs: dict
    local_steps: int | None
    local_epochs: int = 1


CASES = {
    "tiny": Case(
        "tiny", "MLP, digits, 20 clients x 20 steps",
        dict(dataset="digits", num_clients=20, partition="iid", batch_size=32, val_fraction=0.0),
        "mlp", {"hidden": [200, 200]}, local_steps=20,
    ),
    "cnn": Case(
        "cnn", "FedAvg CNN, synthetic 3x32x32, 20 clients x 250 samples, batch 50",
        dict(dataset="synthetic", num_samples=5000, num_test=500, sample_shape=(3, 32, 32), num_clients=20,
             partition="iid", batch_size=50, val_fraction=0.0),
        "cnn", {}, local_steps=None,
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
        in_channels=dm.in_channels, image_size=dm.image_size, lr=LR,
    )  # fmt: skip
    return dm, model


def run_loop(
    case: Case, rounds: int, seed: int, setup: Setup, fit_with: str = "auto"
) -> tuple[float, dict[str, torch.Tensor]]:
    dm, model = make(case, seed)
    with tempfile.TemporaryDirectory() as run_dir:
        loop = FederatedLoop(
            rounds=rounds, clients_per_round=dm.num_clients, local_epochs=case.local_epochs,
            local_steps=case.local_steps, accelerator=setup.accelerator, precision=setup.precision,
            onednn=setup.onednn, seed=seed, eval_every=rounds, checkpoint_every=rounds, run_dir=run_dir,
            progress_bar=False, plots=False, fit_with=fit_with,
        )  # fmt: skip
        loop.console.quiet = True
        start = clock(setup.device.type)
        loop.fit(model, datamodule=dm)
        elapsed = clock(setup.device.type) - start
    return elapsed, loop.aggregator.global_state()


def run_by_hand(
    case: Case, rounds: int, seed: int, setup: Setup
) -> tuple[float, dict[str, torch.Tensor], int]:
    """FedAvg written directly in PyTorch: the baseline the loop is measured against. Returns the
    seconds, the final global model and the number of training samples processed."""
    dm, module = make(case, seed)
    device, dtype = setup.device, AUTOCAST[setup.precision]
    net = module.network.to(device)
    samples = 0
    with cpu_compute(None, setup.onednn):
        start = clock(device.type)
        data = {}  # every client's training tensors, on the device once
        for cid in range(dm.num_clients):
            batches = dm.client_train_dataloader(cid, 0)
            data[cid] = (batches.x.to(device), batches.y.to(device))
        global_state = {k: v.clone() for k, v in net.state_dict().items()}
        for r in range(rounds):
            uploads, sizes = [], []
            for cid in sample_clients(seed, r, dm.num_clients, dm.num_clients):
                fit_seed = derive_seed(seed, "fit", r, cid)
                torch.manual_seed(fit_seed % (2**32))
                net.load_state_dict(global_state)
                net.train()
                opt = torch.optim.SGD(net.parameters(), lr=LR)
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
                        samples += len(y)
                        steps += 1
                        if steps == target:
                            break
                uploads.append({k: v.detach().clone() for k, v in net.state_dict().items()})
                sizes.append(dm.client_num_samples(cid))
            global_state = average_on_device(uploads, sizes)
        net.load_state_dict(global_state)
        net.eval()
        test = dm.test_dataloader()
        x_test, y_test = test.x.to(device), test.y.to(device)
        with torch.no_grad(), _autocast(device, dtype):
            correct = sum(
                int((net(x).argmax(1) == y).sum())
                for x, y in TensorBatches(x_test, y_test, dm.eval_batch_size)
            )
        assert correct >= 0
        elapsed = clock(device.type) - start
    return elapsed, global_state, samples


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed runs per side; the best is kept"
    )
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
        title=f"FedAvg: FederatedLoop vs hand-written PyTorch ({args.rounds} rounds, {where}, "
        f"{args.precision}, fit_with {args.fit_with}, oneDNN {args.onednn}, best of {args.repeats})",
        caption=f"matmul rate {rate / 1e12:.3f} TFLOP/s ({str(setup.dtype).removeprefix('torch.')} "
        f"{size}x{size}); floor = 3 x forward FLOPs x training samples / rate",
    )
    columns = ("case", "work", "hand-written s", "FederatedLoop s", "ratio", "floor s",
               "hand/floor", "loop/floor", "max |diff|")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right" if column not in ("case", "work") else "left")
    cases = CASES.values() if args.case == "all" else [CASES[args.case]]
    for case in cases:
        dm, module = make(case, args.seed)
        batch = next(iter(dm.client_train_dataloader(0, args.seed)))[0]
        per_sample = forward_flops_per_sample(module.network, batch)
        run_by_hand(case, 1, args.seed, setup)  # warm-up both paths (allocator, kernels, imports)
        run_loop(case, 1, args.seed, setup, args.fit_with)
        hand_time = loop_time = math.inf
        for _ in range(args.repeats):  # alternate the sides so that load changes hit both
            seconds, hand_state, samples = run_by_hand(case, args.rounds, args.seed, setup)
            hand_time = min(hand_time, seconds)
            seconds, loop_state = run_loop(case, args.rounds, args.seed, setup, args.fit_with)
            loop_time = min(loop_time, seconds)
        diff = max(
            float((hand_state[k].double().cpu() - loop_state[k].double().cpu()).abs().max())
            for k in hand_state
        )
        floor = 3 * per_sample * samples / rate
        table.add_row(case.name, case.description, f"{hand_time:.2f}", f"{loop_time:.2f}",
                      f"{loop_time / hand_time:.2f}", f"{floor:.2e}", f"{_times(hand_time / floor)}",
                      f"{_times(loop_time / floor)}", f"{diff:.1e}")  # fmt: skip
    Console(width=150).print(table)
    if args.process_rounds > 0 and device.type == "cpu":
        processes, imports = measure_processes(
            args.process_rounds, args.repeats, args.threads or torch.get_num_threads()
        )
        Console(width=150).print(processes)
        for line in imports:
            print(line)


def _times(ratio: float) -> str:
    return f"{ratio:.1f}" if ratio < 100 else f"{ratio:,.0f}"


if __name__ == "__main__":
    main()
