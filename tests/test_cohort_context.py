"""The cohort backend's contract with an objective: the round context is derived from the
objective's attributes (nothing declared), what cannot be stacked is refused naming the attribute,
``begin_client`` runs once per client, one function builds every backend's result (tracked metrics
included), and what holds with BatchNorm."""

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F

from fedlightning import FedAvg, FederatedDataModule, FederatedLoop, Payload
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.backends.cohort.context import context_attributes
from fedlightning.clients import FML, ClientModule
from fedlightning.errors import ConfigurationError
from objective_helpers import SYNTHETIC
from test_cohort import _assert_same_uploads, _run, recording


def test_the_base_class_bookkeeping_list_names_every_attribute_it_sets():
    """A new attribute of ClientModule itself must be listed as bookkeeping (or it would become
    round context); the same holds with client groups and after a client's begin_client."""
    for model in (
        ClientModule(**SYNTHETIC),
        ClientModule(networks=["resnet10", "resnet14"], network_kwargs={"width": 4}),
    ):
        assert context_attributes(model) == []
        model.begin_client(0, Payload(dict(model.network.state_dict())), {})
        assert context_attributes(model) == []


class CountsRounds(ClientModule):
    """Records each begin_client and what its end_client sees of that client's round."""

    calls: ClassVar[list] = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.table = torch.arange(3.0)  # the same tensor for every client (stacked all the same)

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        CountsRounds.calls.append(("begin", client_id))
        self._tag = torch.tensor(float(client_id))  # per-client round context

    def end_client(self, num_steps):
        CountsRounds.calls.append(("end", self.client_id, float(self._tag), len(self.state)))
        return super().end_client(num_steps)


def test_begin_client_runs_once_per_client_and_end_client_sees_that_clients_view(tmp_path):
    CountsRounds.calls = []
    model = CountsRounds(**SYNTHETIC)
    table = model.table
    loop = _run(model, True, tmp_path, rounds=2)
    assert model.table is table  # a tensor every client shared is itself again after the round
    calls = CountsRounds.calls
    for uploads in loop.aggregator.seen:
        sampled = sorted(uploads)
        block, calls = calls[: 2 * len(sampled)], calls[2 * len(sampled) :]
        begins, ends = block[: len(sampled)], block[len(sampled) :]
        assert sorted(c for _, c in begins) == sampled  # each client once, all before training
        # every end_client sees its own client id, round context and state (empty in round 1)
        assert sorted(ends) == [("end", c, float(c), 0) for c in sampled]
    assert calls == []


def test_fml_tracks_its_personal_train_loss_equally_under_the_cohort(tmp_path):
    runs = []
    for cohort in (False, True):
        torch.manual_seed(0)
        model = FML(**SYNTHETIC, momentum=0.5)
        runs.append(_run(model, cohort, tmp_path, recording(FedAvg, weighting="uniform")))
    for seq_round, coh_round in zip(*(loop.aggregator.seen for loop in runs), strict=True):
        for cid, upload in seq_round.items():
            metrics, other = upload.metrics, coh_round[cid].metrics
            assert set(metrics) == set(other) == {"train_loss", "personal_train_loss"}
            assert metrics["personal_train_loss"] != metrics["train_loss"]  # two models' losses
            for name, value in metrics.items():
                assert other[name] == pytest.approx(value, rel=1e-5)


def test_tracked_values_are_averaged_over_the_batches_on_every_backend(tmp_path):
    """An objective reports its data loss as train_loss and a regulariser of its own."""

    class Tracked(ClientModule):
        def local_loss(self, batch):
            x, y = batch
            data = F.cross_entropy(self(x), y)
            penalty = self.network.head.weight.pow(2).sum()
            self.track("train_loss", data)
            self.track("penalty", penalty)
            return data + 0.01 * penalty

    runs = []
    for cohort in (False, True):
        torch.manual_seed(0)
        runs.append(_run(Tracked(**SYNTHETIC), cohort, tmp_path, rounds=1))
    sequential, cohort = (loop.aggregator.seen[0] for loop in runs)
    for cid, upload in sequential.items():
        assert set(upload.metrics) == {"train_loss", "penalty"}
        for name, value in upload.metrics.items():
            assert cohort[cid].metrics[name] == pytest.approx(value, rel=1e-5)


@dataclass(frozen=True)
class Terms:
    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    scale: torch.Tensor


class NestedContext(ClientModule):
    """Per-client round context nested in a dict of frozen dataclasses of lists of tuples."""

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        shift = torch.full((3,), 0.1 * client_id)
        self._terms = {"logits": Terms([(shift, torch.ones(3))], torch.tensor(1.0 + client_id))}

    def local_loss(self, batch):
        x, y = batch
        terms = self._terms["logits"]
        shift, weight = terms.pairs[0]
        return F.cross_entropy(self(x) + shift * weight, y) * terms.scale


