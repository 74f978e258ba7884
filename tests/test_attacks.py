"""The Byzantine attacks (docs/algorithms.md section 8.1) on hand-made uploads, the malicious set,
the bad inputs refused before anything is written, and the attacks applied identically on every
backend (label flipping inside each backend's fits, the upload attacks in one place after them)."""

import dataclasses
import inspect
import json
import math
from statistics import NormalDist

import pytest
import torch

from fedlightning import ClientModule, FederatedDataModule, FederatedLoop, attacks
from fedlightning.attacks import ALIE, GaussianNoise, LabelFlip, Scaling, SignFlip
from fedlightning.attacks.labels import training_batches
from fedlightning.attacks.maths import alie_z
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.errors import ConfigurationError
from fedlightning.loop.byzantine import Adversary, most_malicious_per_round
from fedlightning.loop.sampling import sample_clients
from fedlightning.protocol import ClientJob, FitConfig, Payload, Upload
from fedlightning.seeding import derive_seed
from fedlightning.server import FedAvg, Krum

SERVER = {"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(7)}


def _upload(cid, w):
    return Upload(cid, {"w": torch.tensor(w), "n": torch.tensor(9)}, num_samples=5, num_steps=2)


def _corrupt(attack, uploads, malicious, round_index=0, seed=0):
    adversary = Adversary(attack, frozenset(malicious), seed)
    payloads = {u.client_id: Payload(SERVER) for u in uploads}
    return adversary.corrupt(round_index, uploads, payloads)


def test_sign_flip_and_scaling_by_hand():
    uploads = [_upload(0, [3.0, 1.0]), _upload(1, [2.0, 2.0])]
    flipped = _corrupt(SignFlip(clients=[0], scale=4.0), uploads, {0})
    # w - s (w_i - w) = (1, 1) - 4 (2, 0) = (-7, 1); the honest upload is the same object
    assert flipped[0].weights["w"].tolist() == [-7.0, 1.0]
    assert flipped[0].weights["n"].item() == 9 and flipped[1] is uploads[1]
    assert (flipped[0].num_samples, flipped[0].num_steps) == (5, 2)
    scaled = _corrupt(Scaling(clients=[0], factor=10.0), uploads, {0})
    assert scaled[0].weights["w"].tolist() == [21.0, 1.0]  # w + 10 (w_i - w)
    assert uploads[0].weights["w"].tolist() == [3.0, 1.0]  # the upload itself is untouched


def test_gaussian_noise_is_seeded_by_seed_round_and_client():
    uploads = [_upload(0, [3.0, 1.0]), _upload(1, [2.0, 2.0])]
    attack = GaussianNoise(clients=[0, 1], sigma=0.5)
    out = _corrupt(attack, uploads, {0, 1}, round_index=3, seed=11)
    generator = torch.Generator().manual_seed(derive_seed(11, "attack", 3, 0))
    expected = SERVER["w"].double() + 0.5 * torch.randn(2, generator=generator, dtype=torch.float64)
    assert torch.equal(out[0].weights["w"], expected.float())  # w + N(0, sigma^2), not w_i
    again = _corrupt(attack, list(reversed(uploads)), {0, 1}, round_index=3, seed=11)
    assert torch.equal(again[1].weights["w"], out[0].weights["w"])  # order does not matter
    assert not torch.equal(out[1].weights["w"], out[0].weights["w"])  # clients differ
    other_round = _corrupt(attack, uploads, {0, 1}, round_index=4, seed=11)
    assert not torch.equal(other_round[0].weights["w"], out[0].weights["w"])


def test_alie_by_hand():
    # updates 0, 2, 4 on the first coordinate (w = 1): mean 2, sample std 2; n = 3, m = 1:
    # s = floor(3/2 + 1) - 1 = 1, z = Phi^-1(2/3); the malicious upload is w + 2 + 2 z (the
    # pseudo-gradients w - w_i have mean -2 and std 2: the attackers send -2 - 2 z of them)
    uploads = [_upload(0, [1.0, 1.0]), _upload(1, [3.0, 1.0]), _upload(2, [5.0, 1.0])]
    z = NormalDist().inv_cdf(2 / 3)
    assert alie_z(3, 1) == pytest.approx(z)
    # n = 50, m = 12: s = 26 - 12 = 14 supporters, z = Phi^-1(36 / 50); n = 10, m = 2: s = 4
    assert alie_z(50, 12) == pytest.approx(NormalDist().inv_cdf(36 / 50))
    assert alie_z(10, 2) == pytest.approx(NormalDist().inv_cdf(6 / 10))
    out = _corrupt(ALIE(clients=[2]), uploads, {2})
    assert out[2].weights["w"][0].item() == pytest.approx(1 - (-2 - 2 * z), abs=1e-6)
    updated = _corrupt(ALIE(clients=[2], space="update"), uploads, {2})
    assert updated[2].weights["w"][0].item() == pytest.approx(1 + 2 - 2 * z, abs=1e-6)
    assert out[2].weights["w"][1].item() == 1.0  # no spread: the mean
    assert out[0] is uploads[0] and out[1] is uploads[1]
    fixed = _corrupt(ALIE(clients=[1, 2], z=1.5), uploads, {1, 2})
    assert fixed[1].weights["w"][0].item() == pytest.approx(1 + 2 + 1.5 * 2)
    assert torch.equal(fixed[1].weights["w"], fixed[2].weights["w"])  # the attackers agree


def test_label_flip_trains_on_mirrored_labels_and_leaves_uploads():
    dm = FederatedDataModule(dataset="digits", num_clients=4, partition="iid", seed=0)
    dm.setup()
    honest = list(training_batches(dm, 1, 5, FitConfig()))
    flipped_loader = training_batches(dm, 1, 5, FitConfig(label_flip_clients=(1,)))
    flipped = list(flipped_loader)
    assert len(flipped_loader) == len(honest) and len(flipped) == len(honest)
    for (x, y), (fx, fy) in zip(honest, flipped, strict=True):
        assert torch.equal(x, fx) and torch.equal(fy, 9 - y)  # same batches, y -> C - 1 - y
    uploads = [_upload(0, [3.0, 1.0])]
    assert _corrupt(LabelFlip(clients=[0]), uploads, {0})[0] is uploads[0]


def test_label_flip_clients_survive_the_flower_wire():
    """The Flower backend sends the fit config to its SuperNodes as JSON, where a tuple becomes
    a list (fedlightning.flower_app.records)."""
    config = FitConfig(local_steps=3, label_flip_clients=(2, 5))
    back = FitConfig(**json.loads(json.dumps(dataclasses.asdict(config))))
    assert back == config and back.label_flip_clients == (2, 5)
    records = pytest.importorskip("fedlightning.flower_app.records")
    job = ClientJob(0, 2, Payload({"w": torch.zeros(2)}), {})
    _, read, _, _ = records.read_jobs(records.jobs_blob([job], config, {}))
    assert read == config and hash(read) == hash(config)


def test_the_malicious_set_is_seeded_and_sized():
    attack = SignFlip(fraction=0.3)
    chosen = attack.malicious_clients(20, seed=4)
    assert len(chosen) == 6 and chosen == tuple(sorted(chosen))
    assert attack.malicious_clients(20, seed=4) == chosen
    assert attack.malicious_clients(20, seed=5) != chosen
    assert len(SignFlip(fraction=0.25).malicious_clients(10, 0)) == 3  # 2.5 rounds up
    assert SignFlip(clients=[4, 1]).malicious_clients(5, 0) == (1, 4)


def test_f_is_the_most_malicious_clients_a_round_can_hold_whatever_the_rounds():
    """Closed form (start-up does not walk the rounds): fixed sampling min(m, K), attained by
    some round of a long enough run; Poisson sampling every malicious client."""
    malicious = frozenset({0, 1, 2, 3})
    assert most_malicious_per_round("fixed", 10, 5, malicious) == 4
    assert most_malicious_per_round("fixed", 10, 3, malicious) == 3
    assert most_malicious_per_round("poisson", 10, 3, malicious) == 4
    assert most_malicious_per_round("fixed", 10, 5, frozenset()) == 0
    seen = max(len(malicious & set(sample_clients(7, r, 10, 5))) for r in range(300))
    assert seen == 4  # the bound is reached: no smaller f holds for every seed and run length


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SignFlip(fraction=1.0), r"loop.attack.init_args.fraction=1.0 .*\[0, 1\)"),
        (lambda: SignFlip(fraction=-0.1), r"loop.attack.init_args.fraction=-0.1"),
        (lambda: SignFlip(fraction=0.2, clients=[1]), "loop.attack.init_args.clients"),
        (lambda: SignFlip(clients=[1, 1]), "distinct client ids"),
        (lambda: SignFlip(scale=0.0), "loop.attack.init_args.scale=0.0"),
        (lambda: Scaling(factor=-1.0), "loop.attack.init_args.factor=-1.0"),
        (lambda: GaussianNoise(sigma=0.0), "loop.attack.init_args.sigma=0.0"),
        (lambda: ALIE(z=-1.0), "loop.attack.init_args.z=-1.0"),
    ],
)
def test_bad_attack_options_are_refused(make, message):
    with pytest.raises(ConfigurationError, match=message):
        make()


