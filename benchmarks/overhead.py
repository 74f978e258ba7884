"""Loop overhead: the same FedAvg work through FederatedLoop and through a hand-written PyTorch loop.

Both sides train the same model from the same initial weights on the same client tensors, with the
same client sampling, the same per-client shuffles and the same SGD steps, then evaluate the final
global model on the test set once; the table prints both wall times, their ratio, and the largest
difference between the two final models (0 means the loop adds no numerical change). The loop's
time includes its per-round evaluation, metrics and checkpoint (``plots`` off: drawing the curves
is reporting, not training). ``--direct-fit off`` fits every client with a Lightning Trainer.

Cases:
  tiny: MLP on digits, 20 clients x 20 local steps per round (overhead-bound).
  cnn:  the FedAvg CNN on synthetic 3x32x32 data, 20 clients x 250 samples, batch 50 (compute-bound).

    python benchmarks/overhead.py                 # both cases, 3 rounds each
    python benchmarks/overhead.py --case tiny --rounds 5 --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
from fedlightning.loop import sample_clients
from fedlightning.seeding import derive_seed
from fedlightning.server.functional import weighted_average


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
    case: Case, rounds: int, seed: int, direct_fit: bool = True
) -> tuple[float, dict[str, torch.Tensor]]:
    dm, model = make(case, seed)
    with tempfile.TemporaryDirectory() as run_dir:
        loop = FederatedLoop(
            rounds=rounds, clients_per_round=dm.num_clients, local_epochs=case.local_epochs,
            local_steps=case.local_steps, accelerator="cpu", seed=seed, eval_every=rounds,
            checkpoint_every=rounds, run_dir=run_dir, progress_bar=False, plots=False, direct_fit=direct_fit,
        )  # fmt: skip
        start = time.perf_counter()
        loop.fit(model, datamodule=dm)
        elapsed = time.perf_counter() - start
    return elapsed, loop.aggregator.global_state()


def run_by_hand(case: Case, rounds: int, seed: int) -> tuple[float, dict[str, torch.Tensor]]:
    """FedAvg written directly in PyTorch: the baseline the loop is measured against."""
    dm, module = make(case, seed)
    net = module.network
    start = time.perf_counter()
    global_state = {k: v.clone() for k, v in net.state_dict().items()}
    for r in range(rounds):
        uploads, sizes = [], []
        for cid in sample_clients(seed, r, dm.num_clients, dm.num_clients):
            fit_seed = derive_seed(seed, "fit", r, cid)
            torch.manual_seed(fit_seed % (2**32))
            net.load_state_dict(global_state)
            net.train()
            opt = torch.optim.SGD(net.parameters(), lr=LR)
            batches = dm.client_train_dataloader(cid, fit_seed)
            steps, target = 0, case.local_steps or len(batches) * case.local_epochs
            while steps < target:
                for x, y in batches:
                    opt.zero_grad()
                    F.cross_entropy(net(x), y).backward()
                    opt.step()
                    steps += 1
                    if steps == target:
                        break
            uploads.append({k: v.detach().clone() for k, v in net.state_dict().items()})
            sizes.append(dm.client_num_samples(cid))
        global_state = weighted_average(uploads, sizes)
    net.load_state_dict(global_state)
    net.eval()
    with torch.no_grad():
        correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in dm.test_dataloader())
    assert correct >= 0
    return time.perf_counter() - start, global_state


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
    parser.add_argument("--direct-fit", choices=["on", "off"], default="on")
    args = parser.parse_args()
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    direct = args.direct_fit == "on"

    table = Table(title=f"FedAvg: FederatedLoop vs hand-written PyTorch ({args.rounds} rounds, CPU, "
                  f"{torch.get_num_threads()} threads, direct_fit {args.direct_fit}, best of {args.repeats})")  # fmt: skip
    for column in ("case", "work", "hand-written s", "FederatedLoop s", "ratio", "max |diff|"):
        table.add_column(column, justify="right" if column not in ("case", "work") else "left")
    cases = CASES.values() if args.case == "all" else [CASES[args.case]]
    for case in cases:
        run_by_hand(case, 1, args.seed)  # warm-up both paths (allocator, kernels, imports)
        run_loop(case, 1, args.seed, direct)
        hand_time = loop_time = math.inf
        for _ in range(args.repeats):  # alternate the sides so that load changes hit both
            seconds, hand_state = run_by_hand(case, args.rounds, args.seed)
            hand_time = min(hand_time, seconds)
            seconds, loop_state = run_loop(case, args.rounds, args.seed, direct)
            loop_time = min(loop_time, seconds)
        diff = max(
            float((hand_state[k].double() - loop_state[k].double()).abs().max()) for k in hand_state
        )
        table.add_row(case.name, case.description, f"{hand_time:.2f}", f"{loop_time:.2f}",
                      f"{loop_time / hand_time:.2f}", f"{diff:.1e}")  # fmt: skip
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
