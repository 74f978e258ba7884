"""Non-finite models are never silent (issue 22 item 4, :mod:`fedlightning.loop.server_guard`): a
NaN/Inf in the server state after aggregation, or a non-finite test loss, is a failed round that
names the aggregator, the entry and the round; the state is restored, ``on_round_failure``
applies, and a run that cannot keep its model finite exits non-zero."""

import logging
import math
import sys
from pathlib import Path

import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.cli import main
from fedlightning.clients import ClientModule
from fedlightning.errors import RunStopped
from fedlightning.loop.server_guard import non_finite_entry
from fedlightning.server import FedAvg
from objective_helpers import SYNTHETIC, synthetic_run

NAN = float("nan")
CONF = Path(__file__).parent / "conf"


def test_the_non_finite_entry_is_named_as_it_is_indexed():
    finite = {"weights": {"a": torch.zeros(2)}, "num_clients": 4}
    assert non_finite_entry(finite) is None
    state = {"weights": {"a": torch.zeros(2), "fc.weight": torch.tensor([1.0, NAN])}}
    assert non_finite_entry(state) == "weights['fc.weight']"
    models = {"models": [{"b": torch.ones(1)}, {"b": torch.tensor([math.inf])}]}
    assert non_finite_entry(models) == "models[1]['b']"
    assert non_finite_entry({"scale": NAN}) == "scale"


def test_an_aggregator_writing_nan_fails_the_cli_run_naming_it_and_the_key(
    tmp_path, capsys, caplog
):
    caplog.set_level(logging.ERROR, logger="fedlightning")
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(CONF / "tiny.yaml"), "--loop.run_dir", str(tmp_path),
              "--loop.aggregator", "user_clients.NaNServer"])  # fmt: skip
    assert stopped.value.code == 1
    assert "run failed: no round aggregated (4 skipped)" in capsys.readouterr().err
    # features.1.weight: the tiny config's MLP's first parameter, where NaNServer writes NaN
    key = "weights['features.1.weight']"
    message = f"NaNServer's server state is not finite after aggregation ({key} holds NaN/Inf)"
    assert f"round 1: {message}" in caplog.text and f"round 4: {message}" in caplog.text
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert non_finite_entry(checkpoint["aggregator"]) is None  # restored, round after round
    assert len(checkpoint["history"]) == 4  # each restored model evaluated and logged


class InPlaceNaN(FedAvg):
    """A server optimizer that corrupts its own state in place in round ``bad_round``."""

    def __init__(self, bad_round: int = 0):
        super().__init__()
        self.bad_round = bad_round
        self.add_state("velocity", "parameters")

    def server_update(self, server_round):
        if server_round.index == self.bad_round:
            next(iter(self.velocity.values())).fill_(NAN)
        return {}


def test_stop_stops_naming_the_aggregator_the_entry_and_the_round(tmp_path):
    with pytest.raises(RunStopped, match=r"round 2: InPlaceNaN's server state is not finite after "
                       r"aggregation \(velocity\['features.1.weight'\] holds NaN/Inf\); the server "
                       r"state is restored.*on_round_failure='stop'"):  # fmt: skip
        synthetic_run(ClientModule(**SYNTHETIC), InPlaceNaN(bad_round=1), 3, tmp_path,
                      on_round_failure="stop", plots=False)  # fmt: skip
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert (
        checkpoint["round"] == 1
        and not checkpoint["aggregator"]["velocity"]["features.1.weight"].any()
    )


def test_skip_goes_on_from_the_state_restored_from_a_copy(tmp_path):
    """The in-place write reached the aggregator's tensors, not the guard's copy of them."""
    loop = synthetic_run(ClientModule(**SYNTHETIC), InPlaceNaN(bad_round=1), 3, tmp_path,
                         plots=False)  # fmt: skip
    assert loop.summary.rounds_aggregated == 2 and loop.summary.rounds_skipped == 1
    assert all(not v.any() for v in loop.aggregator.velocity.values())  # zeros, as declared
    assert "round failed 1x (first round 2): InPlaceNaN's server state" in "\n".join(
        loop.summary.lines()
    )


class NegativeVariance(FedAvg):
    """Writes BatchNorm running_var = -1 in round 2: a finite state whose test loss is NaN."""

    updates_buffers = True
    transient_attributes = frozenset({"before"})  # the test's record, read by no later round

    def server_update(self, server_round):
        if server_round.index != 1:
            return {}
        self.before = {k: v.clone() for k, v in self.weights.items()}
        return {k: -torch.ones_like(v) for k, v in server_round.mean.items()
                if k.endswith("running_var")}  # fmt: skip


