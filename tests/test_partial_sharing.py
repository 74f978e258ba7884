"""FedBN, FedPer, LG-FedAvg, FedRep and FedBABU, each one round (and the personalized step)
recomputed from the papers' equations on hand-made tensors, without the library's helpers, and
compared with the library's clients and FedAvg (issue 39 items 2 and 3; docs/algorithms.md
section 10). The network has a BatchNorm layer, SGD has momentum and weight decay, and the two
clients hold different numbers of samples (FedAvg weights them by n_i)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlightning.clients import FedBABU, FedBN, FedPer, FedRep, LGFedAvg
from fedlightning.data.loader import TensorBatches
from fedlightning.errors import ConfigurationError
from fedlightning.fit import ClientFitter
from fedlightning.loop.fine_tune import fine_tune, fine_tune_batches
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.server import FedAvg

LR, MOMENTUM, WD, EPS, BN_MOMENTUM = 0.3, 0.5, 0.01, 1e-5, 0.1
BODY = ["features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias"]
BN_BUFFERS = ["features.1.running_mean", "features.1.running_var", "features.1.num_batches_tracked"]
HEAD = ["head.weight", "head.bias"]


class Net(nn.Module):
    """Linear(3, 4) -> BatchNorm1d(4) -> ReLU -> head Linear(4, 2)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU())
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.features(x))


def _initial():
    gen = torch.Generator().manual_seed(7)
    w = {
        "features.0.weight": torch.randn(4, 3, generator=gen),
        "features.0.bias": torch.randn(4, generator=gen),
        "features.1.weight": 1 + 0.1 * torch.randn(4, generator=gen),
        "features.1.bias": 0.1 * torch.randn(4, generator=gen),
        "features.1.running_mean": torch.zeros(4),
        "features.1.running_var": torch.ones(4),
        "features.1.num_batches_tracked": torch.tensor(0),
        "head.weight": torch.randn(2, 4, generator=gen),
        "head.bias": torch.randn(2, generator=gen),
    }
    return w


def _clients():
    gen = torch.Generator().manual_seed(3)
    x0, x1 = torch.randn(6, 3, generator=gen), torch.randn(9, 3, generator=gen) + 1
    return [(x0, torch.tensor([0, 1, 0, 0, 1, 0])), (x1, torch.tensor([1, 1, 0, 1, 1, 0, 1, 0, 1]))]


# -- the paper's arithmetic, by hand --------------------------------------------------------------
def _forward(w, x):
    """The network on a batch in train mode: the batch statistics normalise (biased variance),
    the running ones move by 0.1 towards the batch's (unbiased variance)."""
    h = x @ w["features.0.weight"].T + w["features.0.bias"]
    mean, var = h.mean(0), h.var(0, unbiased=False)
    normed = (h - mean) / torch.sqrt(var + EPS) * w["features.1.weight"] + w["features.1.bias"]
    logits = torch.relu(normed) @ w["head.weight"].T + w["head.bias"]
    n = len(x)
    stats = {
        "features.1.running_mean": (1 - BN_MOMENTUM) * w["features.1.running_mean"]
        + BN_MOMENTUM * mean.detach(),
        "features.1.running_var": (1 - BN_MOMENTUM) * w["features.1.running_var"]
        + BN_MOMENTUM * var.detach() * n / (n - 1),
        "features.1.num_batches_tracked": w["features.1.num_batches_tracked"] + 1,
    }
    return logits, stats


def _sgd(w, batches, trained, lr=LR, momentum=MOMENTUM, wd=WD):
    """SGD with momentum and weight decay over the keys ``trained`` (a fresh buffer: the first
    step's is the gradient), one step per batch; every BatchNorm statistic moves with each
    forward pass."""
    w = {k: v.clone() for k, v in w.items()}
    buffer = {}
    for x, y in batches:
        leaves = {k: w[k].clone().requires_grad_(True) for k in trained}
        logits, stats = _forward({**w, **leaves}, x)
        grads = torch.autograd.grad(F.cross_entropy(logits, y), list(leaves.values()))
        for k, g in zip(leaves, grads, strict=True):
            d = g + wd * w[k]
            buffer[k] = d if k not in buffer else momentum * buffer[k] + d
            w[k] = w[k] - lr * buffer[k]
        w.update(stats)
    return w


def _mean(states, sizes, keys):
    """FedAvg over the uploads: ``sum_i n_i w_i / sum_i n_i`` (integer counters: the first's)."""
    out = {}
    for k in keys:
        if not states[0][k].is_floating_point():
            out[k] = states[0][k]
            continue
        total = sum(n * s[k].double() for n, s in zip(sizes, states, strict=True))
        out[k] = (total / sum(sizes)).float()
    return out


