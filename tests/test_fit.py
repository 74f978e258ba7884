"""Client fits on Lightning Fabric give the same bits as Lightning Trainer fits, for every
objective, precision, ``configure_optimizers`` form, LR scheduler and gradient clipping; objectives
that need the Trainer get one automatically."""

import pytest
import torch
from torch import nn

from fedlightning.clients import FML, MOON, ClientModule, FedNovaClient, FedProx, ScaffoldClient
from fedlightning.errors import ConfigurationError
from fedlightning.fit import split_optimizers, trainer_reason
from fedlightning.server import FedAvg, FedNova, Scaffold
from objective_helpers import SYNTHETIC, synthetic_run


class StepScheduled(ClientModule):
    """SGD with a StepLR stepped every 2 optimizer steps, in Lightning's dict form."""

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 2},
        }


class EpochScheduled(ClientModule):
    """Adam with an epoch-interval ExponentialLR, in Lightning's two-lists form."""

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.05)
        return [optimizer], [torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.3)]


#: objective, aggregator and local budget (epochs or steps, crossing epoch boundaries)
CASES = {
    "fedavg": (lambda: ClientModule(**SYNTHETIC, momentum=0.9, weight_decay=1e-3), FedAvg, {"local_epochs": 2}),
    "fedprox": (lambda: FedProx(mu=0.1, **SYNTHETIC), FedAvg, {"local_steps": 7}),
    "scaffold": (lambda: ScaffoldClient(**SYNTHETIC, momentum=0.5), Scaffold, {"local_steps": 7}),
    "fednova": (lambda: FedNovaClient(**SYNTHETIC, momentum=0.5), FedNova, {"local_epochs": 2}),
    "moon": (lambda: MOON(**SYNTHETIC), FedAvg, {"local_epochs": 2}),
    "fml": (lambda: FML(momentum=0.9, **SYNTHETIC), lambda: FedAvg("uniform"), {"local_steps": 5}),
    "step_scheduler": (lambda: StepScheduled(**SYNTHETIC), FedAvg, {"local_epochs": 2}),
    "epoch_scheduler": (lambda: EpochScheduled(**SYNTHETIC), FedAvg, {"local_epochs": 3}),
}  # fmt: skip


def _final(name, tmp_path, fit_with, precision="32-true", **loop_kwargs):
    """The aggregator's state after a run, and every upload's step count."""
    make_model, make_agg, budget = CASES[name]
    torch.manual_seed(0)
    aggregator, steps = make_agg(), []
    aggregate = aggregator.aggregate

    def recording(round_index, uploads):
        steps.extend(u.num_steps for u in uploads)
        return aggregate(round_index, uploads)

    aggregator.aggregate = recording
    loop = synthetic_run(
        make_model(), aggregator, tmp_path=tmp_path / f"{name}-{fit_with}-{precision}",
        fit_with=fit_with, precision=precision, plots=False, **budget, **loop_kwargs,
    )  # fmt: skip
    return loop.aggregator.state_dict(), steps


def _assert_bitwise(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_bitwise(a[key], b[key])
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


#: every objective in full precision and bf16-mixed (Lightning runs bf16 autocast on a CPU too);
#: 16-mixed (on a CPU, Lightning's bf16-mixed) for the objectives that allow it
PRECISION_CASES = (
    [(n, "32-true") for n in sorted(CASES)]
    + [(n, "bf16-mixed") for n in ("fedavg", "fedprox", "scaffold", "fml")]
    + [("fedavg", "16-mixed")]
)


@pytest.mark.parametrize(("name", "precision"), PRECISION_CASES)
def test_fabric_fit_is_bitwise_equal_to_a_trainer_fit(name, precision, tmp_path):
    assert trainer_reason(CASES[name][0](), precision) is None
    fabric_state, fabric_steps = _final(name, tmp_path, "auto", precision)
    trainer_state, trainer_steps = _final(name, tmp_path, "trainer", precision)
    assert fabric_steps == trainer_steps and fabric_steps
    _assert_bitwise(fabric_state, trainer_state)


@pytest.mark.parametrize(("algorithm", "value"), [("norm", 0.05), ("value", 0.01)])
def test_gradient_clipping_matches_the_trainers(algorithm, value, tmp_path):
    kwargs = dict(gradient_clip_val=value, gradient_clip_algorithm=algorithm)
    clipped, _ = _final("fedavg", tmp_path / "clip", "auto", **kwargs)
    _assert_bitwise(clipped, _final("fedavg", tmp_path / "clip", "trainer", **kwargs)[0])
    unclipped, _ = _final("fedavg", tmp_path / "plain", "auto")
    assert not torch.equal(clipped["weights"]["head.weight"], unclipped["weights"]["head.weight"])


def test_a_scheduler_changes_the_learning_rate_within_a_fit(tmp_path):
    scheduled, _ = _final("step_scheduler", tmp_path, "auto")
    plain, _ = _final("fedavg", tmp_path, "auto")
    assert not torch.equal(scheduled["weights"]["head.weight"], plain["weights"]["head.weight"])


def test_the_trainer_is_chosen_where_it_is_needed():
    class Manual(ClientModule):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.automatic_optimization = False

    class OwnStep(ClientModule):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx)

    class Hooked(ClientModule):
        def on_before_optimizer_step(self, optimizer):
            pass

    assert trainer_reason(ClientModule(**SYNTHETIC), "32-true") is None
    assert trainer_reason(FML(**SYNTHETIC), "16-mixed") is None
    assert "manual optimization" in trainer_reason(Manual(**SYNTHETIC), "32-true")
    assert "OwnStep overrides training_step" in trainer_reason(OwnStep(**SYNTHETIC), "32-true")
    assert "on_before_optimizer_step" in trainer_reason(Hooked(**SYNTHETIC), "32-true")
    assert "'64-true'" in trainer_reason(ClientModule(**SYNTHETIC), "64-true")


