"""The direct client fit (``loop.direct_fit``) gives the same bits as a Lightning Trainer fit."""

import pytest
import torch

from fedlightning.clients import FML, ClientModule, FedNovaClient, FedProx, ScaffoldClient
from fedlightning.errors import ConfigurationError
from fedlightning.server import FedAvg, FedNova, Scaffold
from fedlightning.training import direct_fit_refusal
from objective_helpers import SYNTHETIC, synthetic_run

#: objective, aggregator and local budget (epochs or steps, crossing epoch boundaries)
CASES = {
    "fedavg": (
        lambda: ClientModule(**SYNTHETIC, momentum=0.9, weight_decay=1e-3),
        FedAvg,
        {"local_epochs": 2},
    ),
    "fedprox": (lambda: FedProx(mu=0.1, **SYNTHETIC), FedAvg, {"local_steps": 7}),
    "scaffold": (lambda: ScaffoldClient(**SYNTHETIC), Scaffold, {"local_steps": 7}),
    "fednova": (lambda: FedNovaClient(**SYNTHETIC, momentum=0.5), FedNova, {"local_epochs": 2}),
}


def _final(name, tmp_path, direct):
    make_model, make_agg, budget = CASES[name]
    torch.manual_seed(0)
    loop = synthetic_run(
        make_model(),
        make_agg(),
        tmp_path=tmp_path / f"{name}-{direct}",
        direct_fit=direct,
        plots=False,
        **budget,
    )
    return loop.aggregator.state_dict()


@pytest.mark.parametrize("name", sorted(CASES))
def test_direct_fit_is_bitwise_equal_to_a_trainer_fit(name, tmp_path):
    assert direct_fit_refusal(CASES[name][0](), "32-true") is None
    direct = _final(name, tmp_path, True)
    trainer = _final(name, tmp_path, False)
    flat = lambda d: {k: v for k, v in _flatten(d)}  # noqa: E731
    a, b = flat(direct), flat(trainer)
    assert a.keys() == b.keys()
    for key in a:
        assert (
            torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key]
        ), key


def test_upload_steps_are_the_real_optimizer_steps(tmp_path):
    steps = []

    class Recording(FedAvg):
        def aggregate(self, round_index, uploads):
            steps.extend(u.num_steps for u in uploads)
            super().aggregate(round_index, uploads)

    synthetic_run(
        ClientModule(**SYNTHETIC), Recording(), tmp_path=tmp_path, local_steps=5, plots=False
    )
    assert steps == [5, 5, 5, 5]
    steps.clear()
    # 60 samples per client, batch 32: 2 batches per epoch
    synthetic_run(
        ClientModule(**SYNTHETIC), Recording(), tmp_path=tmp_path / "e", local_epochs=3, plots=False
    )
    assert steps == [6, 6, 6, 6]


def test_modules_needing_the_trainer_are_fitted_by_one():
    assert "manual optimization" in direct_fit_refusal(FML(**SYNTHETIC), "32-true")
    assert "precision" in direct_fit_refusal(ClientModule(**SYNTHETIC), "bf16-mixed")

    class Clipped(ClientModule):
        def configure_gradient_clipping(
            self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
        ):
            pass

    assert "configure_gradient_clipping" in direct_fit_refusal(Clipped(**SYNTHETIC), "32-true")


def _flatten(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}/{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}/{i}")
    else:
        yield prefix, value


def test_reading_what_a_direct_fit_lacks_names_the_option(tmp_path):
    class ReadsTrainer(ClientModule):
        def on_train_start(self):
            _ = self.trainer.estimated_stepping_batches

    with pytest.raises(ConfigurationError, match="loop.direct_fit=false"):
        synthetic_run(ReadsTrainer(**SYNTHETIC), tmp_path=tmp_path, rounds=1, plots=False)
    synthetic_run(
        ReadsTrainer(**SYNTHETIC), tmp_path=tmp_path / "t", rounds=1, plots=False, direct_fit=False
    )