def _batches(x, y, size, epochs=1):
    return [
        (x[i : i + size], y[i : i + size]) for _ in range(epochs) for i in range(0, len(y), size)
    ]


# -- the library -----------------------------------------------------------------------------------
class _Data:
    """The two data-module methods a client fit reads, over hand-made tensors (unshuffled)."""

    def __init__(self, clients, batch_size):
        self.clients, self.batch_size = clients, batch_size

    def client_train_dataloader(self, client_id, seed):
        x, y = self.clients[client_id]
        return TensorBatches(x, y, batch_size=self.batch_size)

    def client_num_samples(self, client_id):
        return len(self.clients[client_id][1])


def _library_round(objective, states, epochs=1, batch_size=3):
    """One round of both clients on the library: ``(payload keys, uploads, new states, server)``."""
    server = FedAvg()
    server.setup({k: v.clone() for k, v in _initial().items()}, 2,
                 client_keys=objective.client_key_sets(2),
                 parameters=objective.server_parameter_names())  # fmt: skip
    payloads = server.configure_round(0, [0, 1])
    fitter = ClientFitter(FitConfig(local_epochs=epochs, accelerator="cpu"))
    data = _Data(_clients(), batch_size)
    results = [fitter.fit(objective, data, ClientJob(0, i, payloads[i], states[i])) for i in (0, 1)]
    server.aggregate(0, [r.upload for r in results])
    return set(payloads[0].weights), [r.upload for r in results], [r.state for r in results], server


def _objective(cls, **kwargs):
    """``cls`` around the network at the initial weights (its kept part starts there)."""
    network = Net()
    network.load_state_dict(_initial())
    return cls(network=network, num_classes=2, lr=LR, momentum=MOMENTUM, weight_decay=WD, **kwargs)


def _close(a, b, keys):
    for k in keys:
        assert torch.allclose(a[k].float(), b[k].float(), atol=1e-6), k


@pytest.mark.parametrize(
    ("cls", "kept"),
    [(FedBN, ["features.1.weight", "features.1.bias", *BN_BUFFERS]),
     (FedPer, HEAD), (LGFedAvg, ["features.0.weight", "features.0.bias", "features.1.weight",
                                  "features.1.bias", *BN_BUFFERS])],
    ids=["FedBN", "FedPer", "LG-FedAvg"],
)  # fmt: skip
def test_one_round_trains_everything_shares_one_part_and_keeps_the_other(cls, kept):
    """FedBN, FedPer, LG-FedAvg: every client trains the whole network (its kept part from its
    state, here the initial one), uploads the shared part, FedAvg averages it by n_i; the kept
    part never leaves the client and the server's copy stays the initial one. Two rounds: the
    second starts from the averaged shared part and the client's own kept part."""
    initial, clients = _initial(), _clients()
    shared = [k for k in initial if k not in kept]
    payload_keys, uploads, states, server = _library_round(_objective(cls), [{}, {}])
    assert payload_keys == set(shared)  # only the shared part travels
    trained = [_sgd(initial, _batches(x, y, 3), [k for k in initial if k in BODY + HEAD])
               for x, y in clients]  # fmt: skip
    for upload, mine, state in zip(uploads, trained, states, strict=True):
        assert set(upload.weights) == set(shared)
        _close(upload.weights, mine, shared)
        _close(state["local"], mine, kept)
    expected = {**initial, **_mean(trained, [6, 9], shared)}
    _close(server.global_state(), expected, initial)
    objective = _objective(cls)
    personal = objective.personal_state(1, states[1], server.global_state())
    _close(personal, {**expected, **{k: trained[1][k] for k in kept}}, initial)
    # round 2 for client 1: from the averaged shared part and its own kept part
    fitter = ClientFitter(FitConfig(local_epochs=1, accelerator="cpu"))
    payload = server.configure_round(1, [1])[1]
    again = fitter.fit(objective, _Data(clients, 3), ClientJob(1, 1, payload, states[1]))
    second = _sgd(personal, _batches(*clients[1], 3), [k for k in initial if k in BODY + HEAD])
    _close(again.upload.weights, second, shared)
    _close(again.state["local"], second, kept)


