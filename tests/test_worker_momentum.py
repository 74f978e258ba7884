"""Worker momentum (Karimireddy, He, Jaggi, ICML 2021; docs/algorithms.md section 8.4): the
clients' momentum recursion by hand over two rounds, the momentum kept in the client's state (not
on the module), and the paper's method (worker momentum under centered clipping) resumed equal to
a straight run and on the cohort backend equal to the sequential one."""

from __future__ import annotations

import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.clients import WorkerMomentum
from fedlightning.clients.worker_momentum import worker_momentum_step
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload
from fedlightning.server import CenteredClipping
from test_registry_contract import _bitwise  # nested state compared bit for bit


def test_momentum_recursion_over_two_rounds_by_hand():
    beta = 0.5
    w1 = {"x": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    trained1 = {"x": torch.tensor([0.0, 4.0]), "n": torch.tensor(4)}  # delta = (1, -2)
    upload, m = worker_momentum_step(w1, trained1, {}, beta)
    torch.testing.assert_close(m["x"], torch.tensor([0.5, -1.0]))  # (1 - beta) delta, m_0 = 0
    torch.testing.assert_close(upload["x"], torch.tensor([0.5, 3.0]))  # w - m
    assert int(upload["n"]) == 4 and "n" not in m  # integers as trained, no momentum
    w2 = {"x": torch.tensor([0.5, 3.0]), "n": torch.tensor(4)}
    trained2 = {"x": torch.tensor([1.5, 3.0]), "n": torch.tensor(5)}  # delta = (-1, 0)
    upload, m = worker_momentum_step(w2, trained2, m, beta)
    torch.testing.assert_close(m["x"], torch.tensor([0.5 * -1 + 0.5 * 0.5, 0.5 * -1.0]))
    torch.testing.assert_close(upload["x"], w2["x"] - m["x"])
    # beta = 0 uploads the trained model itself
    plain, _ = worker_momentum_step(w2, trained2, m, 0.0)
    torch.testing.assert_close(plain["x"], trained2["x"])


def test_the_objective_keeps_the_momentum_in_the_returned_state():
    objective = WorkerMomentum(beta=0.9, network="mlp", network_kwargs={"hidden": [3]},
                               num_classes=2, in_channels=1, image_size=2)  # fmt: skip
    w = {k: torch.zeros_like(v) for k, v in objective.network.state_dict().items()}
    state: dict = {}
    expected_m = {k: torch.zeros_like(v) for k, v in w.items()}
    for step in (1.0, 3.0):  # two rounds; the "fit" moves every weight by -step
        objective.begin_client(7, Payload(w), state)
        with torch.no_grad():
            for p in objective.network.parameters():
                p.sub_(step)
        upload, _, state = objective.end_client(1)
        expected_m = {k: 0.1 * step + 0.9 * m for k, m in expected_m.items()}
        for key in w:
            torch.testing.assert_close(state["momentum"][key], expected_m[key])
            torch.testing.assert_close(upload[key], w[key] - expected_m[key])
    with pytest.raises(ConfigurationError, match="model.beta=1.0"):
        WorkerMomentum(beta=1.0)


def _data():
    return FederatedDataModule(
        dataset="synthetic", num_samples=160, num_test=40, num_classes=3, sample_shape=(1, 4, 4),
        num_clients=4, partition="iid", batch_size=16, seed=0,
    )  # fmt: skip


def _run(run_dir, rounds, backend=None, ckpt_path=None):
    torch.manual_seed(0)
    objective = WorkerMomentum(beta=0.9, network="mlp", network_kwargs={"hidden": [8]},
                               num_classes=3, in_channels=1, image_size=4, lr=0.1)  # fmt: skip
    loop = FederatedLoop(
        rounds=rounds, clients_per_round=4, local_steps=1, seed=0, run_dir=str(run_dir),
        aggregator=CenteredClipping(radius=0.05), backend=backend or SequentialBackend(),
        progress_bar=False, plots=False,
    )  # fmt: skip
    loop.fit(objective, datamodule=_data(), ckpt_path=ckpt_path)
    return loop


def test_paper_method_resumes_bitwise_and_the_cohort_agrees(tmp_path):
    straight = _run(tmp_path / "straight", 3)
    assert straight.history[-1]["clients_failed"] == 0
    states = straight.store.state_dict()["states"]
    assert len(states) == 4 and all("momentum" in s for s in states.values())
    _run(tmp_path / "resumed", 2)
    resumed = _run(tmp_path / "resumed", 3, ckpt_path=str(tmp_path / "resumed" / "last.ckpt"))
    # the model, the center and every client's momentum continue bit for bit
    assert _bitwise(resumed.aggregator.state_dict(), straight.aggregator.state_dict())
    assert _bitwise(resumed.store.state_dict(), straight.store.state_dict())
    cohort = _run(tmp_path / "cohort", 3, backend=CohortBackend())
    a, c = straight.aggregator.global_state(), cohort.aggregator.global_state()
    for key in a:
        torch.testing.assert_close(c[key], a[key], rtol=1e-5, atol=1e-6)


def test_the_torch_form_is_sgds_momentum_buffer_and_the_paper_form_over_one_minus_beta():
    """``form: torch`` keeps ``m <- beta m + delta`` (``m_1 = delta``): the buffer that
    ``torch.optim.SGD(momentum=beta)`` keeps for gradients ``delta`` (the reference code's
    ``MomentumWorker``), and for the same pseudo-gradients ``1 / (1 - beta)`` times the paper's
    ``(1 - beta)`` form: the factor by which a clipping radius carries over."""
    beta = 0.9
    deltas = [torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.0]), torch.tensor([-3.0, 1.0])]
    parameter = torch.nn.Parameter(torch.zeros(2))
    sgd = torch.optim.SGD([parameter], lr=1.0, momentum=beta)  # independent reference
    torch_m: dict = {}
    paper_m: dict = {}
    for delta in deltas:
        w = {"x": torch.tensor([2.0, 2.0]), "n": torch.tensor(1)}
        trained = {"x": w["x"] - delta, "n": torch.tensor(2)}
        upload, torch_m = worker_momentum_step(w, trained, torch_m, beta, form="torch")
        _, paper_m = worker_momentum_step(w, trained, paper_m, beta, form="paper")
        parameter.grad = delta.clone()
        sgd.step()
        torch.testing.assert_close(torch_m["x"], sgd.state[parameter]["momentum_buffer"])
        torch.testing.assert_close(upload["x"], w["x"] - torch_m["x"])
        torch.testing.assert_close(torch_m["x"], paper_m["x"] / (1 - beta))
    with pytest.raises(ConfigurationError, match="model.form='sgd'"):
        WorkerMomentum(form="sgd")  # type: ignore[arg-type]
