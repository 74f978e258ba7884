"""The server statistic injected (docs/algorithms.md section 2.8): a robust or private statistic
composes with a server optimizer with no new class, the presets are FedAvg with a statistic, the
breakdown, SecAgg+ and DP rules read the statistic, a user's Statistic subclass with one method
works (an object that is not one is refused, saying what it is), and the docs' example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.flower_app.secure_options import check_aggregator
from fedlightning.privacy import ClientLevelDP, NoisedMean
from fedlightning.protocol import ClientKeys, Upload
from fedlightning.server import FedAdam, FedAvg, FedAvgM, FedNova, Krum, MultiKrum
from fedlightning.server.statistics import (
    CenteredClip,
    Median,
    Statistic,
    StatisticContext,
    TrimmedMean,
)
from fedlightning.server.statistics import Krum as KrumRule

DOC = Path(__file__).parents[1] / "docs" / "algorithms.md"
ROWS = [[1.0, 2.0, 0.0], [3.0, -1.0, 0.5], [2.0, 0.0, 9.0], [100.0, 5.0, 1.2], [2.5, 1.0, 0.2]]


def uploads(rows=ROWS):
    return [Upload(i, {"w": torch.tensor(r, dtype=torch.float64)}, 2 + i, 1)
            for i, r in enumerate(rows)]  # fmt: skip


def test_fedadam_over_a_median_is_adam_on_the_coordinate_wise_median():
    initial = {"w": torch.zeros(3, dtype=torch.float64)}
    agg = FedAdam(server_lr=0.5, beta1=0.9, beta2=0.99, tau=1e-3, statistic=Median())
    agg.setup(initial, 5)
    agg.aggregate(0, uploads())
    # by hand: the median per coordinate, then Adam from w = 0 with m = 0, v = tau^2
    median = torch.tensor(ROWS, dtype=torch.float64).median(dim=0).values
    m = 0.1 * median
    v = 0.99 * 1e-6 + 0.01 * median**2
    torch.testing.assert_close(agg.global_state()["w"], 0.5 * m / (v.sqrt() + 1e-3))
    shorthand = FedAdam(server_lr=0.5, aggregation="median")  # the same statistic, bit for bit
    shorthand.setup(initial, 5)
    shorthand.aggregate(0, uploads())
    assert torch.equal(shorthand.global_state()["w"], agg.global_state()["w"])


def test_fedavgm_over_the_dp_mean_needs_no_new_class():
    """FedAvgM over NoisedMean is ClientLevelDP(inner=FedAvgM) bit for bit, noise included; the
    estimator is checked without its noise (no allowed noise multiplier is small enough to hide,
    docs/algorithms.md section 7.4; the noise itself is tested in test_client_dp.py)."""
    initial = {"w": torch.zeros(3)}
    release = NoisedMean(noise_multiplier=1.0, clip_norm=100.0)
    direct = FedAvgM(weighting="uniform", server_lr=1.0, server_momentum=0.5, statistic=release)
    release.plan("poisson", 0.5, 10, 1)
    direct.setup(initial, 4, seed=3)
    preset = ClientLevelDP(inner=FedAvgM(weighting="uniform", server_lr=1.0, server_momentum=0.5),
                           noise_multiplier=1.0, clip_norm=100.0)  # fmt: skip
    preset.plan("poisson", 0.5, 10, 1)
    preset.setup(initial, 4, seed=3)
    release.update_noise = preset.statistic.update_noise = 0.0  # the estimator, noiseless
    assert direct.releases_every_round and preset.releases_every_round
    for r, value in enumerate([2.0, 4.0]):
        round_uploads = [Upload(0, {"w": torch.tensor([value, 0.0, 0.0])}, 1, 1)]
        direct.aggregate(r, round_uploads)
        preset.aggregate(r, round_uploads)
    # the release is w + S / (q N) = w + u / 2: round 1 mean [1, 0, 0], d = -1, v = -1, w = 1;
    # round 2 mean 1 + (4 - 1) / 2 = 2.5, d = -1.5, v = 0.5 * -1 - 1.5 = -2, w = 1 + 2 = 3
    torch.testing.assert_close(direct.global_state()["w"], torch.tensor([3.0, 0.0, 0.0]))
    assert torch.equal(direct.global_state()["w"], preset.global_state()["w"])
    assert release.accountant.steps == 2 and "dp_epsilon" in direct.round_metrics()


def test_the_rules_read_the_statistic_not_the_class():
    median_adam = FedAdam(weighting="uniform", statistic=Median())
    with pytest.raises(ConfigurationError, match="cannot tolerate .* 2f < n"):
        median_adam.check_byzantine(per_round=10, byzantine=5)
    with pytest.raises(ConfigurationError, match=r"trim_beta \* n\) >= f"):
        FedAvgM(statistic=TrimmedMean(trim_beta=0.1)).check_byzantine(10, 2)
    with pytest.raises(ConfigurationError, match="its statistic Median .* reads each client's"):
        check_aggregator(median_adam)  # SecAgg+: FedAdam is allowed, its statistic is not
    assert check_aggregator(FedAdam(weighting="uniform")) == "uniform"
    with pytest.raises(ConfigurationError, match="combines the uploads by Median"):
        ClientLevelDP(inner=median_adam, noise_multiplier=1.0)
    nova = FedNova(weighting="uniform")
    dp_nova = type(nova)(weighting="uniform")
    dp_nova.statistic = NoisedMean(noise_multiplier=1.0)  # as a user could build it by hand
    dp_nova.statistic.plan("poisson", 0.5, 10, 1)
    with pytest.raises(ConfigurationError, match="FedNova cannot: its server update normalises"):
        dp_nova.setup({"w": torch.zeros(2)}, 4)


class OnlyStartUpCheck(Statistic):
    """A user's statistic with ``check_byzantine`` alone: each round is tested by it too."""

    def __init__(self):
        self.checked = []

    def check_byzantine(self, per_round, byzantine):
        self.checked.append((per_round, byzantine))

    def combine(self, uploads, weights, context: StatisticContext):
        return dict(uploads[0])


