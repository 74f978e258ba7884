"""Client-level DP on hand-made state_dicts (docs/algorithms.md section 7.1): the clipping, the
fixed-denominator estimator per owned key, the added noise's std (a statistical test with a fixed
seed), the adaptive clipping norm, the inner aggregators that qualify, and the accountant."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("opacus")
pytest.importorskip("dp_accounting")

from fedlightning.errors import ConfigurationError, PluginError
from fedlightning.privacy import ClientLevelDP, PrivacyAccountant
from fedlightning.privacy.bounds import CLIP_RANGE, NOISE_RANGE
from fedlightning.privacy.client_dp_maths import adaptive_clip_norm, clipped_sum
from fedlightning.protocol import ClientKeys, StateDict, Upload
from fedlightning.server import (
    FedAdam,
    FedAvg,
    FedAvgM,
    FedCross,
    FedNova,
    InCo,
    Krum,
    NormBound,
    Scaffold,
)
from fedlightning.server.round import ServerRound


def upload(cid: int, weights: StateDict) -> Upload:
    return Upload(client_id=cid, weights=weights, num_samples=10, num_steps=1)


def dp(num_clients: int, rate: float, **options) -> ClientLevelDP:
    """A ClientLevelDP planned as a loop plans it (Poisson sampling at ``rate``, 10 rounds)."""
    aggregator = ClientLevelDP(**{"noise_multiplier": 1.0, **options})
    aggregator.plan("poisson", rate, rounds=10, min_clients=1)
    return aggregator


def noiseless(aggregator: ClientLevelDP) -> None:
    """Make the set-up ``aggregator`` release its estimator without the noise, to check the
    estimator exactly; the noise is checked apart (test_the_added_noise_has_the_documented_std):
    no allowed noise multiplier is small enough to hide (docs/algorithms.md section 7.4)."""
    aggregator.statistic.update_noise = 0.0


def test_each_update_is_clipped_as_one_vector_over_its_own_keys():
    server = {"a": torch.zeros(2), "b": torch.zeros(1), "n": torch.tensor(3)}
    big = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0]), "n": torch.tensor(9)}  # 5
    small = {"a": torch.tensor([0.3, 0.4])}  # norm 0.5, owns only "a"
    total, unclipped = clipped_sum(server, [big, small], clip_norm=1.0)
    assert torch.allclose(total["a"], torch.tensor([0.6 + 0.3, 0.4], dtype=torch.float64))
    assert torch.allclose(total["b"], torch.tensor([0.8], dtype=torch.float64))
    assert "n" not in total  # an integer buffer is never part of the release
    assert int(unclipped) == 1


def test_fixed_denominators_per_owned_key_and_integer_buffers_kept():
    """Heterogeneous clients: key p's mean divides by q N_p, whoever was sampled."""
    initial = {"shared": torch.zeros(2), "big": torch.zeros(1), "count": torch.tensor(5)}
    keys = [ClientKeys("small", frozenset({"shared", "count"}))] * 2 + [
        ClientKeys("large", frozenset(initial))
    ] * 2
    aggregator = dp(4, 0.5, clip_norm=100.0)
    aggregator.setup(initial, 4, client_keys=keys, parameters=["shared", "big"])
    noiseless(aggregator)
    uploads = [
        upload(0, {"shared": torch.tensor([1.0, 2.0]), "count": torch.tensor(9)}),
        upload(3, {"shared": torch.tensor([3.0, 0.0]), "big": torch.tensor([4.0]),
                   "count": torch.tensor(7)}),
    ]  # fmt: skip
    aggregator.aggregate(0, uploads)
    new = aggregator.global_state()
    # shared: owned by all 4, q N_p = 2; big: owned by 2, q N_p = 1 (not the 1 upload seen)
    assert torch.allclose(new["shared"], torch.tensor([2.0, 1.0]))
    assert torch.allclose(new["big"], torch.tensor([4.0]))
    assert int(new["count"]) == 5


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_added_noise_has_the_documented_std(adaptive):
    """Zero updates: the new model minus the old is the noise over q N, of std z_D C / (q N)."""
    n, rate, z, clip = 20, 0.25, 1.3, 0.7
    initial = {"w": torch.zeros(200_000), "b": torch.zeros(3)}
    options = {"adaptive_clipping": True, "count_noise_std": 2.0} if adaptive else {}
    aggregator = dp(n, rate, noise_multiplier=z, clip_norm=clip, **options)
    aggregator.setup(initial, n, seed=7)
    aggregator.aggregate(
        0, [upload(i, {k: v.clone() for k, v in initial.items()}) for i in range(5)]
    )
    noise = aggregator.global_state()["w"].double()
    z_update = (z**-2 - (2 * 2.0) ** -2) ** -0.5 if adaptive else z
    expected = z_update * clip / (rate * n)
    # 200,000 draws: the sample std's relative standard error is 1/sqrt(2 * 200,000) = 0.16%
    assert abs(noise.std().item() / expected - 1) < 0.01
    assert abs(noise.mean().item()) < 5 * expected / math.sqrt(noise.numel())
    assert aggregator.round_metrics()["dp_epsilon"] > 0


