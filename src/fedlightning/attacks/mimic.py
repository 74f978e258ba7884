"""The mimic attack: Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets
via Bucketing", ICLR 2022, arXiv:2006.09365 (section 5, "Mimic"; the reference code's
``MimicVariantAttacker``). docs/algorithms.md section 8.1."""

from __future__ import annotations

from typing import ClassVar

import torch

from fedlightning.attacks.base import PREFIX, Attack, AttackRound
from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict
from fedlightning.seeding import derive_seed
from fedlightning.server.robust_maths import flat_floats


def power_step(gradients: torch.Tensor, mean: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """One step of the power iteration on the honest pseudo-gradients' scatter around ``mean``:
    ``sum_j <g_j - mean, z> (g_j - mean)``, normalised to norm 1 (a zero sum stays zero).

    >>> power_step(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]), torch.zeros(2), torch.ones(2))
    tensor([1., 0.])
    """
    centered = gradients - mean
    cumulated = (centered @ z) @ centered
    norm = cumulated.norm()
    return cumulated / norm if norm > 0 else cumulated


def mimicked(gradients: torch.Tensor, direction: torch.Tensor) -> int:
    """The row of ``gradients`` with the largest inner product with ``direction`` (the earliest
    of equal ones): the honest worker the attackers copy.

    >>> mimicked(torch.tensor([[0.0, 1.0], [2.0, 0.0], [2.0, 0.0]]), torch.tensor([1.0, 0.0]))
    1
    """
    return int((gradients @ direction).argmax())  # argmax returns the first maximum


class Mimic(Attack):
    """Every malicious upload copies one honest client's (its floating entries; integer entries
    as uploaded), so that client's data is over-represented ``f + 1`` times: on heterogeneous
    data, robust rules then pull the model towards that client's optimum.

    The client is the reference code's choice (``MimicVariantAttacker``): with ``g_j = w - w_j``
    the honest pseudo-gradients of a round (the gradient scaled by the learning rate for one
    step of SGD), their mean ``mu`` and a direction ``z`` of largest spread, the attackers copy
    ``argmax_j <g_j, z>``. In the first round, ``mu`` is that round's mean and ``z`` one power
    step from a standard normal draw (seeded by the run's seed): ``z ∝ sum_j <g_j - mu, z_0>
    (g_j - mu)``; in each further round of the ``warmup``, ``mu`` and ``z`` are running averages
    ``mu <- t/(1+t) mu + mean_t/(1+t)``, ``z <- t/(1+t) z + step/(1+t)`` normalised, and the
    target is chosen again; after the warmup the target is fixed. A round whose honest uploads
    do not hold the target (partial participation) copies that round's ``argmax_j <g_j, z>``
    without changing the target; a round with no honest upload leaves the malicious uploads at
    ``w``. ``mu``, ``z``, the rounds seen and the target are the attack's state, checkpointed
    with the run (a resumed run copies the same client).

    Args:
        fraction, clients: the malicious clients (:class:`~fedlightning.attacks.base.Attack`).
        warmup: rounds over which ``mu`` and ``z`` are estimated, >= 1 (the reference code's
            default, and its experiments': 1).
    """

    state_attributes: ClassVar[tuple[str, ...]] = (
        "rounds_seen", "last_round", "mean", "direction", "target",
    )  # fmt: skip

    def __init__(
        self, fraction: float = 0.0, clients: list[int] | None = None, warmup: int = 1
    ) -> None:
        super().__init__(fraction, clients)
        require(isinstance(warmup, int) and warmup >= 1, f"{PREFIX}.warmup", warmup,
                "an integer >= 1")  # fmt: skip
        self.warmup = warmup
        self.rounds_seen = 0
        self.last_round = -1
        self.mean = torch.zeros(0, dtype=torch.float64)
        self.direction = torch.zeros(0, dtype=torch.float64)
        self.target = -1

    def _observe(self, gradients: torch.Tensor, client_ids: list[int], seed: int) -> None:
        """One warmup round: update ``mu`` and ``z`` and choose the target (see the class)."""
        t = self.rounds_seen
        current = gradients.mean(dim=0)
        if t == 0:
            generator = torch.Generator().manual_seed(derive_seed(seed, "attack", "mimic"))
            start = torch.randn(gradients.shape[1], generator=generator, dtype=torch.float64)
            self.mean = current
            self.direction = power_step(gradients, self.mean, start)
        else:
            self.mean = t / (1 + t) * self.mean + current / (1 + t)
            step = power_step(gradients, self.mean, self.direction)
            direction = t / (1 + t) * self.direction + step / (1 + t)
            self.direction = direction / direction.norm()
        self.target = client_ids[mimicked(gradients, self.direction)]
        self.rounds_seen = t + 1

    def corrupt(self, attack_round: AttackRound) -> list[StateDict]:
        rows = list(zip(attack_round.uploads, attack_round.references, attack_round.malicious,
                        strict=True))  # fmt: skip
        honest = [(u, ref) for u, ref, bad in rows if not bad]
        if not honest:  # nobody to copy: the weights received
            return [
                {k: ref[k].clone() if v.is_floating_point() else v for k, v in u.weights.items()}
                if bad else u.weights
                for u, ref, bad in rows
            ]  # fmt: skip
        if len({frozenset(u.weights) for u, _, _ in rows}) > 1:
            raise ConfigurationError(
                f"{PREFIX.removesuffix('.init_args')}=Mimic copies one client's upload into "
                "the malicious ones, which needs clients that own the same keys: use one network"
            )
        ids = [u.client_id for u, _ in honest]
        gradients = (
            flat_floats([ref for _, ref in honest]) - flat_floats([u.weights for u, _ in honest])
        ).cpu()
        if attack_round.index != self.last_round and self.rounds_seen < self.warmup:
            self._observe(gradients, ids, attack_round.seed)
        self.last_round = attack_round.index
        target = self.target if self.target in ids else ids[mimicked(gradients, self.direction)]
        copied = honest[ids.index(target)][0].weights
        return [
            {k: copied[k].clone() if v.is_floating_point() else v for k, v in u.weights.items()}
            if bad else u.weights
            for u, _, bad in rows
        ]  # fmt: skip