def test_each_rounds_breakdown_check_is_the_statistics_read_through_the_aggregator():
    """Krum adopts the run's f at start-up and tests every round's n against it (docs section 8):
    the loop asks the aggregator (``check_round_byzantine``), FedAvg asks its statistic, and a
    wrapper (ClientLevelDP, InCo) its inner; whichever aggregator holds Krum, the round with
    ``n <= 2f + 2`` uploads fails, and Multi-Krum's ``selected`` is held to ``n - f``."""
    for holder in (Krum(), FedAvgM(weighting="uniform", statistic=KrumRule())):
        holder.check_byzantine(per_round=10, byzantine=2)  # start-up: f = 2 adopted
        assert holder.statistic.assumed_byzantine == 2
        holder.check_round_byzantine(7, 0)  # 7 > 2f + 2, whatever this round holds
        with pytest.raises(ConfigurationError, match=r"n=6 clients, and \S+ needs n > 2f \+ 2"):
            holder.check_round_byzantine(6, 0)  # failures left 6: Krum's f = 2 no longer fits
    multi = MultiKrum(selected=6)
    multi.check_byzantine(10, 2)
    multi.check_round_byzantine(8, 1)
    with pytest.raises(ConfigurationError, match=r"selected=6 exceeds n - f = 7 - 2"):
        multi.check_round_byzantine(7, 1)
    user = OnlyStartUpCheck()
    FedAvg(statistic=user).check_round_byzantine(4, 1)
    assert user.checked == [(4, 1)]


def test_a_statistic_and_a_shorthand_together_are_refused():
    with pytest.raises(ConfigurationError, match="give the statistic alone"):
        FedAvg(aggregation="median", statistic=Median())


class Duck:
    """An object with ``combine`` that is no Statistic."""

    def combine(self, uploads, weights, context):
        return dict(uploads[0])


@pytest.mark.parametrize(
    ("given", "what"),
    [
        (object(), "a plain object"),
        (Duck(), "an instance of Duck (a class derived from object)"),
        (Duck, "a class derived from object"),
        (len, "a function"),
        (torch, "a module"),
    ],
)
def test_an_object_that_is_not_a_statistic_is_refused_saying_what_it_is(given, what):
    with pytest.raises(ConfigurationError) as refused:
        FedAvg(statistic=given)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"loop.aggregator.init_args.statistic={type(given).__name__} is {what}, not a Statistic: "
        "a statistic subclasses fedlightning.server.statistics.Statistic and writes "
        "combine(uploads, weights, context) (docs/algorithms.md section 2.8)"
    )


