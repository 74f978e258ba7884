"""``CohortBackend``: all sampled clients trained at once by vmapping the objective's own
``local_loss``, equal to the sequential fits up to float rounding, and refused where it cannot be."""

import pytest
import torch
from torch import nn

from fedlightning import FedAvg, FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend, RayBackend, SequentialBackend
from fedlightning.clients import FML, MOON, ClientModule, FedNovaClient, FedProx, ScaffoldClient
from fedlightning.errors import ConfigurationError
from fedlightning.server import FedCross, FedNova, Scaffold
from objective_helpers import SYNTHETIC
from user_clients import UserFedDynClient


class Recorder:
    """Put in front of an aggregator: keeps every round's uploads."""

    transient_attributes = frozenset({"seen"})  # the test's record, read by no later round

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def aggregate(self, round_index, uploads):
        self.seen.append({u.client_id: u for u in uploads})
        super().aggregate(round_index, uploads)


def recording(cls, **kwargs):
    return type(f"Recording{cls.__name__}", (Recorder, cls), {})(**kwargs)


class UserLoss(ClientModule):
    """A user objective that only overrides local_loss: CE plus an L1 pull on the head weights."""

    def local_loss(self, batch):
        return super().local_loss(batch) + 0.01 * self.network.head.weight.abs().sum()


class Nesterov(ClientModule):
    def configure_optimizers(self):
        return torch.optim.SGD(
            self.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3
        )


class AdamW(ClientModule):
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.05)


class WithBatchNorm(nn.Module):
    def __init__(self, drop=0.0):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(6, 8), nn.BatchNorm1d(8) if not drop else nn.Dropout(drop)
        )
        self.head = nn.Linear(8, 3)
        self.feature_dim = 8

    def forward_features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.head(self.body(x))


def _run(
    model,
    cohort,
    tmp_path,
    aggregator=None,
    sample_shape=(6,),
    partition="dirichlet",
    rounds=2,
    **loop_kwargs,
):
    # label-skewed clients of unequal sizes: short clients are masked out of the later steps
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=300, num_test=60, num_classes=3, sample_shape=sample_shape,
        num_clients=5, partition=partition, beta=0.5, min_size=5, batch_size=16,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=rounds, clients_per_round=4, aggregator=aggregator or recording(FedAvg),
        run_dir=str(tmp_path / f"cohort-{cohort}"), progress_bar=False, plots=False,
        **{"backend": CohortBackend() if cohort else SequentialBackend(), **loop_kwargs},
    )  # fmt: skip
    loop.fit(model, datamodule=dm)
    return loop


