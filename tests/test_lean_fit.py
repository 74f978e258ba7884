"""The direct client fit (``loop.direct_fit``) gives the same bits as a Lightning Trainer fit."""

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedlightning.clients import FML, ClientModule, FedNovaClient, FedProx, ScaffoldClient
from fedlightning.errors import ConfigurationError
from fedlightning.server import FedAvg, FedNova, Scaffold
from fedlightning.training import direct_fit, direct_fit_refusal, lean_trainer, quiet_lightning
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


def _final(name, tmp_path, direct, precision="32-true"):
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
        make_model(),
        aggregator,
        tmp_path=tmp_path / f"{name}-{direct}-{precision}",
        direct_fit=direct,
        precision=precision,
        plots=False,
        **budget,
    )
    return loop.aggregator.state_dict(), steps


#: every objective in full precision and bf16-mixed (Lightning runs bf16 autocast on a CPU too);
#: 16-mixed (on a CPU Lightning's bf16-mixed) for the objectives that allow it (FedNova and
#: SCAFFOLD refuse it: a step the gradient scaler skips is still counted)
PRECISION_CASES = [(n, p) for p in ("32-true", "bf16-mixed") for n in sorted(CASES)] + [
    ("fedavg", "16-mixed"),
    ("fedprox", "16-mixed"),
]


@pytest.mark.parametrize(("name", "precision"), PRECISION_CASES)
def test_direct_fit_is_bitwise_equal_to_a_trainer_fit(name, precision, tmp_path):
    assert direct_fit_refusal(CASES[name][0](), precision) is None
    direct, direct_steps = _final(name, tmp_path, True, precision)
    trainer, trainer_steps = _final(name, tmp_path, False, precision)
    assert direct_steps == trainer_steps and len(direct_steps) == 4
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
    plain = ClientModule(**SYNTHETIC)
    for precision in ("32-true", "32", "bf16-mixed", "16-mixed"):
        assert direct_fit_refusal(plain, precision) is None, precision
    for precision in ("64-true", "bf16-true", "16-true", "transformer-engine", "16", "bf16"):
        reason = direct_fit_refusal(plain, precision)
        assert f"precision {precision!r}" in reason and "precision plugin" in reason, precision
    reason = direct_fit_refusal(plain, "bf16-mixed", torch.device("meta"))
    assert "'bf16-mixed' on a meta device" in reason
    with pytest.raises(ConfigurationError, match="precision '64-true'"):
        direct_fit(plain, [], torch.device("cpu"), "64-true")

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


def _bits(t):
    return t.detach().float().cpu().numpy().tobytes()


def _autocast(device_type):
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


class _Recorder(pl.LightningModule):
    """A small MLP that records what each hook of a fit sees: the autocast state, the loss handed
    to backward, the gradients before and after unscaling, the step counter, the batch outputs.
    ``blowup_steps`` multiply the loss by 1e8 (16-mixed gradients overflow: the scaler skips the
    step); ``none_steps`` return ``None`` from ``training_step`` (Lightning skips backward)."""

    def __init__(self, blowup_steps=(), none_steps=()):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        self.blowup_steps, self.none_steps = set(blowup_steps), set(none_steps)
        self.calls = []

    def _record(self, *call):
        device_type = next(self.parameters()).device.type
        self.calls.append((*call, self.trainer.global_step, _autocast(device_type)))

    def _grads(self):
        return tuple(_bits(p.grad) if p.grad is not None else None for p in self.parameters())

    def on_fit_start(self):
        self._record("fit_start", self.trainer.precision)

    def on_train_start(self):
        self._record("train_start")

    def on_train_epoch_start(self):
        self._record("epoch_start", self.trainer.current_epoch)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self._record("training_step", batch_idx, logits.dtype)
        if self.trainer.global_step in self.none_steps:
            return None
        loss = F.cross_entropy(logits, y)
        return loss * 1e8 if self.trainer.global_step in self.blowup_steps else loss

    def on_before_zero_grad(self, optimizer):
        self._record("before_zero_grad", type(optimizer).__name__)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self._record("zero_grad", epoch, batch_idx, type(optimizer).__name__)
        super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    def on_before_backward(self, loss):
        self._record("before_backward", _bits(loss), loss.dtype)

    def on_after_backward(self):
        self._record("after_backward", self._grads())

    def on_before_optimizer_step(self, optimizer):
        self._record("before_optimizer_step", type(optimizer).__name__, self._grads())

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        self._record("optimizer_step", epoch, batch_idx)
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self._record("stepped", _bits(next(self.parameters())))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self._record("batch_end", batch_idx, {k: _bits(v) for k, v in outputs.items()})

    def on_train_epoch_end(self):
        self._record("epoch_end")

    def on_train_end(self):
        self._record("train_end")

    def on_fit_end(self):
        scaler = self.trainer.scaler
        self._record("fit_end", None if scaler is None else scaler.state_dict())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def _fit_both(precision, accelerator, max_steps=5, **recorder_kwargs):
    """The same module fitted on the same batches by direct_fit and by a Trainer: each model and
    its step count."""
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(24, 6, generator=generator), torch.arange(24) % 3)
    batches = DataLoader(data, batch_size=8)  # 3 batches an epoch
    direct_model = _Recorder(**recorder_kwargs)
    device = torch.device("cuda", torch.cuda.current_device()) if accelerator == "cuda" else None
    direct_steps = direct_fit(
        direct_model, batches, device or torch.device(accelerator), precision, -1, max_steps
    )
    trainer_model = _Recorder(**recorder_kwargs)
    with quiet_lightning():
        trainer = lean_trainer(
            accelerator, precision, max_epochs=-1, max_steps=max_steps, limit_val_batches=0
        )
        trainer.fit(trainer_model, train_dataloaders=batches)
    return (direct_model, direct_steps), (trainer_model, trainer.global_step)


