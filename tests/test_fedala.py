"""FedALA (Zhang et al., AAAI 2023, arXiv:2212.01197, the ALA module) recomputed by hand from the
paper's equations on hand-made tensors: a round's adaptive local aggregation of the top layer
(W <- clip(W - eta g (theta - theta_i), 0, 1) per batch, the analytic softmax gradient at theta_hat,
the lower layer taken from the global model), the start phase's repeated passes, the kept
model deployed; the cohort trains it as the sequential backend does."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedlightning import FederatedLoop
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.clients import FedALA
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload
from hand_maths import T, pathological, t


class _Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.features, self.head = nn.Linear(3, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.features(x))


X = t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0, 2.0, 1.0, -1.0, 0.5, 0.5, 0.5).reshape(4, 3)
Y = torch.tensor([1, 0, 0, 1])
GLOBAL = {"features.weight": t(0.1, 0.2, -0.3, 0.4, 0.0, 0.5).reshape(2, 3),
          "features.bias": t(0.05, -0.05), "head.weight": t(0.9, -0.4, 0.3, 0.7).reshape(2, 2),
          "head.bias": t(0.2, -0.1)}  # fmt: skip
LOCAL = {"features.weight": t(0.3, 0.0, 0.1, -0.2, 0.2, 0.0).reshape(2, 3),
         "features.bias": t(0.0, 0.1), "head.weight": t(-0.5, 0.6, 0.2, -0.3).reshape(2, 2),
         "head.bias": t(-0.2, 0.3)}  # fmt: skip


def _client(eta, **kwargs):
    client = FedALA(eta=eta, rand_percent=100, layer_idx=2, network=_Linear(), num_classes=2,
                    **kwargs).double()  # fmt: skip
    data = SimpleNamespace(x=X, y=Y)
    client.prepare_clients(SimpleNamespace(client_train_dataloader=lambda cid, seed: data,
                                           batch_size=2))  # fmt: skip
    return client


def _ala_pass(w, eta):
    """One pass of ALA over X's two batches of 2, by hand: returns W and the last batch's loss."""
    phi_w, phi_b = GLOBAL["features.weight"], GLOBAL["features.bias"]  # lower layer: the global
    diff = {n: GLOBAL[n] - LOCAL[n] for n in ("head.weight", "head.bias")}
    loss = None
    for i in (0, 2):
        x, y = X[i : i + 2], Y[i : i + 2]
        hw, hb = (LOCAL[n] + diff[n] * w[n] for n in ("head.weight", "head.bias"))
        phi = x @ phi_w.T + phi_b
        logits = phi @ hw.T + hb
        probs = torch.softmax(logits, dim=1)
        loss = float(-torch.log(probs[range(2), y]).mean())
        r = (probs - torch.eye(2, dtype=T)[y]) / 2
        grads = {"head.weight": r.T @ phi, "head.bias": r.sum(0)}
        w = {n: (w[n] - eta * grads[n] * diff[n]).clamp(0, 1) for n in w}
    return w, loss


def test_one_round_of_adaptive_local_aggregation_by_hand():
    eta = 5.0
    client = _client(eta)
    ones = {n: torch.ones_like(GLOBAL[n]) for n in ("head.weight", "head.bias")}
    state = {"local": LOCAL, "ala_weights": ones, "ala_started": True}  # after the start phase
    client.begin_client(0, Payload(GLOBAL), state)
    w, _ = _ala_pass(ones, eta)
    assert any(((v > 0) & (v < 1)).any() for v in w.values())  # neither end: a real mixture
    for name in ("head.weight", "head.bias"):
        torch.testing.assert_close(client._ala_weights[name], w[name], rtol=0, atol=1e-15)
        expected = LOCAL[name] + (GLOBAL[name] - LOCAL[name]) * w[name]
        torch.testing.assert_close(client.network.state_dict()[name], expected, rtol=0, atol=1e-15)
    assert torch.equal(client.network.features.weight, GLOBAL["features.weight"])
    weights, _, new = client.end_client(num_steps=0)
    assert new["ala_started"] and torch.equal(new["local"]["head.bias"], weights["head.bias"])
    assert client.personal_state(0, new, GLOBAL) is new["local"]


def test_the_start_phase_repeats_passes_until_the_losses_settle():
    """In the first aggregation, passes repeat while the std of the last num_pre_loss pass losses
    is at least threshold (here: 3 losses, a threshold no pass reaches: max_start_passes)."""
    eta = 0.5
    client = _client(eta, num_pre_loss=3, threshold=1e-12, max_start_passes=4)
    ones = {n: torch.ones_like(GLOBAL[n]) for n in ("head.weight", "head.bias")}
    client.begin_client(0, Payload(GLOBAL), {"local": LOCAL, "ala_started": False})
    w = ones
    for _ in range(4):
        w, _ = _ala_pass(w, eta)
    for name in w:
        torch.testing.assert_close(client._ala_weights[name], w[name], rtol=0, atol=1e-15)


def test_a_first_participation_trains_the_global_model():
    client = _client(1.0)
    client.begin_client(0, Payload(GLOBAL), {})
    assert torch.equal(client.network.head.weight, GLOBAL["head.weight"])
    assert client.personal_state(0, {}, GLOBAL) is GLOBAL


def test_a_run_deploys_each_clients_kept_model_on_every_backend(tmp_path):
    stores = {}
    for backend in (SequentialBackend(), CohortBackend()):
        torch.manual_seed(0)
        loop = FederatedLoop(rounds=3, clients_per_round=6, backend=backend, progress_bar=False,
                             run_dir=str(tmp_path / type(backend).__name__), plots=False)  # fmt: skip
        loop.fit(FedALA(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1),
                 datamodule=pathological())  # fmt: skip
        stores[type(backend)] = loop.store
    saved = torch.load(tmp_path / "SequentialBackend" / "personal.pt", weights_only=True)
    for cid in range(6):
        mine, theirs = (stores[b].get(cid) for b in (SequentialBackend, CohortBackend))
        assert torch.equal(saved["clients"][cid]["state_dict"]["head.weight"],
                           mine["local"]["head.weight"])  # fmt: skip
        torch.testing.assert_close(theirs["local"]["head.weight"], mine["local"]["head.weight"],
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
        assert mine["ala_started"]


def test_bad_options_are_refused_in_one_line():
    for kwargs, message in (({"eta": 0.0}, r"model.eta=0.0"), ({"rand_percent": 0},
                            r"model.rand_percent=0 .*\(0, 100\]"), ({"layer_idx": 0},
                            r"model.layer_idx=0 .*>= 1")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=message) as error:
            FedALA(network="mlp", **kwargs)
        assert "\n" not in str(error.value)
