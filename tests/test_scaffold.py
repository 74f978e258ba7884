"""SCAFFOLD: option II control variates on hand-made numbers, one real step, the server update."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlightning import Payload, Upload
from fedlightning.clients import ScaffoldClient
from fedlightning.clients.scaffold import scaffold_control_update
from fedlightning.data.loader import TensorBatches
from fedlightning.errors import ConfigurationError
from fedlightning.fit import ClientFitter
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.server import Scaffold
from fedlightning.server.base import ClientKeys
from fedlightning.server.scaffold import scaffold_server_control
from objective_helpers import SYNTHETIC, synthetic_run


def test_control_update_option_ii_on_hand_made_numbers():
    c_i, c = {"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([3.0, 1.0])}
    x, y = {"w": torch.tensor([10.0, 2.0])}, {"w": torch.tensor([4.0, 3.5])}
    c_plus, delta = scaffold_control_update(c_i, c, x, y, num_steps=3, lr=0.5)
    # (x - y) / (K lr) = [6, -1.5] / 1.5 = [4, -1];  c_i+ = c_i - c + that = [2, -2]
    assert torch.allclose(c_plus["w"], torch.tensor([2.0, -2.0]))
    assert torch.allclose(delta["w"], torch.tensor([1.0, -2.0]))
    same, zero = scaffold_control_update(c_i, c, x, y, num_steps=0, lr=0.5)
    assert torch.equal(same["w"], c_i["w"]) and not zero["w"].any()


def test_server_control_variate_moves_by_the_mean_over_all_clients():
    c = {"w": torch.tensor([1.0, 1.0]), "bn.running_mean": torch.zeros(1)}
    deltas = [{"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([4.0, -4.0])}]
    out = scaffold_server_control(c, deltas, num_clients=4)  # N = 4 clients, 2 sampled
    assert torch.allclose(out["w"], torch.tensor([2.5, 0.0]))
    assert torch.equal(out["bn.running_mean"], torch.zeros(1))


def test_scaffold_aggregator_averages_models_by_n_i_and_round_trips():
    agg = Scaffold(weighting="samples")  # the default is Algorithm 1's uniform mean
    agg.setup({"w": torch.zeros(2), "steps": torch.tensor(0)}, num_clients=4)
    assert set(agg.c) == {"w"} and not agg.c["w"].any()
    payloads = agg.configure_round(0, [1, 3])
    assert payloads[1].extras["c"] is agg.c
    uploads = [
        Upload(
            1,
            {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(5)},
            10,
            3,
            {"delta_c": {"w": torch.ones(2)}},
        ),
        Upload(
            3,
            {"w": torch.tensor([5.0, 6.0]), "steps": torch.tensor(7)},
            30,
            3,
            {"delta_c": {"w": torch.ones(2)}},
        ),
    ]
    agg.aggregate(0, uploads)
    assert torch.allclose(agg.global_state()["w"], torch.tensor([4.0, 5.0]))
    assert torch.allclose(agg.c["w"], torch.full((2,), 0.5))
    clone = Scaffold(weighting="samples")
    clone.load_state_dict(agg.state_dict())
    assert torch.equal(clone.c["w"], agg.c["w"]) and torch.equal(
        clone.global_state()["w"], agg.global_state()["w"]
    )


class _OneClient:
    """The two data-module methods a client fit reads, over hand-made tensors."""

    def __init__(self, x, y, batch_size):
        self.x, self.y, self.batch_size = x, y, batch_size

    def client_train_dataloader(self, client_id, seed):
        return TensorBatches(self.x, self.y, batch_size=self.batch_size)

    def client_num_samples(self, client_id):
        return len(self.y)


def _fit(module, payload, state, x, y, batch_size, steps):
    fitter = ClientFitter(FitConfig(local_steps=steps, accelerator="cpu"))
    return fitter.fit(module, _OneClient(x, y, batch_size), ClientJob(0, 0, payload, state))


def test_scaffold_with_client_groups_divides_each_key_by_its_owners():
    server = {"shared": torch.zeros(2), "deep": torch.zeros(1), "n": torch.tensor(0)}
    small = frozenset({"shared", "n"})
    keys = [ClientKeys("small", small)] * 3 + [ClientKeys("big", frozenset(server))]
    agg = Scaffold(weighting="uniform")
    agg.setup(server, 4, client_keys=keys)
    payloads = agg.configure_round(0, [0, 3])
    assert set(payloads[0].weights) == small and set(payloads[0].extras["c"]) == {"shared"}
    assert set(payloads[3].extras["c"]) == {"shared", "deep"}
    uploads = [
        Upload(0, {"shared": torch.tensor([2.0, 0.0]), "n": torch.tensor(1)}, 1, 1,
               {"delta_c": {"shared": torch.tensor([4.0, 8.0])}}),
        Upload(3, {"shared": torch.tensor([4.0, 2.0]), "deep": torch.tensor([6.0]), "n": torch.tensor(2)}, 1, 1,
               {"delta_c": {"shared": torch.tensor([4.0, 0.0]), "deep": torch.tensor([2.0])}}),
    ]  # fmt: skip
    agg.aggregate(0, uploads)
    # N_shared = 4 clients own "shared", N_deep = 1: c = (0 + (4 + 4) / 4, 8 / 4), 0 + 2 / 1
    assert agg.c["shared"].tolist() == [2.0, 2.0] and agg.c["deep"].tolist() == [2.0]
    assert agg.global_state()["shared"].tolist() == [3.0, 1.0]
    assert agg.global_state()["deep"].tolist() == [6.0]


def test_scaffold_homogeneous_control_variate_is_the_mean_over_n_bitwise():
    gen = torch.Generator().manual_seed(3)
    server = {"w": torch.randn(7, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    deltas = [{k: torch.randn(v.shape, generator=gen) for k, v in server.items()} for _ in range(3)]
    uploads = [Upload(i, server, 5, 1, {"delta_c": d}) for i, d in enumerate(deltas)]
    for client_keys in (None, [ClientKeys("all", frozenset(server))] * 7):
        agg = Scaffold()
        agg.setup(server, 7, client_keys=client_keys)
        agg.aggregate(0, uploads)
        expected = scaffold_server_control(
            {k: torch.zeros_like(v) for k, v in server.items()}, deltas, 7
        )
        assert all(torch.equal(agg.c[k], v) for k, v in expected.items())


def test_one_scaffold_step_is_corrected_and_renews_c_i_to_the_gradient():
    net = nn.Linear(2, 3, bias=False)
    w0 = torch.tensor([[0.5, -1.0], [0.0, 0.25], [1.0, 1.0]])
    x, y = torch.tensor([[1.0, 2.0], [-1.0, 0.5]]), torch.tensor([0, 2])
    c = {"weight": torch.tensor([[0.1, 0.0], [0.0, -0.2], [0.3, 0.0]])}
    c_i = {"weight": torch.tensor([[0.0, 0.1], [0.0, 0.0], [-0.1, 0.0]])}
    lr = 0.5
    module = ScaffoldClient(network=net, num_classes=3, lr=lr)
    result = _fit(module, Payload({"weight": w0}, extras={"c": c}), {"c_i": c_i}, x, y, 2, 1)
    w = w0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(x @ w.T, y), w)
    expected = w0 - lr * (g + c["weight"] - c_i["weight"])
    assert torch.allclose(result.upload.weights["weight"], expected, atol=1e-6)
    assert result.upload.num_steps == 1
    # K = 1: c_i+ = c_i - c + (x - y) / lr = g, the gradient at the dispatched model
    assert torch.allclose(result.state["c_i"]["weight"], g, atol=1e-6)
    assert torch.allclose(result.upload.extras["delta_c"]["weight"], g - c_i["weight"], atol=1e-6)


def test_scaffold_with_momentum_and_weight_decay_matches_a_hand_written_loop():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=gen), torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    w0 = {"weight": torch.randn(2, 3, generator=gen), "bias": torch.randn(2, generator=gen)}
    c = {k: 0.1 * torch.randn(v.shape, generator=gen) for k, v in w0.items()}
    c_i = {k: 0.1 * torch.randn(v.shape, generator=gen) for k, v in w0.items()}
    lr, rho, wd, steps = 0.2, 0.9, 0.01, 4
    module = ScaffoldClient(
        network=nn.Linear(3, 2), num_classes=2, lr=lr, momentum=rho, weight_decay=wd
    )
    result = _fit(module, Payload(w0, extras={"c": c}), {"c_i": c_i}, x, y, 4, steps)
    weights, extras, state = result.upload.weights, result.upload.extras, result.state
    # by hand: SGD with momentum and weight decay on the corrected gradient g + c - c_i
    # (Algorithm 1 line 10; the correction is a linear term of the local loss)
    w, buffer = {k: v.clone() for k, v in w0.items()}, {}
    for t in range(steps):
        xb, yb = x[4 * (t % 2) : 4 * (t % 2) + 4], y[4 * (t % 2) : 4 * (t % 2) + 4]
        params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        loss = F.cross_entropy(xb @ params["weight"].T + params["bias"], yb)
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
        for k in w:
            d = grads[k] + (c[k] - c_i[k]) + wd * w[k]
            buffer[k] = d if t == 0 else rho * buffer[k] + d
            w[k] = w[k] - lr * buffer[k]
    assert result.upload.num_steps == steps
    # option II divides by the effective number of steps a = sum_t (1 - rho^t) / (1 - rho)
    a = sum((1 - rho**t) / (1 - rho) for t in range(1, steps + 1))
    for k in w:
        assert torch.allclose(weights[k], w[k], atol=1e-6)
        c_plus = c_i[k] - c[k] + (w0[k] - w[k]) / (a * lr)
        assert torch.allclose(state["c_i"][k], c_plus, atol=1e-5)
        assert torch.allclose(extras["delta_c"][k], c_plus - c_i[k], atol=1e-5)


def test_server_c_stays_the_mean_of_all_client_control_variates(tmp_path):
    loop = synthetic_run(
        ScaffoldClient(momentum=0.5, **SYNTHETIC), Scaffold(), rounds=3, tmp_path=tmp_path
    )
    c = loop.aggregator.c
    for key, value in c.items():
        if key.endswith(("weight", "bias")):
            mean = (
                sum(
                    loop.store.get(i).get("c_i", {}).get(key, torch.zeros_like(value))
                    for i in range(4)
                )
                / 4
            )
            assert torch.allclose(value, mean, atol=1e-5)
    assert any(v.abs().sum() > 0 for v in c.values())


def test_scaffold_refuses_adam_and_16_mixed():
    with pytest.raises(ConfigurationError, match="optimizer 'sgd'.*'adam'"):
        ScaffoldClient(optimizer="adam", **SYNTHETIC)
    with pytest.raises(
        ConfigurationError, match="loop.precision='16-mixed'.*ScaffoldClient.*bf16-mixed"
    ):
        ScaffoldClient.check_precision("16-mixed")
    module = ScaffoldClient(**SYNTHETIC)
    module._trainer = SimpleNamespace(precision="16-mixed")  # what a Trainer reports in setup()
    with pytest.raises(ConfigurationError, match="16-mixed"):
        module.setup("fit")
    module._trainer = SimpleNamespace(precision="bf16-mixed")
    module.setup("fit")


def test_an_unsupported_precision_stops_the_run_before_any_training(tmp_path):
    class Only64(ScaffoldClient):  # on CPU, Lightning turns 16-mixed into bf16-mixed: simulate
        supported_precisions = frozenset({"64-true"})

    with pytest.raises(
        ConfigurationError, match="loop.precision='32-true' is not supported by Only64"
    ):
        synthetic_run(Only64(**SYNTHETIC), Scaffold(), tmp_path=tmp_path)
    assert not (tmp_path / "metrics.csv").exists()