def test_a_module_that_needs_the_trainer_trains_with_one(tmp_path):
    class OwnStep(ClientModule):
        def training_step(self, batch, batch_idx):
            self.log("seen", 1.0)  # a Trainer feature
            return super().training_step(batch, batch_idx)

    loop = synthetic_run(OwnStep(**SYNTHETIC), FedAvg(), tmp_path=tmp_path, rounds=3, plots=False)
    assert loop.history[-1]["clients_failed"] == 0 and loop.history[-1]["test_acc"] > 0.6


def test_64_true_fits_with_a_trainer_and_evaluates(tmp_path):
    loop = synthetic_run(
        ClientModule(**SYNTHETIC), FedAvg(), tmp_path=tmp_path, precision="64-true", plots=False
    )
    assert loop.aggregator.global_state()["head.weight"].dtype == torch.float64
    assert 0.0 <= loop.history[-1]["test_acc"] <= 1.0


def _sgd():
    return torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)


def test_every_documented_configure_optimizers_form_is_read():
    opt = _sgd()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert split_optimizers(opt) == (opt, [])
    assert split_optimizers([opt])[0] is opt and split_optimizers((opt,))[1] == []
    assert split_optimizers({"optimizer": opt})[0] is opt
    _, configs = split_optimizers({"optimizer": opt, "lr_scheduler": sched})
    assert configs[0].scheduler is sched and configs[0].interval == "epoch"
    _, configs = split_optimizers(
        {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 3}}
    )
    assert (configs[0].interval, configs[0].frequency) == ("step", 3)
    _, configs = split_optimizers(([opt], [{"scheduler": sched, "monitor": "train_loss"}]))
    assert configs[0].monitor == "train_loss"


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (None, "returned NoneType"),
        ("sgd", "returned str"),
        ([_sgd(), _sgd()], "exactly one torch optimizer.*SGD', 'SGD'"),
        ({"lr_scheduler": None}, "exactly one torch optimizer"),
        ({"optimizer": (o := _sgd()), "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "interval": "batch"}}, "interval='batch'"),
        ({"optimizer": (o := _sgd()), "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "monitor": "val_acc"}}, "monitor='val_acc'"),
    ],
)  # fmt: skip
def test_bad_configure_optimizers_output_is_a_clear_error(returned, message):
    with pytest.raises(ConfigurationError, match=message):
        split_optimizers(returned)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="16-mixed with a gradient scaler needs CUDA"
)
def test_16_mixed_fabric_fit_matches_a_cuda_trainer_fit(tmp_path):
    fabric_state, fabric_steps = _final("fedprox", tmp_path, "auto", "16-mixed", accelerator="cuda")
    trainer_state, trainer_steps = _final(
        "fedprox", tmp_path, "trainer", "16-mixed", accelerator="cuda"
    )
    assert fabric_steps == trainer_steps
    _assert_bitwise(fabric_state, trainer_state)


class PlateauScheduled(ClientModule):
    """SGD with momentum and a ReduceLROnPlateau on the epoch's mean train_loss."""

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss"}}  # fmt: skip


BN_NET = dict(network="resnet14", network_kwargs={"width": 4, "stem": "small"}, num_classes=3,
              in_channels=3, image_size=8, lr=0.05, momentum=0.9)  # fmt: skip

#: (objective, fit options): every scheduler form, both clipping algorithms, bf16 autocast, a
#: BatchNorm ResNet with momentum
LEAN_CASES = {
    "step_scheduler": (lambda: StepScheduled(**SYNTHETIC, momentum=0.5), dict(local_epochs=2)),
    "epoch_scheduler_adam": (lambda: EpochScheduled(**SYNTHETIC), dict(local_epochs=3)),
    "plateau": (lambda: PlateauScheduled(**SYNTHETIC, momentum=0.5), dict(local_steps=9)),
    "clip_norm": (lambda: ClientModule(**SYNTHETIC, momentum=0.9), dict(local_epochs=2, gradient_clip_val=0.05)),
    "clip_value_bf16": (lambda: FedProx(mu=0.1, **SYNTHETIC), dict(local_steps=7, gradient_clip_val=0.01, gradient_clip_algorithm="value", precision="bf16-mixed")),
    "bn_resnet_bf16": (lambda: ClientModule(**BN_NET), dict(local_epochs=2, precision="bf16-mixed")),
    "bn_resnet": (lambda: ClientModule(**BN_NET, weight_decay=1e-3), dict(local_steps=5)),
}  # fmt: skip


def _chained_fits(name, lean):
    """Three rounds of two clients, each round starting from the previous round's last upload:
    every upload's weights, step count and train_loss."""
    from fedlightning import FederatedDataModule
    from fedlightning.fit import ClientFitter
    from fedlightning.protocol import ClientJob, FitConfig, Payload

    make_model, options = LEAN_CASES[name]
    shape = (3, 8, 8) if "resnet" in name else (6,)
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=240, num_test=30, num_classes=3, sample_shape=shape,
        num_clients=4, partition="iid", batch_size=16,
    )  # fmt: skip
    dm.setup()
    torch.manual_seed(0)
    model = make_model()
    fitter = ClientFitter(FitConfig(accelerator="cpu", **options), lean=lean)
    assert fitter.path(model) == ("lean" if lean else "fabric")
    weights = {k: v.clone() for k, v in model.network.state_dict().items()}
    uploads = []
    for round_index in range(3):
        for client in (round_index, round_index + 1):
            job = ClientJob(round_index, client, Payload(weights=weights), {})
            upload = fitter.fit(model, dm, job).upload
            uploads.append((upload.weights, upload.num_steps, upload.metrics["train_loss"]))
        weights = upload.weights
    return uploads