def test_noise_is_seeded_by_seed_and_round():
    initial = {"w": torch.zeros(50)}

    def after(seed: int, round_index: int) -> torch.Tensor:
        aggregator = dp(10, 0.5)
        aggregator.setup(initial, 10, seed=seed)
        aggregator.aggregate(round_index, [])  # no upload: the noise alone is released
        return aggregator.global_state()["w"]

    assert torch.equal(after(0, 3), after(0, 3))
    assert not torch.equal(after(0, 3), after(0, 4))
    assert not torch.equal(after(1, 3), after(0, 3))


def test_adaptive_clip_norm_moves_to_the_target_quantile():
    norms = torch.linspace(0.1, 10.0, 100)  # the median is about 5
    for quantile in (0.3, 0.5, 0.8):
        clip = 0.1
        for _ in range(400):
            unclipped = int((norms <= clip).sum())
            clip, fraction = adaptive_clip_norm(clip, unclipped, 100, 0.0, 100, quantile, 0.2)
        assert abs(fraction - quantile) <= 0.02
        target = float(torch.quantile(norms, quantile))
        assert abs(clip - target) < 0.15 * target


def test_adaptive_clip_norm_shrinks_when_every_update_is_unclipped():
    initial = {"w": torch.zeros(4)}
    aggregator = dp(4, 0.5, adaptive_clipping=True, count_noise_std=5.0, clip_norm=10.0)
    aggregator.setup(initial, 4)
    tiny = [upload(i, {"w": torch.full((4,), 0.01)}) for i in range(4)]
    for r in range(20):
        aggregator.aggregate(r, tiny)
    assert aggregator.statistic.current_clip < 10.0 * math.exp(-0.2 * 0.5 * 20) * 3


def test_server_optimizers_run_on_the_noised_mean():
    initial = {"w": torch.zeros(3)}
    for inner in (FedAvgM(weighting="uniform"), FedAdam(weighting="uniform")):
        aggregator = ClientLevelDP(inner=inner, noise_multiplier=1.0, clip_norm=100.0)
        aggregator.plan("poisson", 0.5, 10, 1)
        aggregator.setup(initial, 4)
        noiseless(aggregator)
        aggregator.aggregate(0, [upload(0, {"w": torch.tensor([2.0, 0.0, 0.0])})])
        # the mean is w + S / (q N) = [1, 0, 0]; the server optimizer steps from it
        reference = type(inner)(weighting="uniform")
        reference.setup(initial, 4)
        reference.aggregate(0, [upload(0, {"w": torch.tensor([1.0, 0.0, 0.0])})])
        assert torch.allclose(aggregator.global_state()["w"], reference.global_state()["w"])


@pytest.mark.parametrize(
    ("inner", "message"),
    [
        (FedNova(), "FedNova cannot: its server update normalises"),
        (Scaffold(), "Scaffold cannot: its server update adds every client's delta_c"),
        (FedCross(), "FedCross is not built on FedAvg's statistic and server update"),
        (InCo(), "InCo is not built on FedAvg's statistic and server update"),
        (FedAvg(weighting="samples"), r"weighting='samples' weights a client by n_i"),
        (
            FedAvg(weighting="uniform", aggregation="median"),
            r"by Median \(loop.aggregator.init_args.aggregation='median'\), a statistic over the "
            "individual uploads",
        ),
        (
            FedAvg(weighting="uniform", clip_norm=1.0),
            r"by Mean \(loop.aggregator.init_args."
            r"clip_norm=1.0\), a statistic over the individual uploads",
        ),
        (Krum(), r"Krum combines the uploads by Krum \(loop.aggregator=Krum\), a statistic"),
        (NormBound(weighting="uniform"), r"NormBound combines the uploads by Mean"),
    ],
)
def test_aggregators_that_cannot_clip_per_client_are_refused(inner, message):
    with pytest.raises(ConfigurationError, match=message):
        ClientLevelDP(inner=inner, noise_multiplier=1.0)