def _loop(tmp_path, aggregator, attack, rounds=2, per_round=10, backend=None):
    return FederatedLoop(
        rounds=rounds, clients_per_round=per_round, aggregator=aggregator, attack=attack,
        backend=backend, run_dir=str(tmp_path), progress_bar=False, plots=False, seed=3,
    )  # fmt: skip


def _mlp():
    return ClientModule(network="mlp", network_kwargs={"hidden": [16]}, num_classes=10,
                        in_channels=1, image_size=8, lr=0.1)  # fmt: skip


def _digits(num_clients=10):
    return FederatedDataModule(dataset="digits", num_clients=num_clients, partition="iid", seed=3)


@pytest.mark.parametrize(
    ("aggregator", "attack", "message"),
    [
        (Krum(), SignFlip(fraction=0.4), r"Krum cannot tolerate .* f=4 .* n=10 .* n > 2f \+ 2"),
        (FedAvg(aggregation="median"), SignFlip(fraction=0.5), r"2f < n"),
        (FedAvg(aggregation="trimmed_mean", trim_beta=0.1), SignFlip(fraction=0.2),
         "loop.aggregator.init_args.trim_beta >= 0.2"),
        (FedAvg(), SignFlip(clients=[3, 10]), r"client ids in \[0, 10\) \(unknown: \[10\]\)"),
        (FedAvg(), SignFlip(fraction=0.04), "makes no malicious client"),
        (FedAvg(), ALIE(fraction=0.6), "set loop.attack.init_args.z"),
    ],
)  # fmt: skip
def test_refused_before_anything_is_written(aggregator, attack, message, tmp_path):
    with pytest.raises(ConfigurationError, match=message):
        _loop(tmp_path / "run", aggregator, attack).fit(_mlp(), datamodule=_digits())
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_an_attack_that_is_not_an_attack_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="loop.attack"):
        _loop(tmp_path, FedAvg(), "sign_flip")