def test_a_non_finite_test_loss_fails_the_round_and_is_not_logged(tmp_path):
    aggregator = NegativeVariance()
    model = ClientModule(**dict(SYNTHETIC, network="resnet14", in_channels=1, image_size=8,
                                network_kwargs={"width": 4, "stem": "small"}))  # fmt: skip
    data = FederatedDataModule(dataset="synthetic", num_samples=160, num_test=40, num_classes=3,
                               sample_shape=(1, 8, 8), num_clients=4, partition="iid")  # fmt: skip
    loop = FederatedLoop(rounds=2, clients_per_round=2, aggregator=aggregator,
                         run_dir=str(tmp_path), progress_bar=False, plots=False)  # fmt: skip
    loop.fit(model, datamodule=data)  # 1 of 2 rounds skipped: within max_skipped_fraction
    assert [row["round"] for row in loop.history] == [1]  # round 2's model was discarded
    assert loop.summary.rounds_aggregated == 1 and loop.summary.rounds_skipped == 1
    assert "round failed 1x (first round 2): the model aggregated by NegativeVariance has a " \
           "non-finite test loss (test_loss=nan)" in "\n".join(loop.summary.lines())  # fmt: skip
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    saved = torch.load(tmp_path / "global.pt", weights_only=True)
    assert checkpoint["round"] == 2 and len(checkpoint["history"]) == 1
    for key, value in aggregator.before.items():  # the state before round 2, restored
        assert torch.equal(checkpoint["aggregator"]["weights"][key], value), key
        assert torch.equal(saved[key], value), key


def test_a_run_whose_one_evaluated_round_is_skipped_says_its_model_is_unscored(tmp_path, capsys):
    """``eval_every`` = rounds and the last round skipped: no row is logged, and the closing line
    says so (it printed nothing before) and how to score the saved (restored) model."""
    model = ClientModule(**dict(SYNTHETIC, network="resnet14", in_channels=1, image_size=8,
                                network_kwargs={"width": 4, "stem": "small"}))  # fmt: skip
    data = FederatedDataModule(dataset="synthetic", num_samples=160, num_test=40, num_classes=3,
                               sample_shape=(1, 8, 8), num_clients=4, partition="iid")  # fmt: skip
    loop = FederatedLoop(rounds=2, clients_per_round=2, aggregator=NegativeVariance(),
                         eval_every=2, run_dir=str(tmp_path), progress_bar=False,
                         plots=False)  # fmt: skip
    loop.fit(model, datamodule=data)
    assert loop.history == [] and loop.summary.rounds_skipped == 1
    (done,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("done:")]
    assert done.startswith("done: 2 round(s), no test accuracy logged (no round was evaluated ")
    assert done.endswith(f"`fedlightning test {tmp_path}` scores the saved model")
    assert (tmp_path / "global.pt").is_file()


class NaNGlobal(FedAvg):
    """A finite server state whose deployable global model is not finite."""

    def global_state(self):
        return {k: v * NAN if v.is_floating_point() else v for k, v in self.weights.items()}


def test_a_non_finite_final_global_model_is_not_saved_and_fails_the_run(tmp_path):
    message = r"the final global model of NaNGlobal is not finite \(features.1.weight holds NaN"
    with pytest.raises(RunStopped, match=message + r"/Inf\), so it is not saved as global.pt"):
        synthetic_run(ClientModule(**SYNTHETIC), NaNGlobal(), 1, tmp_path, plots=False)
    assert not (tmp_path / "global.pt").exists()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_fused_finite_check_finds_every_nan_and_inf_and_refuses_no_finite_value(dtype):
    from fedlightning.loop.failures import all_finite

    big = torch.finfo(dtype).max
    # finite values whose sum overflows the dtype (and float32): still finite, never refused
    assert all_finite({"a": torch.full((4, 3), big, dtype=dtype), "b": torch.ones(5)})
    assert all_finite({"a": torch.tensor([big, big, -big], dtype=dtype), "n": torch.tensor([3])})
    for bad in (NAN, math.inf, -math.inf):
        for position in (0, 7, 99):
            values = torch.randn(100).to(dtype)
            values[position] = bad
            state = {"w": torch.zeros(3, dtype=dtype), "x": values, "y": torch.ones(2)}
            assert not all_finite(state)
            assert non_finite_entry(state) == "x"
    # +Inf and -Inf in different tensors of one dtype (their sum is NaN, not 0)
    assert not all_finite(
        [torch.tensor([math.inf], dtype=dtype), torch.tensor([-math.inf], dtype=dtype)]
    )
    assert not all_finite({"w": torch.ones(2), "scale": math.inf})
