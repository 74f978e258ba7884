"""Heterogeneous clients on digits: FedAvg within groups vs HeteroAvg vs InCoAvg (official, exact).

InCo Aggregation: Chan et al., "Internal Cross-layer Gradients for Extending Homogeneity to
Heterogeneity in Federated Learning", ICLR 2024, arXiv:2308.11464; HeteroFL-style averaging.

Setup: scikit-learn's bundled digits (offline) resized to 16x16 (at 8x8 stage 4 is 1x1, where
BatchNorm cannot train on a last batch of one sample), 20 clients in 5 equal groups training
ResNet10/14/18/22/26 (width 8, the small 3x3 stem), Dirichlet(0.5) label skew, 10 clients per
round, Adam lr 1e-3 (the paper's ResNet optimizer), batch 32, several seeds (the seed fixes the
partition, the initial model and the client sampling: for one seed every method sees the same
federation). Methods:
  FedAvg-groups  each group federates only with itself (uniform mean within the group): the
                 baseline without any sharing across architectures, FedAvg(within_groups=True)
  HeteroAvg      per-key mean over the sampled owners: FedAvg(weighting="uniform")
                 (docs/algorithms.md section 2.3)
  InCo-official  HeteroAvg + InCo's cross-layer updates, the authors' code (docs/algorithms.md
                 section 2.4) with the code's layer 0 (the library's default)
  InCo-official-paper-layer0  the same with the paper's layer 0 and pairs (layer0: paper)
  InCo-exact     HeteroAvg + Theorem 3.1's coefficient (c = -theta when b < 0), normalised

Reported after the last round (mean +- std over seeds, %): each group's model with the server's
(or its group's) weights on the global test set, and their mean (the paper's headline number).

    python experiments/hetero.py                         # the table (3-6 min, 1 thread)
    python experiments/hetero.py --rounds 3 --seeds 0    # a smoke test (its output says so)

With fewer rounds than the table's 20 the output ends with a SMOKE TEST line; one seed prints
each cell's value (no spread).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from lightning.fabric.utilities.seed import seed_everything
from tables import mean_std, over_seeds, smoke_test_line

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.clients import ClientModule
from fedlightning.server import Aggregator, FedAvg, InCo

#: the table's rounds; fewer make a smoke test, and the output says so
TABLE_ROUNDS = 20
GROUPS = ["resnet10", "resnet14", "resnet18", "resnet22", "resnet26"]

METHODS: dict[str, Callable[[], Aggregator]] = {
    "FedAvg-groups": lambda: FedAvg(weighting="uniform", within_groups=True),
    "HeteroAvg": lambda: FedAvg(weighting="uniform"),
    "InCo-official": lambda: InCo(variant="official"),
    "InCo-official-paper-layer0": lambda: InCo(variant="official", layer0="paper"),
    "InCo-exact": lambda: InCo(variant="exact"),
}


def run(method: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    seed_everything(seed, verbose=False)  # the initial models, as the CLI does with loop.seed
    model = ClientModule(
        networks=GROUPS,
        network_kwargs={"width": args.width, "stem": "small"},
        num_classes=10,
        in_channels=1,
        image_size=16,
        optimizer="adam",
        lr=1e-3,
    )
    dm = FederatedDataModule(
        dataset="digits", num_clients=args.num_clients, partition="dirichlet", beta=args.beta,
        batch_size=32, seed=seed, resize=16,
        min_batch_size=8,  # B/4, as the BatchNorm configs (docs 4.1): no batch of one sample
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=args.rounds, clients_per_round=args.clients_per_round, local_epochs=args.local_epochs,
        aggregator=METHODS[method](), seed=seed, eval_every=args.rounds, checkpoint_every=args.rounds,
        run_dir=str(workdir / f"{method}-{seed}"), progress_bar=False, plots=False,
        num_threads=args.threads,
    )  # fmt: skip
    loop.console.quiet = True
    metrics = loop.fit(model, datamodule=dm)
    extra = {k: metrics[k] for k in ("inco_conflict_frac", "inco_beta_deg_mean") if k in metrics}
    return {
        **{g: metrics[f"{g}/test_acc"] for g in GROUPS},
        "mean": metrics["group_mean_acc"],
        **extra,
    }


def main(argv: list[str] | None = None) -> str:
    """Run the table (or the smaller run ``argv`` asks for), print it and return its text."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=TABLE_ROUNDS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--num-clients", type=int, default=20)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--beta", type=float, default=0.5, help="Dirichlet concentration")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/experiments/hetero"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)

    rows: list[dict[str, object]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            for seed in args.seeds:
                t0 = time.perf_counter()
                result = run(method, seed, args, Path(tmp))
                rows.append(
                    {"method": method, "seed": seed, **result, "time_s": time.perf_counter() - t0}
                )
                print(f"{method:13s} seed {seed}: mean {result['mean']:.4f}", flush=True)
    total = time.perf_counter() - started

    def cell(method: str, key: str) -> str:
        return mean_std([float(r[key]) for r in rows if r["method"] == method], decimals=1)

    lines = [
        f"\ndigits, {args.num_clients} clients in 5 ResNet groups (width {args.width}), "
        f"Dirichlet({args.beta}), {args.rounds} rounds x {args.clients_per_round} clients x "
        f"{args.local_epochs} local epochs, Adam 1e-3; test accuracy in %, "
        f"{over_seeds(args.seeds)}; {total:.0f} s in all\n",
        "| method | " + " | ".join(GROUPS) + " | mean | s/run |",
        "|---" * (len(GROUPS) + 3) + "|",
    ]
    for method in args.methods:
        seconds = statistics.mean(float(r["time_s"]) for r in rows if r["method"] == method)
        cells = " | ".join(cell(method, key) for key in [*GROUPS, "mean"])
        lines.append(f"| {method} | {cells} | {seconds:.0f} |")
    conflicts = [r for r in rows if "inco_conflict_frac" in r]
    if conflicts:
        lines.append(
            "\nInCo's last round (mean over seeds): share of conflicting pairs (b < 0), mean angle"
        )
        for method in dict.fromkeys(r["method"] for r in conflicts):
            mine = [r for r in conflicts if r["method"] == method]
            frac = statistics.mean(float(r["inco_conflict_frac"]) for r in mine)
            angle = statistics.mean(float(r["inco_beta_deg_mean"]) for r in mine)
            lines.append(f"- {method}: conflict share {frac:.2f}, mean beta {angle:.1f} degrees")
    smoke = smoke_test_line(args.rounds, TABLE_ROUNDS)
    text = "\n".join(lines + ([f"\n{smoke}"] if smoke else [])) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