def _global(tmp_path, attack, backend, aggregator=None):
    torch.manual_seed(0)
    loop = _loop(tmp_path, aggregator or FedAvg(), attack, backend=backend)
    loop.fit(_mlp(), datamodule=_digits())
    return loop.aggregator.global_state(), loop.history[-1]


def test_label_flip_reaches_the_fits_of_the_sequential_and_cohort_backends(tmp_path):
    clean, _ = _global(tmp_path / "clean", None, SequentialBackend())
    sequential, row = _global(tmp_path / "seq", LabelFlip(fraction=0.3), SequentialBackend())
    cohort, _ = _global(tmp_path / "cohort", LabelFlip(fraction=0.3), CohortBackend())
    assert row["malicious_uploads"] == 3
    assert not torch.allclose(sequential["head.weight"], clean["head.weight"], atol=1e-3)
    for key, value in sequential.items():  # the cohort's float rounding (test_registry_contract)
        torch.testing.assert_close(cohort[key], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "attack",
    [SignFlip(fraction=0.3), Scaling(fraction=0.3), GaussianNoise(fraction=0.3, sigma=0.1),
     ALIE(fraction=0.3)],
    ids=lambda a: type(a).__name__,
)  # fmt: skip
def test_upload_attacks_are_applied_identically_on_every_backend(attack, tmp_path):
    sequential, _ = _global(tmp_path / "seq", attack, SequentialBackend())
    cohort, _ = _global(tmp_path / "cohort", attack, CohortBackend())
    clean, _ = _global(tmp_path / "clean", None, SequentialBackend())
    assert any(not torch.allclose(sequential[k], clean[k], atol=1e-4) for k in clean)
    for key, value in sequential.items():
        torch.testing.assert_close(cohort[key], value, rtol=1e-4, atol=1e-5)
    assert all(math.isfinite(float(v.abs().max())) for v in sequential.values())