CASES = {
    "sgd-momentum-wd-epochs": (lambda: ClientModule(**SYNTHETIC, momentum=0.9, weight_decay=1e-3), FedAvg, {"local_epochs": 2}),
    "fedprox-steps": (lambda: FedProx(mu=0.5, **SYNTHETIC, momentum=0.5), FedAvg, {"local_steps": 6}),
    "user-objective": (lambda: UserLoss(**SYNTHETIC), FedAvg, {"local_epochs": 2}),
    "fednova": (lambda: FedNovaClient(**SYNTHETIC, momentum=0.5), FedNova, {"local_epochs": 2}),
    "scaffold": (lambda: ScaffoldClient(**SYNTHETIC, momentum=0.5), Scaffold, {"local_epochs": 2}),
    "moon": (lambda: MOON(**SYNTHETIC, projection_dim=8), FedAvg, {"local_epochs": 2}),
    "fml-adam": (lambda: FML(**SYNTHETIC, optimizer="adam"), FedAvg, {"local_epochs": 2}),
    "fml-momentum": (lambda: FML(**SYNTHETIC, momentum=0.9), FedAvg, {"local_epochs": 2}),
    "fml-adaptor": (lambda: FML(**SYNTHETIC, momentum=0.5, adaptor_features=4), FedAvg, {"local_epochs": 2}),
    "fedcross": (lambda: ClientModule(**SYNTHETIC), FedCross, {"local_epochs": 1}),
    "adam-wd": (lambda: ClientModule(**SYNTHETIC, optimizer="adam", weight_decay=1e-2), FedAvg, {"local_epochs": 2}),
    "adamw": (lambda: AdamW(**SYNTHETIC), FedAvg, {"local_epochs": 2}),
    "nesterov": (lambda: Nesterov(**SYNTHETIC), FedAvg, {"local_epochs": 2}),
    "clip-norm": (lambda: ClientModule(**SYNTHETIC, momentum=0.5), FedAvg, {"gradient_clip_val": 0.05}),
    "clip-value": (lambda: ClientModule(**SYNTHETIC), FedAvg, {"gradient_clip_val": 0.01, "gradient_clip_algorithm": "value"}),
    "batchnorm": (lambda: ClientModule(network=WithBatchNorm(), num_classes=3, lr=0.1, momentum=0.5), FedAvg, {"local_epochs": 2}),
    "moon-batchnorm": (lambda: MOON(network=WithBatchNorm(), num_classes=3, projection_dim=4), FedAvg, {"local_epochs": 2}),
    "feddyn-plugin-3-rounds": (lambda: UserFedDynClient(mu=0.1, **SYNTHETIC, momentum=0.5), FedAvg, {"local_epochs": 2, "rounds": 3}),
    "heterogeneous": (lambda: ClientModule(networks=["resnet10", "resnet14"], network_kwargs={"width": 4, "stem": "small"}, num_classes=3, in_channels=1, image_size=8, lr=0.05), FedAvg, {"sample_shape": (1, 8, 8), "partition": "iid", "rounds": 1}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_cohort_equals_sequential_fits(case, tmp_path):
    make, aggregator, budget = CASES[case]
    kwargs = {"weighting": "uniform"} if aggregator is FedAvg and case.startswith("fml") else {}
    runs = []
    for cohort in (False, True):
        torch.manual_seed(0)
        runs.append(_run(make(), cohort, tmp_path, recording(aggregator, **kwargs), **budget))
    sequential, cohort = runs
    # Adam divides by sqrt(v): reassociation differences in small gradients are amplified
    # (the steps themselves are exact: test_stacked_optimizers_step_like_torch_per_client), so a
    # coordinate whose gradient is near zero (rounding-sized) takes a step of about lr whose sign
    # the rounding decides: such coordinates end up to lr times the steps apart, which bounds every
    # coordinate, while the mean difference over a tensor stays within a hundredth of lr (FML's
    # two Adam-trained networks, mutually distilled over two rounds, reach 4e-4).
    # The tiny ResNets (BatchNorm over 1x1 maps) are chaotic: a 1e-6 change of the initial weights
    # moves a sequential round-2 upload by 0.2, so they are compared after one round.
    # Elsewhere the mean difference is about one float32 ulp of the weights (at most 2.5e-7, two
    # ulps at 1: the CPU's kernel family decides whether it is one or two).
    if "adam" in case and case[:4] != "hete":
        steps = max(u.num_steps for r in sequential.aggregator.seen for u in r.values())
        rtol, atol, mean, loss_rtol = 0.0, SYNTHETIC["lr"] * steps, SYNTHETIC["lr"] / 100, 1e-3
    else:
        rtol, atol, mean = (1e-4, 2e-5, 5e-6) if case[:4] == "hete" else (1e-5, 1e-6, 2.5e-7)
        loss_rtol = 10 * rtol
    _assert_same_uploads(
        sequential.aggregator.seen, cohort.aggregator.seen, rtol, atol, mean, loss_rtol
    )
    if "local_epochs" in budget and len(sequential.aggregator.seen[0]) > 1:
        steps = [u.num_steps for u in sequential.aggregator.seen[-1].values()]
        assert len(set(steps)) > 1  # unequal clients really stopped early
    assert sequential.history[-1]["test_acc"] == pytest.approx(
        cohort.history[-1]["test_acc"], abs=0.02
    )


def _assert_same_uploads(sequential, cohort, rtol, atol, mean=2.5e-7, loss_rtol=None):
    """The cohort's uploads equal the sequential ones: weights and extras within ``rtol`` and
    ``atol``, each weight tensor's mean absolute difference at most ``mean``, the logged losses
    within ``loss_rtol`` (default ``10 * rtol``)."""
    loss_rtol = 10 * rtol if loss_rtol is None else loss_rtol
    assert len(sequential) == len(cohort)
    for seq_round, coh_round in zip(sequential, cohort, strict=True):
        assert seq_round.keys() == coh_round.keys()
        for cid, upload in seq_round.items():
            other = coh_round[cid]
            assert (upload.num_steps, upload.num_samples) == (other.num_steps, other.num_samples)
            assert upload.model_index == other.model_index
            assert upload.extras.keys() == other.extras.keys()
            for key, value in upload.extras.items():  # FedNova's a_i, SCAFFOLD's delta_c
                if isinstance(value, dict):
                    for name, tensor in value.items():
                        torch.testing.assert_close(
                            other.extras[key][name], tensor, rtol=rtol, atol=atol
                        )
                else:
                    assert other.extras[key] == value
            assert upload.metrics.keys() == other.metrics.keys()
            for name, value in upload.metrics.items():  # FML's personal_train_loss too
                assert other.metrics[name] == pytest.approx(value, rel=loss_rtol)
            for key, value in upload.weights.items():
                torch.testing.assert_close(other.weights[key], value, rtol=rtol, atol=atol)
                assert (other.weights[key].double() - value.double()).abs().mean() <= mean, (
                    key,
                    value.numel(),
                )


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (torch.optim.Adam, dict(lr=0.1, weight_decay=1e-2)),
        (torch.optim.AdamW, dict(lr=0.1, weight_decay=0.05, betas=(0.8, 0.9))),
        (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
        (torch.optim.SGD, dict(lr=0.1, momentum=0.5)),
    ],
)
def test_stacked_optimizers_step_like_torch_per_client(cls, kwargs):
    """Each client's slice takes exactly torch's step, in place when every client steps; a masked
    client keeps its parameters and state."""
    from fedlightning.backends.cohort.optim import StackedOptimizer

    torch.manual_seed(0)
    ps = [torch.randn(5, requires_grad=True) for _ in range(3)]
    optimizers = [cls([p], **kwargs) for p in ps]
    params = {"w": torch.stack([p.detach().clone() for p in ps])}
    stacked = StackedOptimizer.stack(optimizers, [{id(p): "w"} for p in ps], params)
    for t in range(5):
        grads = torch.randn(3, 5) * 10.0**-t
        active = torch.tensor([True, t < 3, True])  # client 1 runs out of steps
        for i, (p, optimizer) in enumerate(zip(ps, optimizers, strict=True)):
            if active[i]:
                p.grad = grads[i].clone()
                optimizer.step()
        # every client steps in the first three: the in-place path (no mask), then masked
        stacked.step(params, {"w": grads}, None if bool(active.all()) else active)
    torch.testing.assert_close(params["w"], torch.stack([p.detach() for p in ps]), rtol=0, atol=0)
    for i, (p, optimizer) in enumerate(zip(ps, optimizers, strict=True)):
        expected = optimizer.state[p]
        got = stacked.client_state("w", i, True, {})
        for key, value in got.items():
            if value is not None:
                torch.testing.assert_close(value, expected[key].to(value), rtol=0, atol=0)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_cohort_equals_sequential_in_mixed_precision(precision, tmp_path):
    runs = []
    for cohort in (False, True):
        torch.manual_seed(0)
        model = ClientModule(**SYNTHETIC, momentum=0.5)
        runs.append(_run(model, cohort, tmp_path / precision, precision=precision))
    # both autocast the same operations; vmapped low-precision matmuls may round differently
    sequential, cohort = runs[0].aggregator.seen, runs[1].aggregator.seen
    _assert_same_uploads(sequential, cohort, rtol=5e-2, atol=1e-2, mean=5e-4)


def test_a_skipped_16_mixed_step_does_not_move_that_client(tmp_path):
    """A client whose gradient overflows under its scale skips the step (parameters and momentum
    stay), while the other clients step; its scale halves."""
    from fedlightning.backends.cohort.optim import StackedOptimizer, StackedScaler

    params = {"w": torch.ones(3, 2)}
    opts = [torch.optim.SGD([torch.zeros(2)], lr=0.1, momentum=0.9) for _ in range(3)]
    names = [{id(o.param_groups[0]["params"][0]): "w"} for o in opts]
    optim = StackedOptimizer.stack(opts, names, params)
    scaler = StackedScaler(3, torch.device("cpu"))
    grads = {"w": torch.tensor([[1.0, 1.0], [float("inf"), 1.0], [2.0, 2.0]]) * 2.0**16}
    unscaled, finite = scaler.unscale(grads, torch.arange(3))
    active = torch.tensor([True, True, True])
    optim.step(params, unscaled, active & finite)
    scaler.update(finite, active)
    assert finite.tolist() == [True, False, True]
    torch.testing.assert_close(params["w"], torch.tensor([[0.9, 0.9], [1.0, 1.0], [0.8, 0.8]]))
    assert optim.state["w"]["momentum_buffer"][1].eq(0).all()
    assert scaler.scale.tolist() == [2.0**16, 2.0**15, 2.0**16]


def test_dropout_masks_are_per_client_and_deterministic(tmp_path):
    """Dropout under the cohort: two runs agree exactly; two clients with the same data and model
    draw different masks (so their updates differ), which they do not without dropout."""

    def uploads(drop, name):
        torch.manual_seed(0)
        dm = FederatedDataModule(
            dataset="synthetic", num_samples=64, num_test=16, num_classes=3, sample_shape=(6,),
            num_clients=2, partition="iid", batch_size=32,
        )  # fmt: skip
        dm.setup("fit")
        dm._train_idx[1].copy_(dm._train_idx[0])  # the same samples for both clients
        loop = FederatedLoop(
            rounds=1, clients_per_round=2, aggregator=recording(FedAvg), run_dir=str(tmp_path / name),
            progress_bar=False, plots=False, backend=CohortBackend(), seed=3, local_steps=1,
        )  # fmt: skip
        network = WithBatchNorm()
        network.body[1] = nn.Dropout(drop)
        loop.fit(ClientModule(network=network, num_classes=3), datamodule=dm)
        return loop.aggregator.seen[0]

    # one step on one full batch: the clients see the same samples (in another order)
    with_dropout, again, without = uploads(0.5, "a"), uploads(0.5, "b"), uploads(0.0, "c")
    for key in with_dropout[0].weights:
        torch.testing.assert_close(
            with_dropout[0].weights[key], again[0].weights[key], rtol=0, atol=0
        )
        torch.testing.assert_close(without[0].weights[key], without[1].weights[key])
    assert not torch.equal(
        with_dropout[0].weights["body.0.weight"], with_dropout[1].weights["body.0.weight"]
    )


class Manual(ClientModule):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False


class Scheduled(ClientModule):
    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1)]


