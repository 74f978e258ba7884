"""FedRoD (Chen & Chao, ICLR 2022, arXiv:2107.00778) recomputed by hand from the paper's equations
on hand-made tensors: one local step of the body and generic head on the balanced softmax loss
CE(z_G + log pi, y) and of the personalized head on CE(z_G + h_P(phi), y) (z_G, phi detached), by
the analytic softmax gradient on a linear body; the deployed model z_G + h_P(phi); a client
holding one class (log pi = -inf elsewhere) stays finite; a run's clients deploy their own heads."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedlightning import FederatedLoop
from fedlightning.clients import FedRoD
from fedlightning.clients.fedrod import TwoHeads
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload
from hand_maths import T, pathological, t


class _Linear(nn.Module):
    """phi = A x + a, z_G = W phi + b (a body and a ``head``, as the registered models)."""

    def __init__(self):
        super().__init__()
        self.features, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.features(x))


def _client(counts, lr):
    client = FedRoD(network=_Linear(), num_classes=2, lr=lr, momentum=0.0).double()
    client.prepare_clients(SimpleNamespace(partition_table=lambda: counts))
    return client


def test_one_local_step_by_hand():
    lr = 0.1
    a = (t(0.1, -0.2, 0.3, 0.0, 0.5, -0.1, 0.2, 0.2, 0.0, -0.3, 0.1, 0.4).reshape(4, 3),
         t(0.0, 0.1, -0.1, 0.2))  # fmt: skip
    w = (t(0.3, -0.1, 0.2, 0.0, -0.2, 0.4, 0.1, 0.3).reshape(2, 4), t(0.05, -0.05))
    p = (t(0.2, 0.1, -0.3, 0.0, 0.1, 0.0, 0.2, -0.1).reshape(2, 4), t(0.1, 0.0))
    x, y = t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0, 2.0, 1.0, -1.0).reshape(3, 3), torch.tensor([1, 0, 0])
    client = _client([[3, 1]], lr)
    weights = {"features.weight": a[0], "features.bias": a[1], "head.weight": w[0],
               "head.bias": w[1]}  # fmt: skip
    client.begin_client(0, Payload(weights), {"p_head": {"weight": p[0], "bias": p[1]}})
    optimizer = client.configure_optimizers()
    optimizer.zero_grad()
    client.local_loss((x, y)).backward()
    optimizer.step()
    onehot = torch.eye(2, dtype=T)[y]
    phi = x @ a[0].T + a[1]
    z_g = phi @ w[0].T + w[1]
    log_prior = torch.log(t(0.75, 0.25))
    r_g = (torch.softmax(z_g + log_prior, dim=1) - onehot) / 3  # balanced softmax's residual
    r_p = (torch.softmax(z_g + phi @ p[0].T + p[1], dim=1) - onehot) / 3
    expected = {
        "head.weight": w[0] - lr * r_g.T @ phi, "head.bias": w[1] - lr * r_g.sum(0),
        "features.weight": a[0] - lr * (r_g @ w[0]).T @ x,
        "features.bias": a[1] - lr * (r_g @ w[0]).sum(0),
    }  # fmt: skip
    trained, _, state = client.end_client(num_steps=1)
    for key, value in expected.items():
        torch.testing.assert_close(trained[key], value, rtol=0, atol=1e-15)
    torch.testing.assert_close(
        state["p_head"]["weight"], p[0] - lr * r_p.T @ phi, rtol=0, atol=1e-15
    )
    torch.testing.assert_close(state["p_head"]["bias"], p[1] - lr * r_p.sum(0), rtol=0, atol=1e-15)
    # the deployed model: z_G + h_P(phi) with the trained weights
    model = TwoHeads(_Linear(), nn.Linear(4, 2)).double()
    model.load_state_dict(client.personal_state(0, state, trained))
    phi = x @ trained["features.weight"].T + trained["features.bias"]
    head = state["p_head"]
    logits = (
        phi @ trained["head.weight"].T
        + trained["head.bias"]
        + phi @ head["weight"].T
        + head["bias"]
    )
    torch.testing.assert_close(model(x), logits, rtol=0, atol=1e-15)


def test_a_client_holding_one_class_and_a_first_participation():
    client = _client([[0, 5]], 0.1)
    client.begin_client(0, Payload(client.network.state_dict()), {})
    assert torch.equal(client.p_head.weight, torch.zeros(2, 4, dtype=T))  # the generic model
    x, y = torch.ones(4, 3, dtype=T), torch.tensor([1, 1, 1, 1])
    loss = client.local_loss((x, y))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(q.grad).all() for q in client.parameters())


def test_each_client_deploys_its_generic_model_plus_its_own_head(tmp_path):
    data = pathological()
    torch.manual_seed(0)
    loop = FederatedLoop(rounds=2, clients_per_round=6, run_dir=str(tmp_path), progress_bar=False,
                         plots=False)  # fmt: skip
    loop.fit(FedRoD(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1),
             datamodule=data)  # fmt: skip
    saved = torch.load(tmp_path / "personal.pt", weights_only=True)["clients"]
    server = loop.aggregator.global_state()
    for cid in range(6):
        entry = saved[cid]
        assert entry["architecture"] == "fedrod:mlp"
        assert torch.equal(entry["state_dict"]["network.head.weight"], server["head.weight"])
        assert torch.equal(
            entry["state_dict"]["p_head.weight"], loop.store.get(cid)["p_head"]["weight"]
        )
    assert loop.history[-1]["personal_acc"] > 0.5


def test_heterogeneous_groups_and_a_network_without_a_head_are_refused_in_one_line():
    with pytest.raises(ConfigurationError, match=r"^model.networks=\['mlp', 'cnn'\]: FedRoD"):
        FedRoD(networks=["mlp", "cnn"])
    with pytest.raises(ConfigurationError, match="linear classifier `head`"):
        FedRoD(network=nn.Sequential(nn.Linear(3, 2)), num_classes=2)
