"""FedDyn and FedYogi against independent implementations: a hand-written plain-torch loop of three
rounds (2 of 4 clients a round, each taking full-batch SGD steps on its own samples) written from
the papers' equations, compared with the library's run of the same federation (sequential
backend). Like the library, the loop keeps its state in float32 (the model's dtype) and does the
server's arithmetic in float64; Yogi's division by sqrt(v) magnifies any other rounding. FedDyn: Acar et al., ICLR 2021, arXiv:2111.04263, Algorithm 1 (the client's gradient
state and the server's h); FedYogi: Reddi et al., ICLR 2021, arXiv:2003.00295, Algorithm 2."""

import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import SequentialBackend
from fedlightning.clients import ClientModule, FedDynClient
from fedlightning.loop.sampling import sample_clients
from fedlightning.server import FedDyn, FedYogi

NET = dict(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)
ROUNDS, STEPS, NUM_CLIENTS, PER_ROUND, SEED = 3, 4, 4, 2, 0


def _data() -> FederatedDataModule:
    """Batches larger than any client's split: every step is a full-batch gradient step."""
    return FederatedDataModule(
        dataset="synthetic", num_samples=240, num_test=60, num_classes=3, sample_shape=(6,),
        num_clients=NUM_CLIENTS, partition="dirichlet", beta=0.5, batch_size=1000, seed=SEED,
    )  # fmt: skip


def _library(objective, aggregator, tmp_path):
    """The library's run; returns (the initial parameters, the final global state, the data)."""
    initial = {k: v.detach().clone() for k, v in objective.network.named_parameters()}
    network = copy.deepcopy(objective.network)
    loop = FederatedLoop(
        rounds=ROUNDS, clients_per_round=PER_ROUND, local_steps=STEPS, aggregator=aggregator,
        run_dir=str(tmp_path), progress_bar=False, plots=False, backend=SequentialBackend(),
        seed=SEED,
    )  # fmt: skip
    dm = _data()
    loop.fit(objective, datamodule=dm)
    samples = [dm.client_train_dataloader(i, seed=0) for i in range(NUM_CLIENTS)]
    return initial, network, loop.aggregator.global_state(), [(b.x, b.y) for b in samples]


def _local_sgd(network, server, data, extra_loss):
    """STEPS plain full-batch gradient steps of ``CE + extra_loss(params)`` from ``server``."""
    params = {k: v.clone().requires_grad_(True) for k, v in server.items()}
    x, y = data
    for _ in range(STEPS):
        loss = F.cross_entropy(functional_call(network, params, (x,)), y) + extra_loss(params)
        grads = torch.autograd.grad(loss, list(params.values()))
        params = {
            k: (p - NET["lr"] * g).detach().requires_grad_(True)
            for (k, p), g in zip(params.items(), grads, strict=True)
        }
    return {k: p.detach() for k, p in params.items()}


def test_feddyn_equals_a_plain_torch_loop(tmp_path):
    alpha = 0.1
    torch.manual_seed(0)
    initial, network, library, data = _library(
        FedDynClient(**NET), FedDyn(alpha=alpha), tmp_path / "run"
    )
    server = dict(initial)
    h = {k: torch.zeros_like(v) for k, v in server.items()}
    grad = [{k: torch.zeros_like(v) for k, v in server.items()} for _ in range(NUM_CLIENTS)]
    for r in range(ROUNDS):
        trained = []
        for i in sample_clients(SEED, r, NUM_CLIENTS, PER_ROUND):

            def dyn(params, g=grad[i], anchor=server):
                linear = sum((g[k] * p).sum() for k, p in params.items())
                prox = sum(((p - anchor[k]) ** 2).sum() for k, p in params.items())
                return -linear + alpha / 2 * prox

            theta = _local_sgd(network, server, data[i], dyn)
            grad[i] = {k: (grad[i][k].double() - alpha * (theta[k].double() - server[k].double()))
                       .float() for k in server}  # fmt: skip
            trained.append({k: t.double() for k, t in theta.items()})
        theta64 = {k: v.double() for k, v in server.items()}
        mean = {k: sum(t[k] for t in trained) / len(trained) for k in server}
        h64 = {k: h[k].double() - alpha / NUM_CLIENTS * sum(t[k] - theta64[k] for t in trained)
               for k in h}  # fmt: skip
        server = {k: (mean[k] - h64[k] / alpha).float() for k in server}
        h = {k: v.float() for k, v in h64.items()}
    for key, value in server.items():
        torch.testing.assert_close(library[key], value, rtol=1e-5, atol=1e-6)
    # the independent loop moved the model: the comparison is not of two untouched copies
    assert max((server[k] - initial[k]).abs().max() for k in server) > 1e-2


def test_fedyogi_equals_a_plain_torch_loop(tmp_path):
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    torch.manual_seed(0)
    initial, network, library, data = _library(
        ClientModule(**NET), FedYogi(server_lr=eta, beta1=b1, beta2=b2, tau=tau), tmp_path / "run"
    )
    server = dict(initial)
    m = {k: torch.zeros_like(v) for k, v in server.items()}
    v = {k: torch.full_like(x, tau**2) for k, x in server.items()}
    for r in range(ROUNDS):
        clients = sample_clients(SEED, r, NUM_CLIENTS, PER_ROUND)
        trained = [_local_sgd(network, server, data[i], lambda p: 0.0) for i in clients]
        sizes = [len(data[i][1]) for i in clients]  # FedAvg's n_i-weighted mean
        mean = {
            k: (sum(n * t[k].double() for n, t in zip(sizes, trained, strict=True)) / sum(sizes))
            .float().double()  # the library rounds the mean to the model's dtype
            for k in server
        }  # fmt: skip
        for k in server:
            delta = mean[k] - server[k].double()
            m64 = b1 * m[k].double() + (1 - b1) * delta
            v64 = v[k].double() - (1 - b2) * delta**2 * torch.sign(v[k].double() - delta**2)
            server[k] = (server[k].double() + eta * m64 / (v64.sqrt() + tau)).float()
            m[k], v[k] = m64.float(), v64.float()
    for key, value in server.items():
        torch.testing.assert_close(library[key], value, rtol=1e-5, atol=1e-6)
    assert max((server[k] - initial[k]).abs().max() for k in server) > 1e-2
