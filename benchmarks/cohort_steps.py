"""The steps table of ``benchmarks/cohort.py``: the cohort's own cost per step against a
vmapped step written by hand, on the same model, clients and batches (docs/algorithms.md section
9.2).

``cohort`` is each full step of a real ``FederatedLoop`` round on the ``CohortBackend``, timed
around the backend's own call (batch gather, vmapped gradient through the objective's
``local_loss``, BatchNorm buffers, tracked loss, multi-tensor SGD; replayed as a CUDA graph on a
GPU), the median over the round's full steps after the first two. ``by hand`` is
``vmap(grad(cross_entropy(functional_call(net, ...))))`` with a foreach SGD with momentum and the
batch gathered from the same kind of pool, eager, the median of as many steps. Both on one
device, interleaved per repeat; ``aten ops`` counts the operations each step dispatches
(``TorchDispatchMode``), the CPU-checkable proxy of launch overhead. On the CPU a step's time is
its thread's CPU time (run with ``--threads 1``), so that other work on a shared machine does not
count; on a GPU, wall time after the device's queued work.
"""

from __future__ import annotations

import collections
import statistics
import tempfile
import time

import torch
from rich.table import Table
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils._python_dispatch import TorchDispatchMode

from budget import Budget
from devices import clock, device_name
from fedlightning import FedAvg, FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend
from fedlightning.backends.cohort.capture import FullSteps
from fedlightning.clients import ClientModule

#: model name -> (ClientModule arguments, sample shape)
MODELS = {
    "tiny MLP": (dict(network="mlp", network_kwargs={"hidden": [32]}, in_channels=6, image_size=1),
                 (6,)),
    "quickstart CNN": (dict(network="cnn", in_channels=1, image_size=8), (1, 8, 8)),
}  # fmt: skip
CLIENTS, BATCH, STEPS = 10, 32, 20


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _clock(accelerator: str) -> float:
    return time.thread_time() if accelerator == "cpu" else clock(accelerator)


def _cohort(kwargs, shape, accelerator) -> tuple[float, int, ClientModule]:
    """The median seconds of a round's full steps after two, their ops, and the model."""
    times, ops, original = [], [], FullSteps.__call__

    def timed(self, size, k):
        if len(times) == 2:  # one step counted, outside the timing
            with _Ops() as mode:
                original(self, size, k)
            ops.append(sum(mode.count.values()))
            times.append(None)
            return
        start = _clock(accelerator)
        original(self, size, k)
        times.append(_clock(accelerator) - start)

    dm = FederatedDataModule(
        dataset="synthetic", num_samples=CLIENTS * BATCH * STEPS, num_test=50, num_classes=10,
        sample_shape=shape, num_clients=CLIENTS, partition="iid", batch_size=BATCH,
    )  # fmt: skip
    torch.manual_seed(0)
    model = ClientModule(**kwargs, num_classes=10, lr=0.05, momentum=0.5)
    FullSteps.__call__ = timed
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            loop = FederatedLoop(
                rounds=1, clients_per_round=CLIENTS, aggregator=FedAvg(), backend=CohortBackend(),
                accelerator=accelerator, run_dir=run_dir, progress_bar=False, plots=False,
                num_threads=None,  # the process's threads (--threads), as the step by hand
            )  # fmt: skip
            loop.console.quiet = True
            loop.fit(model, datamodule=dm)
    finally:
        FullSteps.__call__ = original
    steady = [t for t in times[3:] if t is not None]
    return statistics.median(steady), ops[0], model


def _by_hand(model: ClientModule, shape, accelerator) -> tuple[float, int]:
    device = torch.device(accelerator)
    net = model.network.to(device)
    params = {n: p.detach().expand(CLIENTS, *p.shape).clone() for n, p in net.named_parameters()}
    bufs = [torch.zeros_like(p) for p in params.values()]
    pool = torch.randn(CLIENTS * BATCH * STEPS, *shape, device=device)
    labels = torch.randint(0, 10, (len(pool),), device=device)
    rows = torch.randperm(len(pool), device=device)[: CLIENTS * BATCH].view(CLIENTS, BATCH)

    def loss(p, x, y):
        return nn.functional.cross_entropy(functional_call(net, p, (x,)), y)

    gradient = vmap(grad(loss))

    def step():
        g = gradient(params, pool[rows], labels[rows])
        with torch.no_grad():
            torch._foreach_mul_(bufs, 0.5)
            torch._foreach_add_(bufs, [g[n] for n in params])
            torch._foreach_add_(list(params.values()), bufs, alpha=-0.05)

    times = []
    for _ in range(STEPS):
        start = _clock(accelerator)
        step()
        times.append(_clock(accelerator) - start)
    with _Ops() as mode:
        step()
    return statistics.median(times[3:]), sum(mode.count.values())


def steps_table(args, console, budget: Budget) -> None:
    table = Table(
        title=f"the cohort's step against a vmapped step by hand: {CLIENTS} clients, batch "
        f"{BATCH}, SGD with momentum ({device_name(args.accelerator)}); median (range) of the "
        "per-repeat medians"
    )
    for column in ("model", "cohort us/step", "by hand us/step", "cohort / by hand",
                   "aten ops cohort", "aten ops by hand"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=True)
    for name, (kwargs, shape) in MODELS.items():
        runs, last = [], 0.0
        while len(runs) < args.repeats and (not runs or budget.allows(last)):
            start = clock(args.accelerator)
            cohort, cohort_ops, model = _cohort(kwargs, shape, args.accelerator)
            runs.append((cohort, *_by_hand(model, shape, args.accelerator), cohort_ops))
            last = clock(args.accelerator) - start
        ratios = [c / h for c, h, _, _ in runs]
        table.add_row(
            name, _spread([r[0] * 1e6 for r in runs]), _spread([r[1] * 1e6 for r in runs]),
            _spread(ratios, 2), str(runs[0][3]), str(runs[0][2]),
        )  # fmt: skip
    console.print(table)


def _spread(values: list[float], digits: int = 0) -> str:
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f})")  # fmt: skip