def _assert_same_fit(direct, trainer, steps=5):
    (direct_model, direct_steps), (trainer_model, trainer_steps) = direct, trainer
    assert direct_steps == trainer_steps == steps
    assert len(direct_model.calls) == len(trainer_model.calls)
    for a, b in zip(direct_model.calls, trainer_model.calls, strict=True):
        assert a == b, (a[0], b[0])
    a, b = direct_model.state_dict(), trainer_model.state_dict()
    assert a.keys() == b.keys()
    for key in a:  # a Trainer's teardown moves the module to the CPU, direct_fit leaves it
        assert torch.equal(a[key].cpu(), b[key].cpu()), key


def test_bf16_mixed_direct_fit_autocasts_what_a_trainer_fit_autocasts():
    direct, trainer = _fit_both("bf16-mixed", "cpu", none_steps={3})
    _assert_same_fit(direct, trainer)
    calls = direct[0].calls
    assert calls[0][:2] == ("fit_start", "bf16-mixed")
    # training_step alone runs under torch.autocast("cpu", bfloat16): not backward, not the step
    for call in calls:
        if call[0] == "training_step":
            assert call[2] == torch.bfloat16 and call[-1] == torch.bfloat16
        else:
            assert call[-1] is None, call[0]
    # a training_step returning None: no backward, no batch output, and still a counted step
    assert [c[0] for c in calls].count("before_backward") == 4
    assert [c[2] for c in calls if c[0] == "batch_end"][3] == {}


def test_16_mixed_on_cpu_is_lightnings_bf16_mixed():
    with pytest.warns(UserWarning, match="AMP with fp16 is not supported on CPU"):
        direct, trainer = _fit_both("16-mixed", "cpu", blowup_steps={1})
    _assert_same_fit(direct, trainer)
    bf16, _ = _fit_both("bf16-mixed", "cpu", blowup_steps={1})
    assert direct[0].calls == bf16[0].calls  # precision "bf16-mixed", no scaler
    assert direct[0].calls[-1][1] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed needs CUDA (CPU: bf16-mixed)")
@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_16_mixed_direct_fit_matches_a_cuda_trainer_fit(precision):
    direct, trainer = _fit_both(precision, "cuda", blowup_steps={1}, none_steps={3})
    _assert_same_fit(direct, trainer)
    calls = direct[0].calls
    dtype = torch.half if precision == "16-mixed" else torch.bfloat16
    assert all(c[-1] == (dtype if c[0] == "training_step" else None) for c in calls)
    scaler = calls[-1][1]
    weights = [c[1] for c in calls if c[0] == "stepped"]
    assert weights[3] == weights[2]  # training_step returned None: no step
    if precision == "16-mixed":
        # the overflowing step was skipped by the scaler (scale halved, weights unchanged) and
        # still counted; two good steps since (the None step does not update the scaler)
        assert weights[1] == weights[0]
        assert scaler["scale"] == 2.0**15 and scaler["_growth_tracker"] == 2
        grads = [c[2] for c in calls if c[0] == "before_optimizer_step"]
        scaled = [c[1] for c in calls if c[0] == "after_backward"]
        assert grads[0] != scaled[0]  # on_before_optimizer_step sees unscaled gradients
    else:
        assert scaler is None


def test_the_step_counter_moves_after_the_optimizer_step_hook():
    direct, trainer = _fit_both("32-true", "cpu", max_steps=4, none_steps={2})
    _assert_same_fit(direct, trainer, steps=4)
    steps = [(c[0], c[-2]) for c in direct[0].calls if c[0] in ("optimizer_step", "stepped")]
    assert steps == [(name, i) for i in range(4) for name in ("optimizer_step", "stepped")]