def test_a_server_update_that_reads_uploads_fails_loudly():
    class ReadsUploads(FedAvg):
        def server_update(self, server_round: ServerRound) -> StateDict:
            return {"w": server_round.uploads[0].weights["w"]}

    aggregator = ClientLevelDP(inner=ReadsUploads(weighting="uniform"), noise_multiplier=1.0)
    aggregator.plan("poisson", 0.5, 10, 1)
    aggregator.setup({"w": torch.zeros(2)}, 4)
    with pytest.raises(ConfigurationError, match="ReadsUploads.server_update reads the round's"):
        aggregator.aggregate(0, [upload(0, {"w": torch.ones(2)})])


def test_a_wrong_server_update_of_the_inner_aggregator_is_one_error_naming_it():
    """Inside ClientLevelDP the inner aggregator's hook gets the same checks as on its own: a
    numpy array for a tensor is a PluginError naming the inner aggregator, the round and the key,
    with numpy's dtype written apart from torch's; the server state is untouched."""
    from user_clients import WrongServerUpdate

    inner = WrongServerUpdate(how="numpy", weighting="uniform")
    aggregator = ClientLevelDP(inner=inner, noise_multiplier=1.0)
    aggregator.plan("poisson", 0.5, 10, 1)
    aggregator.setup({"w": torch.zeros(2)}, 4)
    before = aggregator.state_dict()["inner"]["weights"]["w"].clone()
    with pytest.raises(PluginError, match=(
        r"WrongServerUpdate.server_update \(round 1\) returned 'w' as a numpy.ndarray of dtype "
        r"numpy.float32, shape \(2,\), but the server state holds a torch.Tensor of dtype "
        r"torch.float32, shape \(2,\), on cpu"
    )):  # fmt: skip
        aggregator.aggregate(0, [upload(0, {"w": torch.ones(2)})])
    assert torch.equal(aggregator.global_state()["w"], before)


def test_the_accountant_never_goes_back_when_a_round_is_undone():
    aggregator = dp(4, 0.5)
    aggregator.setup({"w": torch.zeros(2)}, 4)
    aggregator.aggregate(0, [])
    before = aggregator.state_dict()
    undo = aggregator.snapshot()
    aggregator.aggregate(1, [])
    aggregator.restore(undo)  # the guard's undo: privacy_spent is declared rollback=False
    assert aggregator.accountant.steps == 2
    assert torch.equal(aggregator.global_state()["w"], before["inner"]["weights"]["w"])
    fresh = dp(4, 0.5)
    fresh.setup({"w": torch.zeros(2)}, 4)
    fresh.load_state_dict(before)  # a resume
    assert fresh.accountant.steps == 1


def test_plan_requires_poisson_sampling_and_every_round_aggregated():
    with pytest.raises(ConfigurationError, match="loop.client_sampling='fixed'.*'poisson'"):
        ClientLevelDP(noise_multiplier=1.0).plan("fixed", 0.5, 10, 1)
    with pytest.raises(ConfigurationError, match="loop.min_clients=2 .*every round releases"):
        ClientLevelDP(noise_multiplier=1.0).plan("poisson", 0.5, 10, 2)
    with pytest.raises(ConfigurationError, match="needs the run's client sampling rate"):
        ClientLevelDP(noise_multiplier=1.0).setup({"w": torch.zeros(1)}, 4)


def test_within_groups_each_group_divides_by_its_own_expected_owners():
    initial = {"w": torch.zeros(2)}
    keys = [ClientKeys("a", frozenset({"w"}))] * 3 + [ClientKeys("b", frozenset({"w"}))]
    aggregator = ClientLevelDP(
        inner=FedAvg(weighting="uniform", within_groups=True), noise_multiplier=1.0, clip_norm=9.0
    )
    aggregator.plan("poisson", 0.5, 10, 1)
    aggregator.setup(initial, 4, client_keys=keys)
    noiseless(aggregator)
    assert aggregator.statistic.denominators == {"a/w": 1.5, "b/w": 0.5}
    aggregator.aggregate(0, [upload(0, {"w": torch.tensor([3.0, 0.0])}),
                             upload(3, {"w": torch.tensor([0.0, 1.0])})])  # fmt: skip
    models = aggregator.deployables()
    assert torch.allclose(models["a"]["w"], torch.tensor([2.0, 0.0]))
    assert torch.allclose(models["b"]["w"], torch.tensor([0.0, 2.0]))


