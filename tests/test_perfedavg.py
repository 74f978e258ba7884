"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, arXiv:2002.07948, Algorithm 1 with its
first-order and Hessian-free steps) recomputed by hand from the paper's equations on hand-made
tensors: two local steps of each variant by the analytic softmax gradient (the Hessian-free
central difference of two analytic gradients); the evaluation's one-step personalization; the
cohort's one-line refusal."""

import pytest
import torch
from torch import nn

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend
from fedlightning.clients import PerFedAvg
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload
from hand_maths import T, ce_grad, pathological, t


def _axpy(a, x, y):
    """``y + a x`` over (W, b) pairs."""
    return tuple(yi + a * xi for xi, yi in zip(x, y, strict=True))


BATCHES = [
    (t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0, 2.0, 1.0, -1.0, 0.5, 0.5, 0.5).reshape(4, 3),
     torch.tensor([1, 0, 1, 1])),
    (t(0.5, 0.5, -1.0, 2.0, 0.0, 1.0, -1.0, 1.0, 1.0, 0.0, -2.0, 1.0).reshape(4, 3),
     torch.tensor([0, 0, 1, 0])),
]  # fmt: skip


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_two_local_steps_by_hand(variant):
    alpha, beta, delta = 0.3, 0.1, 1e-3
    w = (t(0.1, 0.2, -0.3, 0.4, 0.0, 0.5).reshape(2, 3), t(0.05, -0.05))
    client = PerFedAvg(alpha=alpha, variant=variant, delta=delta, network=nn.Linear(3, 2).double(),
                       num_classes=2, lr=beta, momentum=0.0)  # fmt: skip
    client.begin_client(0, Payload({"weight": w[0], "bias": w[1]}), {})
    optimizer = client.configure_optimizers()
    for x, y in BATCHES:
        optimizer.zero_grad()
        client.local_loss((x, y)).backward()
        optimizer.step()
        (xd, xd2), (yd, yd2) = (x[:2], x[2:]), (y[:2], y[2:])  # D and D': the batch's halves
        w_tmp = _axpy(-alpha, ce_grad(*w, xd, yd), w)
        u = ce_grad(*w_tmp, xd2, yd2)
        d = u
        if variant == "hf":  # (I - alpha H(w; D)) u by a central difference
            plus = ce_grad(*_axpy(delta, u, w), xd, yd)
            minus = ce_grad(*_axpy(-delta, u, w), xd, yd)
            hvp = tuple((a - b) / (2 * delta) for a, b in zip(plus, minus, strict=True))
            d = _axpy(-alpha, hvp, u)
        w = _axpy(-beta, d, w)
    weights, _, _ = client.end_client(num_steps=2)
    tolerance = 1e-15 if variant == "fo" else 1e-12  # HF divides a rounding by 2 delta
    torch.testing.assert_close(weights["weight"], w[0], rtol=0, atol=tolerance)
    torch.testing.assert_close(weights["bias"], w[1], rtol=0, atol=tolerance)


def test_the_hessian_free_step_approximates_the_exact_hessian():
    """On the linear model the central difference is the exact Hessian-vector product to
    O(delta^2): the HF step equals Algorithm 1's exact step, (I - alpha H) u, by autograd."""
    alpha, delta = 0.3, 1e-4
    x, y = BATCHES[0]
    w = torch.tensor([0.1, 0.2, -0.3, 0.4, 0.0, 0.5, 0.05, -0.05], dtype=T)

    def f(flat, xs, ys):
        logits = xs @ flat[:6].reshape(2, 3).T + flat[6:]
        return torch.nn.functional.cross_entropy(logits, ys)

    grad = torch.func.grad(f)
    u = grad(w - alpha * grad(w, x[:2], y[:2]), x[2:], y[2:])
    at = w.clone().requires_grad_(True)  # H u by double backward: d/dw <grad f(w), u>
    (g,) = torch.autograd.grad(f(at, x[:2], y[:2]), at, create_graph=True)
    (hvp,) = torch.autograd.grad((g * u).sum(), at)
    exact = u - alpha * hvp
    client = PerFedAvg(alpha=alpha, delta=delta, network=nn.Linear(3, 2).double(), num_classes=2)
    client.begin_client(0, Payload({"weight": w[:6].reshape(2, 3), "bias": w[6:]}), {})
    client.local_loss((x, y)).backward()
    step = torch.cat([client.network.weight.grad.flatten(), client.network.bias.grad])
    torch.testing.assert_close(step, exact, rtol=0, atol=1e-8)


