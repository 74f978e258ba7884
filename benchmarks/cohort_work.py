"""The work ``benchmarks/cohort.py`` times, and each path that does it: the loop (sequential or
cohort backend), a per-client loop by hand, all clients in one ``vmap`` by hand, Flower.

Every path trains the same federation (IID equal clients, seeded), the same sampled clients, the
same initial weights and the same batches (each client's shuffle seeded as the loop seeds it),
with FedAvg weighted by samples, and evaluates the global model on the test set every round.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch
from torch.func import functional_call, grad, vmap

from devices import clock
from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.clients import ClientModule
from fedlightning.loop.sampling import sample_clients
from fedlightning.seeding import derive_seed
from fedlightning.server import FedAvg
from fedlightning.training import cpu_compute
from overhead import RoundClock, average_on_device, forward_flops_per_sample

SHAPES = {"quickstart": (1, 8), "fedcross": (3, 32)}
AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
ROOT = Path(__file__).resolve().parent.parent


def make(args, workload: str, width: int = 32, seed: int = 0):
    """The data module and objective of ``workload`` (FedAvg's CNN of ``width`` channels)."""
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


def round_flops(args, workload: str, width: int = 32, per_round: int | None = None) -> float:
    """A round's training FLOPs: 3 x forward FLOPs per sample x samples x epochs x clients (a
    forward and a backward pass of about twice its cost)."""
    dm, model = make(args, workload, width)
    x = next(iter(dm.client_train_dataloader(0, 0)))[0]
    per_client = 3 * forward_flops_per_sample(model.network, x) * args.samples * args.epochs
    return per_client * (per_round or args.per_round)


def run_loop(args, workload, backend, per_round=None, width=32, deterministic=True):
    """``(s/round, final test_acc, final model)`` of one FederatedLoop run."""
    dm, model = make(args, workload, width)
    marks = RoundClock(args.accelerator)
    with tempfile.TemporaryDirectory() as run_dir:
        loop = FederatedLoop(
            rounds=args.rounds, clients_per_round=per_round or args.per_round,
            local_epochs=args.epochs, aggregator=FedAvg(weighting="samples"), backend=backend,
            accelerator=args.accelerator, precision=args.precision, run_dir=run_dir,
            progress_bar=False, plots=False, loggers=[marks], deterministic=deterministic,
            num_threads=None,  # the process's threads (--threads), as the paths by hand
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
    autocast = AUTOCAST.get(args.precision)
    times = []
    for r in range(args.rounds):
        start = clock(args.accelerator)
        ids = sample_clients(0, r, args.clients, args.per_round)
        loaders = [
            dm.client_train_dataloader(c, derive_seed(0, "fit", r, c)) for c in ids
        ]  # the loop's seeds: the same batches
        train = _vmap_round if vectorized else _client_round
        weights.update(train(args, net, weights, loaders, device, autocast))
        accuracy = evaluate(net.eval(), weights, dm, device)
        net.train()
        times.append(clock(args.accelerator) - start)
    return warm(times), accuracy, {k: v.cpu() for k, v in weights.items()}


def _client_round(args, net, weights, loaders, device, autocast):
    """One client after another: ``load_state_dict``, SGD with momentum, FedAvg's mean."""
    uploads = []
    for loader in loaders:
        net.load_state_dict(weights)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
        for _ in range(args.epochs):
            for x, y in loader:
                opt.zero_grad()
                with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                    out = net(x.to(device))
                torch.nn.functional.cross_entropy(out.float(), y.to(device)).backward()
                opt.step()
        uploads.append({n: p.detach().clone() for n, p in net.named_parameters()})
    # FedAvg as the loop's server computes it (float64, client order): the same bits
    return average_on_device(uploads, [len(loader.y) for loader in loaders])


def _vmap_round(args, net, weights, loaders, device, autocast):
    """All clients in one ``vmap(grad)`` per step: the round's batches stacked on the device
    first, a multi-tensor SGD with momentum, the mean of the clients' models."""
    names = [n for n, _ in net.named_parameters()]
    params = {n: weights[n].expand(len(loaders), *weights[n].shape).clone() for n in names}
    bufs = [torch.zeros_like(p) for p in params.values()]

    def loss(p, x, y):
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            out = functional_call(net, p, (x,))
        return torch.nn.functional.cross_entropy(out.float(), y)

    step = vmap(grad(loss))
    epochs = [list(zip(*loaders, strict=True)) for _ in range(args.epochs)]
    batches = [
        (torch.stack([b[0] for b in step_batches]).to(device),
         torch.stack([b[1] for b in step_batches]).to(device))
        for passes in epochs for step_batches in passes
    ]  # fmt: skip
    for x, y in batches:
        g = step(params, x, y)
        with torch.no_grad():
            torch._foreach_mul_(bufs, args.momentum)  # zeros first: SGD's buf = g
            torch._foreach_add_(bufs, [g[n] for n in names])
            torch._foreach_add_(list(params.values()), bufs, alpha=-args.lr)
    return {n: params[n].double().mean(0).float() for n in names}


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
