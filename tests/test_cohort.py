"""``loop.cohort``: all sampled clients trained at once with torch.func.vmap, equal to the
sequential fits up to float rounding, and refused where it cannot be."""

import pytest
import torch
from torch import nn

from fedlightning import FedAvg, FederatedDataModule, FederatedLoop
from fedlightning.clients import MOON, ClientModule, FedProx, ScaffoldClient
from fedlightning.errors import ConfigurationError
from objective_helpers import SYNTHETIC


class Recording(FedAvg):
    """FedAvg that keeps every round's uploads."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def aggregate(self, round_index, uploads):
        self.seen.append({u.client_id: u for u in uploads})
        super().aggregate(round_index, uploads)


def _run(model, cohort, tmp_path, **loop_kwargs):
    # label-skewed clients of unequal sizes: short clients are masked out of the later steps
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=300, num_test=60, num_classes=3, sample_shape=(6,), num_clients=5,
        partition="dirichlet", beta=0.5, min_size=5, batch_size=16,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=2, clients_per_round=4, aggregator=Recording(), run_dir=str(tmp_path / f"cohort-{cohort}"),
        progress_bar=False, plots=False, cohort=cohort, **loop_kwargs,
    )  # fmt: skip
    loop.fit(model, datamodule=dm)
    return loop


@pytest.mark.parametrize(
    ("make", "budget"),
    [
        (lambda: ClientModule(**SYNTHETIC, momentum=0.9, weight_decay=1e-3), {"local_epochs": 2}),
        (lambda: FedProx(mu=0.5, **SYNTHETIC, momentum=0.5), {"local_steps": 6}),
    ],
    ids=["sgd-momentum-wd-epochs", "fedprox-steps"],
)
def test_cohort_equals_sequential_fits(make, budget, tmp_path):
    torch.manual_seed(0)
    sequential = _run(make(), False, tmp_path, **budget)
    torch.manual_seed(0)
    cohort = _run(make(), True, tmp_path, **budget)
    for seq_round, coh_round in zip(
        sequential.aggregator.seen, cohort.aggregator.seen, strict=True
    ):
        assert seq_round.keys() == coh_round.keys()
        steps = {cid: u.num_steps for cid, u in seq_round.items()}
        assert steps == {cid: u.num_steps for cid, u in coh_round.items()}
        for cid, upload in seq_round.items():
            other = coh_round[cid]
            assert upload.num_samples == other.num_samples
            assert upload.metrics["train_loss"] == pytest.approx(
                other.metrics["train_loss"], rel=1e-5
            )
            for key, value in upload.weights.items():
                torch.testing.assert_close(other.weights[key], value, rtol=1e-5, atol=1e-6)
    if "local_epochs" in budget:
        assert len(set(steps.values())) > 1  # unequal clients really were masked
    assert sequential.history[-1]["test_acc"] == pytest.approx(
        cohort.history[-1]["test_acc"], abs=0.02
    )


class WithBatchNorm(nn.Module):
    def __init__(self, drop=0.0):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(6, 8), nn.BatchNorm1d(8) if not drop else nn.Dropout(drop)
        )
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize(
    ("make", "loop_kwargs", "message"),
    [
        (lambda: MOON(**SYNTHETIC), {}, "MOON has its own local training"),
        (lambda: ScaffoldClient(**SYNTHETIC), {}, "ScaffoldClient has its own"),
        (lambda: ClientModule(**SYNTHETIC, optimizer="adam"), {}, "optimizer 'adam'"),
        (lambda: ClientModule(**SYNTHETIC), {"precision": "bf16-mixed"}, "full precision"),
        (lambda: ClientModule(network=WithBatchNorm(), num_classes=3), {}, "BatchNorm1d"),
        (lambda: ClientModule(network=WithBatchNorm(0.5), num_classes=3), {}, "Dropout"),
    ],
)
def test_cohort_refuses_what_it_cannot_train(make, loop_kwargs, message, tmp_path):
    model = make()
    aggregator = None
    if isinstance(model, ScaffoldClient):
        from fedlightning.server import Scaffold

        aggregator = Scaffold()
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=120, num_classes=3, sample_shape=(6,), num_clients=2
    )
    loop = FederatedLoop(
        rounds=1, clients_per_round=2, aggregator=aggregator, run_dir=str(tmp_path), progress_bar=False,
        plots=False, cohort=True, **loop_kwargs,
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match=f"loop.cohort=true is not allowed.*{message}"):
        loop.fit(model, datamodule=dm)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "dask"}, "loop.backend='dask'"),
        ({"cohort": True, "backend": "ray"}, "loop.cohort=True"),
        ({"num_workers": 0}, "loop.num_workers=0"),
        ({"num_gpus_per_client": -1}, "loop.num_gpus_per_client=-1"),
    ],
)
def test_backend_options_are_validated(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        FederatedLoop(**kwargs)


def test_ray_backend_without_ray_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    from fedlightning.backends.ray import _ray

    with pytest.raises(ConfigurationError, match=r"fedlightning\[ray\]"):
        _ray()