def test_nested_round_context_is_stacked_per_client(tmp_path):
    runs = []
    for cohort in (False, True):
        torch.manual_seed(0)
        runs.append(_run(NestedContext(**SYNTHETIC), cohort, tmp_path, local_epochs=2))
    _assert_same_uploads(*(loop.aggregator.seen for loop in runs), rtol=1e-5, atol=1e-6)


class PerClientShape(ClientModule):
    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        self._weights = torch.ones(1 + client_id)


class ParameterAlias(ClientModule):
    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        self._start = {"head": self.network.head.weight.detach()}  # shares the parameter's memory


class PerClientObject(ClientModule):
    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        self._noise = torch.Generator().manual_seed(client_id)


class ReadsPayload(ClientModule):
    def local_loss(self, batch):
        return super().local_loss(batch) * len(self.payload.extras or [1])


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (PerClientShape, r"self._weights is \(2,\) torch.float32 for client 1 but \(3,"),
        (ParameterAlias, r"self._start\['head'\] is .*parameter or buffer network.head.weight"),
        (PerClientObject, r"self._noise is a different Generator object for clients"),
        (ReadsPayload, r"its local_loss reads self.payload.*copy what local_loss needs"),
    ],
)
def test_the_cohort_refuses_what_it_cannot_stack_naming_the_attribute(cls, message, tmp_path):
    model = cls(**SYNTHETIC)
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=120, num_classes=3, sample_shape=(6,), num_clients=4,
        partition="iid",
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=1, clients_per_round=2, run_dir=str(tmp_path), progress_bar=False, plots=False,
        backend=CohortBackend(), seed=1,
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match=message) as refusal:
        loop.fit(model, datamodule=dm)
    assert "\n" not in str(refusal.value)
    assert str(refusal.value).startswith(f"loop.backend=CohortBackend cannot train {cls.__name__}")
    assert not (tmp_path / "last.ckpt").exists()


def test_a_refusal_at_the_first_round_ends_the_cli_run_with_exit_status_2(cli, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path, "--loop.backend", "CohortBackend", "--loop.rounds", "1",
            "--model.class_path", "user_clients.PerClientSmoothing")  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "self._smoothing is" in err[0], err
    assert not (tmp_path / "last.ckpt").exists()


#: a tiny BatchNorm ResNet (BatchNorm over 1x1 maps in its last stage)
RESNET = dict(network="resnet14", network_kwargs={"width": 4, "stem": "small"}, num_classes=3,
              in_channels=1, image_size=8, lr=0.05, momentum=0.5)  # fmt: skip


def _resnet_uploads(cohort, tmp_path, **budget):
    torch.manual_seed(0)
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=160, num_test=40, num_classes=3, sample_shape=(1, 8, 8),
        num_clients=4, partition="iid", batch_size=16,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=1, clients_per_round=3, aggregator=recording(FedAvg), progress_bar=False,
        plots=False, run_dir=str(tmp_path / f"bn-{cohort}-{len(budget)}"),
        backend=CohortBackend() if cohort else SequentialBackend(), **budget,
    )  # fmt: skip
    loop.fit(ClientModule(**RESNET), datamodule=dm)
    return loop.aggregator.seen[0]


def test_batchnorm_statistics_equal_sequential_after_one_step_and_stay_close_for_a_round(tmp_path):
    """Under vmap each client's BatchNorm normalises by its own batch statistics and updates its
    own running statistics with the same kernel as a sequential fit (per client and channel): after
    one step the statistics are bitwise equal and the weights equal to float rounding. The weights'
    rounding differences then grow with the network's own sensitivity (one epoch here: 3 steps)."""
    sequential, cohort = (_resnet_uploads(c, tmp_path, local_steps=1) for c in (False, True))
    for cid, upload in sequential.items():
        for key, value in upload.weights.items():
            other = cohort[cid].weights[key]
            if "running" in key or "num_batches" in key:
                assert torch.equal(other, value), key
            else:
                torch.testing.assert_close(other, value, rtol=1e-5, atol=1e-6)
    sequential, cohort = (_resnet_uploads(c, tmp_path) for c in (False, True))
    for cid, upload in sequential.items():
        assert upload.num_steps == cohort[cid].num_steps == 3
        for key, value in upload.weights.items():
            torch.testing.assert_close(cohort[cid].weights[key], value, rtol=1e-3, atol=1e-4)
