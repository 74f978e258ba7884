"""Ditto (Li et al., ICML 2021, arXiv:2012.04221, Algorithm 1) recomputed by hand from the paper's
equations on hand-made tensors: two local steps of the global model (plain SGD on F_k) and of the
personal model (SGD on F_k(v) + (lambda/2) ||v - w^t||^2, w^t fixed for the round) by the
analytic softmax gradient; the personal model kept in the client's state and deployed; the
personalized evaluation of a run scores each client's own v."""

import pytest
import torch
from torch import nn

from fedlightning import FederatedLoop
from fedlightning.clients import Ditto
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload
from hand_maths import T, ce_grad, pathological, t


def _step(client, optimizer, batch):
    optimizer.zero_grad()
    client.local_loss(batch).backward()
    optimizer.step()


def test_two_local_steps_and_the_next_round_by_hand():
    lam, lr = 0.5, 0.1
    w_t = (t(0.1, 0.2, -0.3, 0.4, 0.0, 0.5).reshape(2, 3), t(0.05, -0.05))
    v_0 = (t(-0.2, 0.3, 0.1, 0.0, 0.2, -0.1).reshape(2, 3), t(0.1, 0.0))
    batches = [(t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0).reshape(2, 3), torch.tensor([1, 0])),
               (t(0.5, 0.5, -1.0, 2.0, 0.0, 1.0).reshape(2, 3), torch.tensor([0, 0]))]  # fmt: skip
    client = Ditto(lam=lam, network=nn.Linear(3, 2).double(), num_classes=2, lr=lr, momentum=0.0)
    payload = Payload({"weight": w_t[0], "bias": w_t[1]})
    client.begin_client(0, payload, {"personal": {"weight": v_0[0], "bias": v_0[1]}})
    optimizer = client.configure_optimizers()
    w, v = w_t, v_0
    for x, y in batches:
        _step(client, optimizer, (x, y))
        gw, gb = ce_grad(*w, x, y)
        w = (w[0] - lr * gw, w[1] - lr * gb)  # w <- w - eta grad F_k(w)
        hw, hb = ce_grad(*v, x, y)  # v <- v - eta (grad F_k(v) + lambda (v - w^t))
        v = (v[0] - lr * (hw + lam * (v[0] - w_t[0])), v[1] - lr * (hb + lam * (v[1] - w_t[1])))
    weights, _, state = client.end_client(num_steps=2)
    torch.testing.assert_close(weights["weight"], w[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(weights["bias"], w[1], rtol=0, atol=1e-15)
    torch.testing.assert_close(state["personal"]["weight"], v[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(state["personal"]["bias"], v[1], rtol=0, atol=1e-15)
    assert client.personal_state(0, state, payload.weights) is state["personal"]
    # the next round starts v from the state and pulls it towards the new w^t
    w_next = {"weight": w[0] + 0.3, "bias": w[1] - 0.1}
    client.begin_client(0, Payload(w_next), state)
    x, y = batches[0]
    client.personal.zero_grad()
    client.local_loss((x, y)).backward()
    hw, _ = ce_grad(*v, x, y)
    torch.testing.assert_close(client.personal.weight.grad, hw + lam * (v[0] - w_next["weight"]),
                               rtol=0, atol=1e-14)  # fmt: skip


def test_a_first_participation_starts_v_at_the_received_model_and_deploys_it():
    client = Ditto(network=nn.Linear(3, 2).double(), num_classes=2)
    w_t = {"weight": torch.ones(2, 3, dtype=T), "bias": torch.zeros(2, dtype=T)}
    assert client.personal_state(0, {}, w_t) is w_t
    client.begin_client(0, Payload(w_t), {})
    assert torch.equal(client.personal.weight, w_t["weight"])
    x, y = torch.ones(4, 3, dtype=T), torch.tensor([0, 1, 0, 1])
    _, tracked = client.batch_metrics.step(client.local_loss, (x, y))
    # w = v = w^t: both cross-entropies are log 2, the proximal term 0
    assert tracked["train_loss"] == pytest.approx(float(torch.log(torch.tensor(2.0))))
    assert tracked["personal_train_loss"] == pytest.approx(tracked["train_loss"])


def test_each_client_deploys_its_own_personal_model(tmp_path):
    data = pathological()
    torch.manual_seed(0)
    loop = FederatedLoop(rounds=3, clients_per_round=6, run_dir=str(tmp_path), progress_bar=False,
                         plots=False)  # fmt: skip
    objective = Ditto(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)
    loop.fit(objective, datamodule=data)
    saved = torch.load(tmp_path / "personal.pt", weights_only=True)["clients"]
    for cid in range(6):
        own = loop.store.get(cid)["personal"]
        assert all(torch.equal(saved[cid]["state_dict"][k], v) for k, v in own.items())
    first, second = (saved[c]["state_dict"]["head.weight"] for c in (0, 1))
    assert not torch.equal(first, second)  # each its own v


def test_bad_lambda_and_heterogeneous_groups_are_refused_in_one_line():
    with pytest.raises(ConfigurationError, match=r"model.lam=-1.0 .*>= 0"):
        Ditto(lam=-1.0, network="mlp")
    with pytest.raises(ConfigurationError, match=r"^model.networks=\['mlp', 'cnn'\]: Ditto"):
        Ditto(networks=["mlp", "cnn"])
