"""The robustness literature's attacks (docs/algorithms.md section 8.1): inner-product
manipulation (Xie et al., UAI 2020) and ALIE's reference-code variant (Karimireddy et al.), by
hand on tiny uploads."""

from __future__ import annotations

from statistics import NormalDist

import pytest
import torch

from fedlightning.attacks import ALIE, InnerProductManipulation
from fedlightning.attacks.base import AttackRound
from fedlightning.attacks.maths import alie_z
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Upload

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
    expected = REFERENCE["w"] + honest.mean(dim=0) - honest.std(dim=0)
    torch.testing.assert_close(out[3]["w"], expected)
    everyone = corrupt(ALIE(z=1.0), (False, False, False, True))  # the default: all four updates
    updates = torch.tensor([[1.0, 0.0], [2.0, -1.0], [0.0, 3.0], [8.0, 8.0]])
    torch.testing.assert_close(everyone[3]["w"],
                               REFERENCE["w"] + updates.mean(dim=0) - updates.std(dim=0))  # fmt: skip
    with pytest.raises(ConfigurationError, match="loop.attack.init_args.variant"):
        ALIE(variant="reference")  # type: ignore[arg-type]
