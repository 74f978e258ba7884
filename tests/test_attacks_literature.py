"""The robustness literature's attacks (docs/algorithms.md section 8.1): inner-product
manipulation (Xie et al., UAI 2020), ALIE's reference-code variant and direction, bit flipping
and the mimic attack (Karimireddy et al.), by hand on tiny uploads."""

from __future__ import annotations

from statistics import NormalDist

import pytest
import torch

from fedlightning.attacks import ALIE, BitFlip, InnerProductManipulation, Mimic
from fedlightning.attacks.base import AttackRound
from fedlightning.attacks.maths import alie_z
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Upload
from fedlightning.seeding import derive_seed

REFERENCE = {"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(7)}
TRAINED = [[2.0, 1.0], [3.0, 0.0], [1.0, 4.0], [9.0, 9.0]]  # updates (1,0) (2,-1) (0,3) (8,8)


def corrupt(attack, malicious):
    uploads = tuple(Upload(i, {"w": torch.tensor(w), "n": torch.tensor(i)}, 1, 1)
                    for i, w in enumerate(TRAINED))  # fmt: skip
    return attack.corrupt(AttackRound(0, 0, uploads, (REFERENCE,) * 4, malicious))


def test_ipm_reverses_the_honest_mean():
    out = corrupt(InnerProductManipulation(epsilon=0.5), (False, False, False, True))
    honest_mean = torch.tensor([1.0, 2.0 / 3.0])  # of (1,0), (2,-1), (0,3)
    torch.testing.assert_close(out[3]["w"], REFERENCE["w"] - 0.5 * honest_mean)
    assert int(out[3]["n"]) == 3  # integer entries as uploaded
    assert out[0]["w"].tolist() == [2.0, 1.0]  # honest uploads untouched
    # the inner product with the honest mean is -epsilon ||mean||^2 < 0
    assert float((out[3]["w"] - REFERENCE["w"]) @ honest_mean) < 0
    alone = corrupt(InnerProductManipulation(), (True, True, True, True))
    assert all(torch.equal(u["w"], REFERENCE["w"]) for u in alone)  # no honest mean: zero update
    with pytest.raises(ConfigurationError, match="loop.attack.init_args.epsilon"):
        InnerProductManipulation(epsilon=0.0)


def test_alie_honest_variant_takes_z_and_statistics_over_the_honest_uploads():
    # the numbers: n = 20 with 4 attackers, s = 7
    assert alie_z(20, 4) == pytest.approx(NormalDist().inv_cdf(13 / 20))
    assert alie_z(20, 4, "honest") == pytest.approx(NormalDist().inv_cdf(9 / 16))
    assert round(alie_z(20, 4, "honest"), 3) == 0.157 and round(alie_z(20, 4), 3) == 0.385
    out = corrupt(ALIE(z=1.0, variant="honest"), (False, False, False, True))
    honest = torch.tensor([[1.0, 0.0], [2.0, -1.0], [0.0, 3.0]])
    expected = REFERENCE["w"] + honest.mean(dim=0) + honest.std(dim=0)
    torch.testing.assert_close(out[3]["w"], expected)
    everyone = corrupt(ALIE(z=1.0), (False, False, False, True))  # the default: all four updates
    updates = torch.tensor([[1.0, 0.0], [2.0, -1.0], [0.0, 3.0], [8.0, 8.0]])
    torch.testing.assert_close(everyone[3]["w"],
                               REFERENCE["w"] + updates.mean(dim=0) + updates.std(dim=0))  # fmt: skip
    with pytest.raises(ConfigurationError, match="loop.attack.init_args.variant"):
        ALIE(variant="reference")  # type: ignore[arg-type]


def _sample_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def test_alie_in_both_directions_against_the_reference_codes_gradient_formula():
    """The reference code (``codes/attacks/alittle.py``) sends ``mu_g - z sigma_g`` of the honest
    gradients, and its server steps ``x - lr * aggregate``; here a client's update is ``-lr``
    times its gradient, so the reference direction is ``w + mu_u + z sigma_u`` and the other
    (``space: update``) ``w + mu_u - z sigma_u``. Recomputed from the trained models in plain
    Python (no library helper), coordinate by coordinate, at the reference code's own z."""
    lr = 0.5
    w = REFERENCE["w"].tolist()
    honest_rows = TRAINED[:3]
    n, m = 4, 1
    s = int(n / 2 + 1) - m  # supporters: floor(n/2 + 1) - m
    z = NormalDist().inv_cdf((n - m - s) / (n - m))  # the reference code's z_max
    assert z == pytest.approx(alie_z(n, m, "honest"))
    stepped, other = [], []
    for j, w_j in enumerate(w):  # coordinate by coordinate
        gradients = [(w_j - row[j]) / lr for row in honest_rows]
        sent = sum(gradients) / 3 - z * _sample_std(gradients)  # the attacker's mu_g - z sigma_g
        stepped.append(w_j - lr * sent)  # the server's x - lr * gradient
        updates = [row[j] - w_j for row in honest_rows]
        other.append(w_j + sum(updates) / 3 - z * _sample_std(updates))
    out = corrupt(ALIE(variant="honest"), (False, False, False, True))
    torch.testing.assert_close(out[3]["w"], torch.tensor(stepped))
    flipped = corrupt(ALIE(variant="honest", space="update"), (False, False, False, True))
    torch.testing.assert_close(flipped[3]["w"], torch.tensor(other))
    with pytest.raises(ConfigurationError, match="loop.attack.init_args.space='gradients'"):
        ALIE(space="gradients")  # type: ignore[arg-type]


def test_bit_flip_negates_the_update():
    out = corrupt(BitFlip(), (False, True, False, False))
    # w - (w_1 - w) = (1, 1) - (2, -1) = (-1, 2)
    assert out[1]["w"].tolist() == [-1.0, 2.0] and int(out[1]["n"]) == 1
    assert out[0]["w"].tolist() == TRAINED[0]


def _mimic_reference(rounds, seed, warmup):
    """The reference code's MimicVariantAttacker on the honest pseudo-gradients ``w - w_j``,
    in plain torch: which honest worker (position) each round copies."""
    t, mu, z, target, targets = 0, None, None, None, []
    for gradients in rounds:
        average = sum(gradients) / len(gradients)
        if t == 0:
            generator = torch.Generator().manual_seed(derive_seed(seed, "attack", "mimic"))
            z = torch.randn(len(average), generator=generator, dtype=torch.float64)
            mu = average
            cumulated = sum(((g - mu) @ z) * (g - mu) for g in gradients)
            z = cumulated / cumulated.norm()
        elif t < warmup:
            mu = t / (1 + t) * mu + average / (1 + t)
            cumulated = sum(((g - mu) @ z) * (g - mu) for g in gradients)
            z = t / (1 + t) * z + cumulated / cumulated.norm() / (1 + t)
            z = z / z.norm()
        if t < warmup:
            products = [float(g @ z) for g in gradients]
            target = products.index(max(products))
        targets.append(target)
        t += 1
    return targets


def test_mimic_copies_the_reference_codes_choice_and_keeps_it_after_the_warmup():
    g = torch.Generator().manual_seed(3)
    reference = {"w": torch.zeros(4, dtype=torch.float64), "n": torch.tensor(0)}
    attack = Mimic(clients=[4], warmup=2)
    rounds, copied = [], []
    for index in range(4):
        trained = [torch.randn(4, generator=g, dtype=torch.float64) * (1 + j) for j in range(5)]
        uploads = tuple(Upload(j, {"w": w, "n": torch.tensor(j)}, 1, 1)
                        for j, w in enumerate(trained))  # fmt: skip
        out = attack.corrupt(
            AttackRound(index, 9, uploads, (reference,) * 5, (False,) * 4 + (True,))
        )
        assert int(out[4]["n"]) == 4  # integers as uploaded
        copied.append(next(j for j in range(4) if torch.equal(out[4]["w"], trained[j])))
        rounds.append([reference["w"] - w for w in trained[:4]])  # pseudo-gradients
    assert copied == _mimic_reference(rounds, seed=9, warmup=2)
    assert copied[3] == copied[2] == copied[1]  # fixed after the warmup of two rounds
    state = attack.state_dict()
    assert state["rounds_seen"] == 2 and state["target"] == copied[1]
    fresh = Mimic(clients=[4], warmup=2)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["target"] == copied[1] and fresh.rounds_seen == 2
    with pytest.raises(ConfigurationError, match="loop.attack.init_args.warmup=0"):
        Mimic(warmup=0)


def _mimic_run(run_dir, rounds, ckpt_path=None):
    from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
    from fedlightning.backends import SequentialBackend
    from fedlightning.server import FedAvg

    torch.manual_seed(0)
    data = FederatedDataModule(
        dataset="synthetic", num_samples=240, num_test=40, num_classes=3, sample_shape=(1, 4, 4),
        num_clients=6, partition="shards", shards_per_client=1, batch_size=8, seed=0,
    )  # fmt: skip
    attack = Mimic(clients=[5], warmup=3)
    loop = FederatedLoop(
        rounds=rounds, clients_per_round=6, local_steps=1, seed=0, run_dir=str(run_dir),
        aggregator=FedAvg(aggregation="median"), attack=attack, backend=SequentialBackend(),
        progress_bar=False, plots=False,
    )  # fmt: skip
    objective = ClientModule(network="mlp", network_kwargs={"hidden": [8]}, num_classes=3,
                             in_channels=1, image_size=4, lr=0.5)  # fmt: skip
    loop.fit(objective, datamodule=data, ckpt_path=ckpt_path)
    return attack, loop


def test_mimics_state_is_checkpointed_and_a_resumed_run_continues_it(tmp_path):
    """Within a warmup of 3 rounds, a run stopped after 2 and resumed continues the running mean
    and direction (restored from the checkpoint's ``attack`` entry), bit for bit."""
    straight, loop = _mimic_run(tmp_path / "straight", 3)
    _mimic_run(tmp_path / "resumed", 2)
    resumed, again = _mimic_run(tmp_path / "resumed", 3, str(tmp_path / "resumed" / "last.ckpt"))
    assert straight.rounds_seen == resumed.rounds_seen == 3
    for name in ("mean", "direction"):
        assert torch.equal(getattr(straight, name), getattr(resumed, name))
    assert straight.target == resumed.target
    a, b = loop.aggregator.global_state(), again.aggregator.global_state()
    assert all(torch.equal(a[k], b[k]) for k in a)
