"""Inner-product manipulation: Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant
SGD by Inner Product Manipulation", UAI 2020, arXiv:1903.03936. docs/algorithms.md section 8.1."""

from __future__ import annotations

from fedlightning.attacks.base import PREFIX, Attack, AttackRound
from fedlightning.attacks.maths import mean_update
from fedlightning.errors import require
from fedlightning.protocol import StateDict
from fedlightning.server.summation import wide


class InnerProductManipulation(Attack):
    """Every malicious upload becomes ``w - epsilon * mean_j u_j`` with ``u_j = w_j - w`` the
    round's honest updates (omniscient, as in the paper): with a small ``epsilon`` (the paper's
    0.1 against Krum) the malicious uploads sit close to the honest ones, inside what distance-
    based rules accept, yet their inner product with the true update is negative; with a large
    one (the paper's 100 against the median) they overwhelm a mean. All malicious uploads agree.
    A round with no honest upload leaves the malicious ones at ``w`` (zero update). Statistics are
    per key over the honest uploads that own it; integer entries are uploaded as they are.

    Args:
        fraction, clients: the malicious clients (:class:`~fedlightning.attacks.base.Attack`).
        epsilon: epsilon > 0, the scale of the reversed honest mean.
    """

    def __init__(
        self, fraction: float = 0.0, clients: list[int] | None = None, epsilon: float = 0.1
    ) -> None:
        super().__init__(fraction, clients)
        require(epsilon > 0, f"{PREFIX}.epsilon", epsilon, "a number > 0")
        self.epsilon = epsilon

    def corrupt(self, attack_round: AttackRound) -> list[StateDict]:
        rows = list(zip(attack_round.uploads, attack_round.references, attack_round.malicious,
                        strict=True))  # fmt: skip
        honest = [
            {k: wide(v) - wide(ref[k]) for k, v in u.weights.items() if v.is_floating_point()}
            for u, ref, bad in rows
            if not bad
        ]
        mean = mean_update(honest)
        return [
            {
                k: (wide(ref[k]) - self.epsilon * mean[k]).to(v.dtype)
                if v.is_floating_point() and k in mean
                else (ref[k].clone() if v.is_floating_point() else v)
                for k, v in upload.weights.items()
            }
            if bad
            else upload.weights
            for upload, ref, bad in rows
        ]