def test_fedrep_trains_the_head_then_the_body_and_shares_the_body():
    """FedRep (Algorithm 1): tau_h epochs of the head with the body fixed, then the body with
    the head fixed (each phase's momentum fresh, as a layer frozen until then); upload the body."""
    initial, clients = _initial(), _clients()
    _, uploads, states, server = _library_round(_objective(FedRep, head_epochs=2), [{}, {}],
                                                epochs=3)  # fmt: skip
    shared = [k for k in initial if k not in HEAD]
    trained = []
    for x, y in clients:
        head_phase = _sgd(initial, _batches(x, y, 3, epochs=2), HEAD)
        trained.append(_sgd(head_phase, _batches(x, y, 3), [k for k in BODY]))
    for upload, mine, state in zip(uploads, trained, states, strict=True):
        assert set(upload.weights) == set(shared)
        _close(upload.weights, mine, shared)
        _close(state["local"], mine, HEAD)
    expected = {**initial, **_mean(trained, [6, 9], shared)}
    _close(server.global_state(), expected, initial)
    personal = _objective(FedRep).personal_state(0, states[0], server.global_state())
    _close(personal, {**expected, **{k: trained[0][k] for k in HEAD}}, initial)


def test_fedrep_splits_a_fit_of_another_length_in_the_papers_proportion():
    """``local_steps: 2`` with tau_h = 10, tau = 1: floor(2 * 10 / 11) = 1 head step, then 1
    body step (each on the next batch)."""
    initial, clients = _initial(), _clients()
    fitter = ClientFitter(FitConfig(local_steps=2, accelerator="cpu"))
    objective, server = _objective(FedRep), FedAvg()
    server.setup(_initial(), 2, client_keys=objective.client_key_sets(2))
    payload = server.configure_round(0, [1])[1]
    result = fitter.fit(objective, _Data(clients, 3), ClientJob(0, 1, payload, {}))
    first, second = _batches(*clients[1], 3)[:2]
    by_hand = _sgd(_sgd(initial, [first], HEAD), [second], BODY)
    _close(result.upload.weights, by_hand, [k for k in initial if k not in HEAD])
    _close(result.state["local"], by_hand, HEAD)


def test_fedbabu_trains_the_body_under_the_initial_head_then_fine_tunes_everything():
    """FedBABU: the head is never updated (nor uploaded, nor kept: every round starts from the
    initial one); the body is trained and averaged. The personalized model is the global one
    fine-tuned, body and head, for tau_f epochs (the loop's fine-tuning)."""
    initial, clients = _initial(), _clients()
    payload_keys, uploads, states, server = _library_round(_objective(FedBABU), [{}, {}])
    shared = [k for k in initial if k not in HEAD]
    assert payload_keys == set(shared) and states == [{}, {}]
    trained = [_sgd(initial, _batches(x, y, 3), BODY) for x, y in clients]
    for upload, mine in zip(uploads, trained, strict=True):
        _close(upload.weights, mine, shared)
    expected = {**initial, **_mean(trained, [6, 9], shared)}
    _close(server.global_state(), expected, initial)
    objective = _objective(FedBABU, fine_tune_epochs=2)
    assert objective.personal_defaults() == {"fine_tune_epochs": 2}
    deployed = objective.personal_state(0, states[0], server.global_state())
    network = Net()
    network.load_state_dict(deployed)
    x, y = clients[0]
    batches = fine_tune_batches(TensorBatches(x, y, 3), 0, 2)
    steps = fine_tune(network, batches, objective.make_optimizer, _no_autocast, seed=0)
    assert steps == 2 * math.ceil(6 / 3)
    _close(deployed, expected, initial)  # the global model (averaged body, initial head)
    # from the same start: BatchNorm amplifies the rounding of the average over the steps
    by_hand = _sgd(deployed, _batches(x, y, 3, epochs=2), BODY + HEAD)
    _close(network.state_dict(), by_hand, initial)
    assert not network.training and not any(p.requires_grad for p in network.parameters())


def _no_autocast():
    return torch.autocast("cpu", enabled=False)


@pytest.mark.parametrize("cls", [FedBN, FedPer, LGFedAvg, FedRep, FedBABU])
def test_heterogeneous_groups_are_refused_in_one_line(cls):
    with pytest.raises(ConfigurationError, match=r"model.networks=\['resnet14', 'resnet18'\]: "):
        cls(networks=["resnet14", "resnet18"], num_classes=3, in_channels=1, image_size=8)


def test_what_cannot_be_shared_is_refused_in_one_line():
    with pytest.raises(ConfigurationError, match="keeps 0 of the network's"):
        FedBN(network="cnn", num_classes=3, in_channels=1, image_size=8)  # no BatchNorm layer
    with pytest.raises(ConfigurationError, match=r"model.init_args.head=\['fc'\]: 'fc' is not a"):
        FedPer(head=["fc"], network="cnn", num_classes=3, in_channels=1, image_size=8)
    with pytest.raises(ConfigurationError, match="model.init_args.head_epochs"):
        FedRep(head_epochs=0, network="cnn", num_classes=3, in_channels=1, image_size=8)