class CoordinateMax(Statistic):
    """A user's statistic: one method, no state, every capability the base's default."""

    def combine(self, uploads, weights, context: StatisticContext):
        return {k: torch.stack([u[k] for u in uploads]).amax(dim=0) for k in context.model}


def test_a_statistic_of_ones_own_with_one_method():
    agg = FedAvgM(server_lr=1.0, server_momentum=0.0, statistic=CoordinateMax())
    agg.setup({"w": torch.zeros(3, dtype=torch.float64)}, 5)
    agg.aggregate(0, uploads())
    assert agg.global_state()["w"].tolist() == [100.0, 5.0, 9.0]
    assert agg.state_dict().keys() == {"weights", "momentum", "num_clients"}
    with pytest.raises(ConfigurationError, match="statistic CoordinateMax"):
        check_aggregator(agg)
    keys = [ClientKeys("a", frozenset({"w"})), ClientKeys("b", frozenset({"w", "v"}))]
    with pytest.raises(ConfigurationError, match="statistic CoordinateMax.*own the same keys"):
        FedAvg(statistic=CoordinateMax()).setup({"w": torch.zeros(1), "v": torch.zeros(1)}, 2,
                                                client_keys=keys)  # fmt: skip


def test_the_statistics_state_is_checkpointed_restored_and_undone():
    """Centered clipping's center is its statistic's: a resume continues bit for bit, an undone
    round puts it back."""
    initial = {"w": torch.zeros(3, dtype=torch.float64)}
    straight = FedAvg(weighting="uniform", statistic=CenteredClip(radius=1.0))
    straight.setup(initial, 5)
    straight.aggregate(0, uploads())
    checkpoint = straight.state_dict()
    assert set(checkpoint) == {"weights", "statistic", "num_clients"}
    assert straight.declared_states()["statistic.center"].startswith("0.0 like")
    undo = straight.snapshot()
    straight.aggregate(1, uploads(ROWS[::-1]))
    after_two = straight.global_state()["w"].clone()
    straight.restore(undo)
    assert torch.equal(straight.statistic.center["w"], checkpoint["statistic"]["center"]["w"])
    resumed = FedAvg(weighting="uniform", statistic=CenteredClip(radius=1.0))
    resumed.setup(initial, 5)
    resumed.load_state_dict(checkpoint)
    resumed.aggregate(1, uploads(ROWS[::-1]))
    assert torch.equal(resumed.global_state()["w"], after_two)


def test_a_preset_is_fedavg_with_its_statistic():
    preset, composed = Krum(), FedAvg(weighting="uniform", statistic=Krum().statistic)
    for agg in (preset, composed):
        agg.setup({"w": torch.zeros(3, dtype=torch.float64)}, 5)
        agg.check_byzantine(5, 1)
        agg.aggregate(0, uploads())
    assert torch.equal(preset.global_state()["w"], composed.global_state()["w"])
    assert preset.global_state()["w"].tolist() in ROWS  # Krum takes one upload


def test_the_docs_example_runs():
    """The ``python`` block of docs/algorithms.md section 2.8, run as written; its statistic then
    checked against a hand computation."""
    heading = "### 2.8 " + "The server statistic"  # not a citation of the docs
    section = DOC.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 30
    namespace: dict = {}
    exec(compile(code, "the 2.8 example", "exec"), namespace)
    aggregator = namespace["aggregator"]
    aggregator.setup({"w": torch.zeros(3, dtype=torch.float64)}, 5)
    before = aggregator.global_state()["w"].clone()
    mean = aggregator.statistic.combine([u.weights for u in uploads()], [1.0] * 5,
                                        StatisticContext(0, 0, aggregator.weights))  # fmt: skip
    # per coordinate the 3 values nearest the median: (2, 2.5, 3), (0, 1, 2), (0, 0.2, 0.5)
    torch.testing.assert_close(mean["w"], torch.tensor([2.5, 1.0, 0.7 / 3], dtype=torch.float64))
    aggregator.aggregate(0, uploads())
    assert not torch.equal(aggregator.global_state()["w"], before)