@pytest.mark.slow  # Ray's start-up and actors: about half a minute
@pytest.mark.parametrize("attack", [LabelFlip(fraction=0.3), GaussianNoise(fraction=0.3)],
                         ids=lambda a: type(a).__name__)  # fmt: skip
def test_attacks_give_the_same_bits_on_ray(attack, tmp_path, local_ray):
    """A Ray actor gets the data module pickled and the fit config from start(): it flips the
    same labels as a sequential fit, and the upload attacks run on the server either way."""
    from fedlightning.backends import RayBackend

    sequential, _ = _global(tmp_path / "seq", attack, SequentialBackend())
    on_ray, _ = _global(tmp_path / "ray", attack, RayBackend(num_workers=2))
    assert all(torch.equal(on_ray[k], v) for k, v in sequential.items())


@pytest.mark.slow  # a localhost federation (SuperLink, two SuperNodes): about a minute
def test_label_flipping_on_a_flower_federation_is_byte_identical_to_sequential(tmp_path):
    """The SuperNodes rebuild the data module from its init args; the malicious clients reach
    them in the fit config, so their fits flip the same labels as a sequential fit."""
    pytest.importorskip("flwr")
    from conftest import run_cli
    from fedlightning.flower_app.local import LocalFederation
    from test_flower import _flower_args

    attack = ["--loop.attack", "fedlightning.attacks.LabelFlip",
              "--loop.attack.init_args.clients", "[1, 2, 5]"]  # fmt: skip
    run_cli(tmp_path / "clean", "--loop.rounds", "2")
    run_cli(tmp_path / "seq", "--loop.rounds", "2", *attack)
    with LocalFederation(num_nodes=2) as fed:
        run_cli(tmp_path / "flower", "--loop.rounds", "2", *attack, *_flower_args(fed))
    flower = (tmp_path / "flower" / "global.pt").read_bytes()
    assert flower == (tmp_path / "seq" / "global.pt").read_bytes()
    assert flower != (tmp_path / "clean" / "global.pt").read_bytes()


ATTACKS = [
    getattr(attacks, n) for n in attacks.__all__ if not inspect.isabstract(getattr(attacks, n))
]


@pytest.mark.parametrize("cls", ATTACKS, ids=lambda c: c.__name__)
def test_every_attack_keeps_the_upload_format_and_is_a_function_of_its_round(cls):
    """Over ``attacks.__all__``: malicious uploads keep each key's shape and dtype (a BatchNorm
    state with an integer counter), honest uploads pass as the same objects, and the same round
    gives the same bits."""
    g = torch.Generator().manual_seed(0)
    server = {"w": torch.randn(3, 2, generator=g), "bn.running_var": torch.ones(2),
              "bn.num_batches_tracked": torch.tensor(4)}  # fmt: skip
    uploads = [
        Upload(i, {k: v + 0.1 * i if v.is_floating_point() else v + 1 for k, v in server.items()},
               num_samples=3, num_steps=1)
        for i in range(5)
    ]  # fmt: skip
    adversary = Adversary(cls(clients=[1, 3]), frozenset({1, 3}), seed=5)
    payloads = {u.client_id: Payload(server) for u in uploads}
    first = adversary.corrupt(2, uploads, payloads)
    again = adversary.corrupt(2, uploads, payloads)
    for upload, out, repeat in zip(uploads, first, again, strict=True):
        assert all(torch.equal(out.weights[k], repeat.weights[k]) for k in upload.weights)
        if upload.client_id not in (1, 3):
            assert out is upload
        for key, value in upload.weights.items():
            assert out.weights[key].shape == value.shape and out.weights[key].dtype == value.dtype
        assert torch.equal(out.weights["bn.num_batches_tracked"], torch.tensor(5))
