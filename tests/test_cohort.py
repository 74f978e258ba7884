"""``CohortBackend``: all sampled clients trained at once by vmapping the objective's own
``local_loss``, equal to the sequential fits up to float rounding, and refused where it cannot be."""

import pytest
import torch
from torch import nn

from fedlightning import FedAvg, FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend, RayBackend
from fedlightning.clients import MOON, ClientModule, FedNovaClient, FedProx, ScaffoldClient
from fedlightning.errors import ConfigurationError
from fedlightning.server import FedNova
from objective_helpers import SYNTHETIC


class Recorder:
    """Put in front of an aggregator: keeps every round's uploads."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def aggregate(self, round_index, uploads):
        self.seen.append({u.client_id: u for u in uploads})
        super().aggregate(round_index, uploads)


class Recording(Recorder, FedAvg):
    pass


class RecordingNova(Recorder, FedNova):
    pass


class UserLoss(ClientModule):
    """A user objective that only overrides local_loss: CE plus an L1 pull on the head weights."""

    def local_loss(self, batch):
        return super().local_loss(batch) + 0.01 * self.network.head.weight.abs().sum()


def _run(model, cohort, tmp_path, aggregator=None, **loop_kwargs):
    # label-skewed clients of unequal sizes: short clients are masked out of the later steps
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=300, num_test=60, num_classes=3, sample_shape=(6,), num_clients=5,
        partition="dirichlet", beta=0.5, min_size=5, batch_size=16,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=2, clients_per_round=4, aggregator=aggregator or Recording(),
        run_dir=str(tmp_path / f"cohort-{cohort}"), progress_bar=False, plots=False,
        backend=CohortBackend() if cohort else None, **loop_kwargs,
    )  # fmt: skip
    loop.fit(model, datamodule=dm)
    return loop


@pytest.mark.parametrize(
    ("make", "budget"),
    [
        (lambda: ClientModule(**SYNTHETIC, momentum=0.9, weight_decay=1e-3), {"local_epochs": 2}),
        (lambda: FedProx(mu=0.5, **SYNTHETIC, momentum=0.5), {"local_steps": 6}),
        (lambda: UserLoss(**SYNTHETIC), {"local_epochs": 2}),
        (lambda: FedNovaClient(**SYNTHETIC, momentum=0.5), {"local_epochs": 2}),
    ],
    ids=["sgd-momentum-wd-epochs", "fedprox-steps", "user-objective", "fednova"],
)
def test_cohort_equals_sequential_fits(make, budget, tmp_path):
    def aggregator():
        return RecordingNova() if isinstance(make(), FedNovaClient) else Recording()

    torch.manual_seed(0)
    sequential = _run(make(), False, tmp_path, aggregator(), **budget)
    torch.manual_seed(0)
    cohort = _run(make(), True, tmp_path, aggregator(), **budget)
    for seq_round, coh_round in zip(
        sequential.aggregator.seen, cohort.aggregator.seen, strict=True
    ):
        assert seq_round.keys() == coh_round.keys()
        steps = {cid: u.num_steps for cid, u in seq_round.items()}
        assert steps == {cid: u.num_steps for cid, u in coh_round.items()}
        for cid, upload in seq_round.items():
            other = coh_round[cid]
            assert upload.num_samples == other.num_samples
            assert upload.extras.keys() == other.extras.keys()
            for key in upload.extras:  # FedNova's a_i from the step count
                assert upload.extras[key] == other.extras[key]
            assert upload.metrics["train_loss"] == pytest.approx(
                other.metrics["train_loss"], rel=1e-5
            )
            for key, value in upload.weights.items():
                torch.testing.assert_close(other.weights[key], value, rtol=1e-5, atol=1e-6)
    if "local_epochs" in budget:
        assert len(set(steps.values())) > 1  # unequal clients really stopped early
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
        (lambda: MOON(**SYNTHETIC), {}, "MOON's local loss depends on each client's own state"),
        (lambda: ScaffoldClient(**SYNTHETIC), {}, "ScaffoldClient's local loss depends"),
        (lambda: ClientModule(**SYNTHETIC, optimizer="adam"), {}, "SGD only, got Adam"),
        (lambda: ClientModule(**SYNTHETIC), {"precision": "bf16-mixed"}, "full precision"),
        (lambda: ClientModule(**SYNTHETIC), {"gradient_clip_val": 1.0}, "gradient_clip_val"),
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
        plots=False, backend=CohortBackend(), **loop_kwargs,
    )  # fmt: skip
    with pytest.raises(
        ConfigurationError, match=f"loop.backend=CohortBackend cannot train.*{message}"
    ):
        loop.fit(model, datamodule=dm)
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FederatedLoop(backend="dask"), "loop.backend='dask'"),
        (lambda: RayBackend(num_workers=0), "num_workers=0"),
        (lambda: RayBackend(num_gpus_per_client=-1), "num_gpus_per_client=-1"),
        (lambda: RayBackend(num_cpus_per_client=0), "num_cpus_per_client=0"),
    ],
)
def test_backend_options_are_validated(make, message):
    with pytest.raises(ConfigurationError, match=message):
        make()


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