def test_clients_personalize_by_one_step_at_alpha_and_the_cohort_refuses(tmp_path):
    objective = PerFedAvg(alpha=0.05, network="mlp", num_classes=3, in_channels=6, image_size=1)
    assert objective.personal_defaults() == {"fine_tune_steps": 1, "fine_tune_lr": 0.05}
    torch.manual_seed(0)
    loop = FederatedLoop(rounds=2, clients_per_round=3, run_dir=str(tmp_path / "a"),
                         progress_bar=False, plots=False)  # fmt: skip
    loop.fit(objective, datamodule=pathological())
    saved = torch.load(tmp_path / "a" / "personal.pt", weights_only=True)["clients"]
    server = loop.aggregator.global_state()
    assert len(saved) == 6 and not torch.equal(saved[0]["state_dict"]["head.weight"],
                                               server["head.weight"])  # fmt: skip
    loop = FederatedLoop(rounds=1, clients_per_round=2, run_dir=str(tmp_path / "b"),
                         progress_bar=False, plots=False, backend=CohortBackend())  # fmt: skip
    with pytest.raises(ConfigurationError, match="PerFedAvg overrides training_step") as error:
        loop.fit(objective, datamodule=pathological())
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"alpha": 0.0}, r"model.alpha=0.0 .*> 0"), ({"variant": "so"}, r"model.variant='so'"),
     ({"delta": -1.0}, r"model.delta=-1.0")],
)  # fmt: skip
def test_bad_options_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ConfigurationError, match=message) as error:
        PerFedAvg(network="mlp", **kwargs)
    assert "\n" not in str(error.value)


def test_a_batch_of_one_sample_is_refused_naming_the_options_that_avoid_it():
    """A client's last batch of one sample (a Dirichlet client of mnist5k has one at batches of
    20) cannot be split into D and D': the refusal names both options that prevent it, the
    batch size and the minimum batch a smaller last one joins."""
    client = PerFedAvg(network=nn.Linear(3, 2).double(), num_classes=2, lr=0.1, momentum=0.0)
    w = {"weight": t(0.1, 0.2, -0.3, 0.4, 0.0, 0.5).reshape(2, 3), "bias": t(0.05, -0.05)}
    client.begin_client(0, Payload(w), {})
    x, y = BATCHES[0]
    with pytest.raises(ConfigurationError, match="a batch has 1 sample") as refused:
        client.local_loss((x[:1], y[:1]))
    assert "data.batch_size and data.min_batch_size to 2 or more" in str(refused.value)
    client.local_loss((x[:2], y[:2])).backward()  # two samples: one in each half


def test_a_run_with_a_batch_of_one_sample_is_refused_before_training(tmp_path):
    """Per-FedAvg declares its two halves (``min_batch_samples``): a run whose client would train
    on a last batch of one sample is refused at start-up, in one line naming the client, the
    reason and data.min_batch_size, and writes nothing; with the minimum at 2 it trains."""

    def data(**kwargs):
        return FederatedDataModule(
            dataset="synthetic", num_samples=176, num_test=40, num_classes=3,
            sample_shape=(3, 2, 2), num_clients=4, partition="iid", val_fraction=0.0,
            client_test_fraction=0.25, **kwargs,
        )  # fmt: skip

    def loop(name):
        return FederatedLoop(rounds=1, clients_per_round=2, run_dir=str(tmp_path / name),
                             progress_bar=False, plots=False)  # fmt: skip

    objective = PerFedAvg(network="mlp", num_classes=3, in_channels=3, image_size=2)
    with pytest.raises(ConfigurationError) as refused:
        loop("refused").fit(objective, datamodule=data())
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        "client 2 has 33 training samples: data.batch_size=32 leaves it a last batch of 1 sample,"
    )
    assert "PerFedAvg splits each training batch into two halves D and D'" in message
    assert "set data.min_batch_size to 2 or more" in message
    assert not (tmp_path / "refused" / "metrics.csv").exists()
    loop("trained").fit(objective, datamodule=data(min_batch_size=2))
    assert (tmp_path / "trained" / "metrics.csv").is_file()