def test_a_batchnorm_model_trains_under_client_level_dp(tmp_path):
    """A BatchNorm ResNet with momentum: float buffers are clipped and noised with the parameters,
    running_var stays >= 0, num_batches_tracked keeps the server's value, the model stays finite."""
    from fedlightning import ClientModule, FederatedDataModule, FederatedLoop

    loop = FederatedLoop(
        rounds=2, clients_per_round=3, client_sampling="poisson", local_steps=2,
        aggregator=ClientLevelDP(noise_multiplier=1.0, clip_norm=1.0), run_dir=str(tmp_path),
        progress_bar=False, plots=False,
    )  # fmt: skip
    model = ClientModule(
        network="resnet14", network_kwargs={"width": 4, "stem": "small"}, momentum=0.9, lr=0.05
    )
    initial = {k: v.clone() for k, v in model.network.state_dict().items()}
    loop.fit(
        model, datamodule=FederatedDataModule(dataset="digits", num_clients=6, partition="iid")
    )
    final = loop.aggregator.global_state()
    assert all(torch.isfinite(v.float()).all() for v in final.values())
    variances = [k for k in final if k.endswith("running_var")]
    assert variances and all((final[k] >= 0).all() for k in variances)
    assert any(not torch.equal(final[k], initial[k]) for k in variances)  # noised, not skipped
    for key in (k for k in final if k.endswith("num_batches_tracked")):
        assert torch.equal(final[key], initial[key])


def test_the_adaptive_clipping_norm_never_leaves_its_range():
    """The geometric update of C is held in the range a given clip_norm may take: updates that are
    always unclipped (a frozen model) shrink C towards its floor, never to 0 (then 0 / 0 in the
    clipping); an absurd count-noise draw stops at the ceiling, never overflows."""
    low, high = CLIP_RANGE
    clip = 1.0
    for _ in range(2000):  # every update unclipped: C shrinks by exp(-10 * 0.5) a round
        clip, _ = adaptive_clip_norm(clip, 10, 10, 0.0, 10, 0.5, 10.0)
        assert low <= clip <= high
    assert clip == low
    assert adaptive_clip_norm(1.0, 0, 10, -1e300, 10, 0.5, 10.0)[0] == high
    assert adaptive_clip_norm(1.0, 10, 10, 1e300, 10, 0.5, 10.0)[0] == low


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"noise_multiplier": 1e300}, r"noise_multiplier=1e\+300 is not allowed: expected a number in \[0.3, 1e\+06\]"),
        ({"noise_multiplier": 0.29}, r"noise_multiplier=0.29 is not allowed"),
        ({"clip_learning_rate": 1e6}, r"clip_learning_rate=1000000.0 is not allowed: expected a number in \(0, 10\]"),
        ({"clip_norm": float("inf")}, r"clip_norm=inf is not allowed: expected a number in \[1e-09, 1e\+09\]"),
        ({"accountant": "gdp"}, r"accountant='gdp' is not allowed: expected 'pld' or 'prv' or 'rdp'"),
    ],
)  # fmt: skip
def test_options_outside_their_range_are_refused_in_one_line(options, message):
    with pytest.raises(ConfigurationError, match=message):
        ClientLevelDP(**{"noise_multiplier": 1.0, **options})


def test_the_accountants_evaluate_the_ends_of_the_noise_range():
    """No overflow at the ends of the allowed noise multipliers (1e300 overflowed z^2 in every
    accountant): each gives a finite epsilon >= 0 for one release at q = 1 and q = 1e-6."""
    for z in NOISE_RANGE:
        for q in (1.0, 1e-6):
            for mechanism in ("pld", "rdp"):
                epsilon = PrivacyAccountant(mechanism, [[z, q, 1]]).epsilon(1e-5)
                assert 0 <= epsilon < math.inf