@pytest.mark.parametrize("name", sorted(LEAN_CASES))
def test_the_lean_fit_is_bitwise_the_fabric_fit(name):
    lean, fabric = _chained_fits(name, lean=True), _chained_fits(name, lean=False)
    assert len(lean) == len(fabric) == 6
    for (lean_weights, lean_steps, lean_loss), (fab_weights, fab_steps, fab_loss) in zip(
        lean, fabric, strict=True
    ):
        assert lean_steps == fab_steps > 0 and lean_loss == fab_loss
        _assert_bitwise(lean_weights, fab_weights)
    first, last = lean[0][0], lean[-1][0]
    assert any(not torch.equal(first[k], last[k]) for k in first)  # the fits trained


def test_16_mixed_keeps_fabric_and_a_trainer_keeps_the_trainer():
    from fedlightning.fit import ClientFitter
    from fedlightning.protocol import FitConfig

    fitter = ClientFitter(FitConfig(accelerator="cpu"))
    assert fitter.path(ClientModule(**SYNTHETIC)) == "lean"
    assert fitter.path(FML(**SYNTHETIC)) == "lean"
    trainer = ClientFitter(FitConfig(accelerator="cpu", fit_with="trainer"))
    assert trainer.path(ClientModule(**SYNTHETIC)) == "trainer"
    # on a CPU, 16-mixed runs as bf16-mixed (no scaler): lean; on a GPU its scaler needs Fabric
    assert (
        ClientFitter(FitConfig(accelerator="cpu", precision="16-mixed")).path(
            ClientModule(**SYNTHETIC)
        )
        == "lean"
    )
    if torch.cuda.is_available():
        scaled = ClientFitter(FitConfig(accelerator="cuda", precision="16-mixed"))
        assert scaled.path(ClientModule(**SYNTHETIC)) == "fabric"
