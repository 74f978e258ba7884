"""The cohort benchmark's work through Flower's simulation (``run_simulation``), run by
``benchmarks/cohort.py`` in the ``make bench-peers`` environment (``.venv-peers``) with one JSON
argument (the benchmark's options); prints one JSON line ``{"round_s", "test_acc"}``.

Same data, partition, initial weights, local training (SGD with momentum, the loop's per-client
batch seeds) and evaluation (global test accuracy after every round, Flower's ``evaluate_fn``) as
the other paths; Flower samples its own ``per_round`` clients each round (equal-size clients, so the
same work). The time is the simulation's wall time over the rounds, Ray's start-up included as
Flower users pay it (reported separately as ``start_s``: the first round's extra time).
"""

from __future__ import annotations

import json
import logging
import sys
import time

import torch
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.simulation import run_simulation

from cohort_work import AUTOCAST, evaluate, make, warm
from fedlightning.seeding import derive_seed


def main() -> None:
    args = type("Args", (), json.loads(sys.argv[1]))()
    device = torch.device(args.accelerator)
    dm, model = make(args, args.workload)
    net = model.network.to(device)
    names = list(net.state_dict())
    autocast = AUTOCAST.get(args.precision)
    stamps: list[float] = []
    accuracy = [0.0]

    def to_state(arrays):
        return {n: torch.as_tensor(a, device=device) for n, a in zip(names, arrays, strict=True)}

    class Client(NumPyClient):
        def __init__(self, cid: int) -> None:
            self.cid = cid

        def fit(self, parameters, config):
            r = int(config["round"])
            net.load_state_dict(to_state(parameters))
            net.train()
            opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
            loader = dm.client_train_dataloader(self.cid, derive_seed(0, "fit", r, self.cid))
            for _ in range(args.epochs):
                for x, y in loader:
                    opt.zero_grad()
                    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                        out = net(x.to(device))
                    torch.nn.functional.cross_entropy(out.float(), y.to(device)).backward()
                    opt.step()
            weights = [v.detach().cpu().numpy() for v in net.state_dict().values()]
            return weights, dm.client_num_samples(self.cid), {}

    def client_fn(context: Context):
        return Client(int(context.node_config["partition-id"])).to_client()

    def evaluate_fn(server_round, parameters, config):
        stamps.append(time.perf_counter())
        net.eval()
        accuracy[0] = evaluate(net, to_state(parameters), dm, device)
        return 0.0, {"test_acc": accuracy[0]}

    def server_fn(context: Context):
        initial = [v.detach().cpu().numpy() for v in net.state_dict().values()]
        strategy = FedAvg(
            fraction_fit=args.per_round / args.clients, min_fit_clients=args.per_round,
            fraction_evaluate=0.0, min_evaluate_clients=0, min_available_clients=args.clients,
            initial_parameters=ndarrays_to_parameters(initial), evaluate_fn=evaluate_fn,
            on_fit_config_fn=lambda r: {"round": r - 1},
        )  # fmt: skip
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=args.rounds))

    resources = {"num_cpus": 1, "num_gpus": 0.1 if device.type == "cuda" else 0.0}
    logging.getLogger("flwr").setLevel(logging.ERROR)
    start = time.perf_counter()
    run_simulation(
        server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
        num_supernodes=args.clients, backend_config={"client_resources": resources},
    )  # fmt: skip
    total = time.perf_counter() - start
    rounds = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]  # stamps[0]: initial eval
    print(json.dumps({
        "round_s": warm(rounds), "start_s": stamps[0] - start, "total_s": total,
        "test_acc": accuracy[0],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