class Branching(ClientModule):
    def local_loss(self, batch):
        loss = super().local_loss(batch)
        return loss * 2 if loss > 1 else loss  # data-dependent Python control flow


@pytest.mark.parametrize(
    ("make", "loop_kwargs", "message"),
    [
        (lambda: Manual(**SYNTHETIC), {}, "manual optimization"),
        (lambda: Scheduled(**SYNTHETIC), {}, "LR schedulers"),
        (lambda: ClientModule(**SYNTHETIC), {"precision": "64-true"}, "64-true"),
        (
            lambda: ClientModule(network=WithBatchNorm(), num_classes=3),
            {"precision": "bf16-mixed"},
            "BatchNorm1d.*bf16-mixed on the CPU",
        ),
        (lambda: Branching(**SYNTHETIC), {}, "Branching.local_loss cannot be vmapped"),
    ],
)
def test_cohort_refuses_what_it_cannot_train(make, loop_kwargs, message, tmp_path):
    model = make()
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=120, num_classes=3, sample_shape=(6,), num_clients=2
    )
    loop = FederatedLoop(
        rounds=1, clients_per_round=2, run_dir=str(tmp_path), progress_bar=False,
        plots=False, backend=CohortBackend(), **loop_kwargs,
    )  # fmt: skip
    with pytest.raises(
        ConfigurationError, match=f"loop.backend=CohortBackend cannot train.*{message}"
    ):
        loop.fit(model, datamodule=dm)
    if not isinstance(model, Branching):  # a vmap failure shows at the first step
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


def test_vit_attention_is_batched_under_the_cohort(tmp_path):
    """timm's ViT attention runs on scaled-dot-product attention's math kernel under the cohort,
    which vmap batches: no per-client fallback loop (vmap warns when it falls back)."""
    import warnings

    model = ClientModule(
        network="vit_s8", network_kwargs={"embed_dim": 24, "num_heads": 3, "patch_size": 4},
        num_classes=3, in_channels=1, image_size=8, lr=0.01,
    )  # fmt: skip
    data = FederatedDataModule(
        dataset="synthetic", num_samples=32, num_test=8, num_classes=3, sample_shape=(1, 8, 8),
        num_clients=2, partition="iid", batch_size=8,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=1, clients_per_round=2, local_steps=2, aggregator=FedAvg(), backend=CohortBackend(),
        run_dir=str(tmp_path), progress_bar=False, plots=False,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop.fit(model, datamodule=data)
    fallbacks = [w for w in caught if "batching rule" in str(w.message)]
    assert not fallbacks, fallbacks[0].message
