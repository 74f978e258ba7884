"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020, arXiv:2006.08848, Algorithm 1) recomputed by hand
from the paper's equations on hand-made tensors: two local steps, each K = 3 inner steps on the
Moreau envelope's problem f(theta) + (lambda/2) ||theta - w||^2 (analytic softmax gradient) then
w <- w - eta lambda (w - theta); theta carried from step to step, kept and deployed; the server's
beta as FedAvgM without momentum; the cohort's one-line refusal."""

import pytest
import torch
from torch import nn

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend
from fedlightning.clients import PFedMe
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, Upload
from fedlightning.server import FedAvgM
from hand_maths import ce_grad, t


def test_two_local_steps_by_hand():
    lam, k, personal_lr, eta = 2.0, 3, 0.2, 0.05
    w = (t(0.1, 0.2, -0.3, 0.4, 0.0, 0.5).reshape(2, 3), t(0.05, -0.05))
    batches = [(t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0).reshape(2, 3), torch.tensor([1, 0])),
               (t(0.5, 0.5, -1.0, 2.0, 0.0, 1.0).reshape(2, 3), torch.tensor([0, 0]))]  # fmt: skip
    client = PFedMe(lam=lam, inner_steps=k, personal_lr=personal_lr,
                    network=nn.Linear(3, 2).double(), num_classes=2, lr=eta, momentum=0.0)  # fmt: skip
    client.begin_client(0, Payload({"weight": w[0], "bias": w[1]}), {})
    optimizer = client.configure_optimizers()
    theta = w  # theta starts the round at the received w^t
    for x, y in batches:
        optimizer.zero_grad()
        client.local_loss((x, y)).backward()
        optimizer.step()
        for _ in range(k):
            g = ce_grad(*theta, x, y)
            theta = tuple(t - personal_lr * (gi + lam * (t - wi))
                          for t, gi, wi in zip(theta, g, w, strict=True))  # fmt: skip
        w = tuple(wi - eta * lam * (wi - t) for wi, t in zip(w, theta, strict=True))
    weights, _, state = client.end_client(num_steps=2)
    for i, key in enumerate(("weight", "bias")):
        torch.testing.assert_close(weights[key], w[i], rtol=0, atol=1e-15)
        torch.testing.assert_close(state["personal"][key], theta[i], rtol=0, atol=1e-15)
    assert client.personal_state(0, state, {}) is state["personal"]
    assert client.personal_state(0, {}, weights) is weights  # before a first fit: the global


def test_the_servers_beta_is_fedavgm_without_momentum():
    """w <- (1 - beta) w + beta mean_i w_i, beta = 2 (the paper's beta > 1 runs)."""
    server = FedAvgM(server_lr=2.0, server_momentum=0.0, weighting="uniform")
    server.setup({"w": t(1.0, 2.0)}, 2)
    server.aggregate(0, [Upload(0, {"w": t(2.0, 2.0)}, 3, 1), Upload(1, {"w": t(0.0, 4.0)}, 5, 1)])
    mean = t(1.0, 3.0)
    torch.testing.assert_close(server.global_state()["w"], -1.0 * t(1.0, 2.0) + 2.0 * mean)


def test_the_cohort_and_bad_options_are_refused_in_one_line(tmp_path):
    data = FederatedDataModule(dataset="synthetic", num_samples=120, num_test=30, num_classes=3,
                               sample_shape=(6,), num_clients=4, batch_size=8, seed=0)  # fmt: skip
    loop = FederatedLoop(rounds=1, clients_per_round=2, run_dir=str(tmp_path), progress_bar=False,
                         plots=False, backend=CohortBackend())  # fmt: skip
    objective = PFedMe(network="mlp", num_classes=3, in_channels=6, image_size=1)
    with pytest.raises(ConfigurationError, match="PFedMe overrides training_step") as error:
        loop.fit(objective, datamodule=data)
    assert "\n" not in str(error.value)
    for kwargs, message in (({"lam": 0.0}, r"model.lam=0.0 .*> 0"),
                            ({"inner_steps": 0}, r"model.inner_steps=0 .*>= 1"),
                            ({"personal_lr": -1.0}, r"model.personal_lr=-1.0")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=message):
            PFedMe(network="mlp", **kwargs)
    with pytest.raises(ConfigurationError, match=r"^model.networks=\['mlp', 'cnn'\]: pFedMe"):
        PFedMe(networks=["mlp", "cnn"])
