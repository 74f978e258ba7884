"""The README's "Adding an algorithm" example runs as written, and its server momentum is correct
on a BatchNorm model (issue 22: momentum on BatchNorm statistics drove running_var negative)."""

import math
import re
from pathlib import Path

import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.clients import ClientModule
from fedlightning.server import FedAvg, FedAvgM

README = Path(__file__).parents[1] / "README.md"


def test_readme_plugin_example_trains(tmp_path):
    namespace = _readme_namespace()
    data = FederatedDataModule(dataset="digits", num_clients=6, partition="iid")
    torch.manual_seed(0)
    model = namespace["LabelSmoothing"](
        eps=0.1, network="mlp", num_classes=10, in_channels=1, image_size=8, lr=0.1
    )
    aggregator = namespace["ServerMomentum"](beta=0.5)
    loop = FederatedLoop(
        rounds=3,
        clients_per_round=3,
        aggregator=aggregator,
        run_dir=str(tmp_path),
        progress_bar=False,
    )
    metrics = loop.fit(model, datamodule=data)
    assert metrics["test_acc"] > 0.5  # chance is 0.1
    assert (
        set(aggregator.velocity)
        and "velocity" in torch.load(tmp_path / "last.ckpt", weights_only=True)["aggregator"]
    )


def _readme_namespace() -> dict:
    section = README.read_text().split("## Adding an algorithm", 1)[1].split("\n## ", 1)[0]
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        exec(compile(block, str(README), "exec"), namespace)
    return namespace


class _MomentumOnEverything(FedAvg):
    """The README's former example: momentum on every floating entry of the mean, BatchNorm
    statistics included (``updates_buffers``, velocity for every floating entry)."""

    updates_buffers = True

    def __init__(self, beta: float = 0.9):
        super().__init__()
        self.beta = beta
        self.add_state("velocity", "floating")

    def server_update(self, server_round):
        new = {}
        for key, mean in server_round.mean.items():
            if mean.is_floating_point():
                self.velocity[key] = self.beta * self.velocity[key] + self.weights[key] - mean
                new[key] = self.weights[key] - self.velocity[key]
        return new


def _watched(cls):
    """``cls`` recording, after each aggregation, the smallest BatchNorm ``running_var`` and
    whether every buffer the round owned took the round's mean."""

    class Watched(cls):
        # the test's records, read by no later round
        transient_attributes = frozenset({"seen", "smallest_var", "buffers_took_mean"})

        def server_update(self, server_round):
            self.seen = server_round
            return super().server_update(server_round)

        def aggregate(self, round_index, uploads):
            super().aggregate(round_index, uploads)
            variances = [v.min() for k, v in self.weights.items() if k.endswith("running_var")]
            self.smallest_var = [*getattr(self, "smallest_var", []), float(min(variances))]
            buffers = self.seen.buffer_keys
            self.buffers_took_mean = getattr(self, "buffers_took_mean", True) and all(
                torch.equal(self.weights[k], self.seen.mean[k]) for k in buffers
            )

    Watched.__name__ = cls.__name__
    return Watched


def _bn_run(aggregator, tmp_path):
    """4 rounds of 4 digits clients in two BatchNorm ResNet groups, SGD momentum 0.5."""
    torch.manual_seed(0)
    model = ClientModule(
        networks=["resnet10", "resnet14"], network_kwargs={"width": 4, "stem": "small"},
        num_classes=10, in_channels=1, image_size=8, lr=0.05, momentum=0.5,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=4, clients_per_round=4, aggregator=aggregator, run_dir=str(tmp_path),
        progress_bar=False, plots=False, max_skipped_fraction=1.0,
    )  # fmt: skip
    loop.fit(
        model, datamodule=FederatedDataModule(dataset="digits", num_clients=4, partition="iid")
    )
    return loop


@pytest.mark.parametrize("name", ["ServerMomentum", "FedAvgM"])
def test_server_momentum_stays_finite_on_a_batchnorm_model(name, tmp_path):
    """The README's example and the library's FedAvgM on heterogeneous BatchNorm ResNets: the
    momentum steps the parameters only, so every running_var stays the (non-negative) mean."""
    cls = _readme_namespace()["ServerMomentum"] if name == "ServerMomentum" else FedAvgM
    aggregator = _watched(cls)()  # beta = 0.9 by default in both
    loop = _bn_run(aggregator, tmp_path)
    assert [row["round"] for row in loop.history] == [1, 2, 3, 4]  # no round failed
    assert loop.summary.rounds_skipped == 0
    assert all(
        math.isfinite(row[k]) for row in loop.history for k in row if k.endswith("test_loss")
    )
    assert aggregator.buffers_took_mean and min(aggregator.smallest_var) >= 0
    final = torch.load(tmp_path / "global.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in final.values() if v.is_floating_point())


def test_momentum_on_batchnorm_statistics_is_the_failure_the_hook_prevents(tmp_path):
    """Regression guard for the example above: the same run with the momentum applied to the
    BatchNorm statistics too (the README's former example) drives running_var negative, and the
    loop refuses those rounds (non-finite test loss) instead of finishing with a NaN model."""
    aggregator = _watched(_MomentumOnEverything)()
    loop = _bn_run(aggregator, tmp_path)
    assert min(aggregator.smallest_var) < 0
    assert loop.summary.rounds_skipped >= 1 and loop.summary.failed_rounds
    final = torch.load(tmp_path / "global.pt", weights_only=True)
    assert all(v.min() >= 0 for k, v in final.items() if k.endswith("running_var"))
