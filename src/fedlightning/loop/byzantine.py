"""The run's attack (``loop.attack``), resolved at start-up and applied in one place each round
(docs/algorithms.md section 8.1).

:func:`prepare_attack` (from :func:`fedlightning.loop.startup.prepare_run`, before anything is
written) draws the malicious clients, computes ``f``, the most of them any round of the run
samples, and has the attack and the aggregator refuse what they cannot serve
(:meth:`~fedlightning.server.base.Aggregator.check_byzantine`). :meth:`Adversary.corrupt` then
replaces the malicious uploads of each round after the fits and their checks, before the
aggregation: the same place for every backend.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from fedlightning.attacks.base import Attack, AttackRound
from fedlightning.loop.sampling import sample_clients
from fedlightning.protocol import FitConfig, Payload, Upload
from fedlightning.server.base import Aggregator, restrict

log = logging.getLogger("fedlightning")


@dataclass(frozen=True)
class Adversary:
    """The run's attack with its malicious clients.

    Attributes:
        attack: ``loop.attack``.
        malicious: the malicious clients.
        seed: the run's seed (the attacks' randomness derives from ``(seed, round, client)``).
    """

    attack: Attack
    malicious: frozenset[int]
    seed: int

    def corrupt(
        self, round_index: int, uploads: Sequence[Upload], payloads: dict[int, Payload]
    ) -> list[Upload]:
        """The round's uploads as the aggregator receives them: the malicious ones' weights
        replaced by the attack (extras, sample and step counts as uploaded)."""
        flags = [u.client_id in self.malicious for u in uploads]
        if not any(flags) or self.attack.poisons_labels:
            return list(uploads)
        references = tuple(
            restrict(payloads[u.client_id].weights, frozenset(u.weights)) for u in uploads
        )
        attack_round = AttackRound(round_index, self.seed, tuple(uploads), references, tuple(flags))
        weights = self.attack.corrupt(attack_round)
        return [
            dataclasses.replace(u, weights=w) if bad else u
            for u, w, bad in zip(uploads, weights, flags, strict=True)
        ]

    def round_metrics(self, uploads: Sequence[Upload]) -> dict[str, float]:
        """``malicious_uploads``: how many of the round's aggregated uploads were malicious."""
        return {"malicious_uploads": float(sum(u.client_id in self.malicious for u in uploads))}


def most_malicious_per_round(
    seed: int, num_clients: int, per_round: int, rounds: int, malicious: frozenset[int]
) -> int:
    """f: the most malicious clients among the sampled ones of any round ``0 .. rounds - 1``
    (sampling is a function of ``(seed, round)``, so this is exact, not a bound)."""
    if not malicious:
        return 0
    if per_round == num_clients:
        return len(malicious)
    return max(
        len(malicious.intersection(sample_clients(seed, r, num_clients, per_round)))
        for r in range(rounds)
    )


def prepare_attack(
    attack: Attack | None,
    aggregator: Aggregator,
    fit_config: FitConfig,
    num_clients: int,
    per_round: int,
    rounds: int,
    seed: int,
) -> tuple[Adversary | None, FitConfig]:
    """The run's :class:`Adversary` (``None`` without an attack) and its fit config (with the
    label-flipping clients); refuses an attack the aggregator cannot tolerate or the attack
    cannot form, with a ConfigurationError naming the option."""
    if attack is None:
        aggregator.check_byzantine(per_round, 0)
        return None, fit_config
    malicious = frozenset(attack.malicious_clients(num_clients, seed))
    byzantine = most_malicious_per_round(seed, num_clients, per_round, rounds, malicious)
    attack.check_round(per_round, byzantine)
    aggregator.check_byzantine(per_round, byzantine)
    log.warning(
        "attack %s: clients %s (%d of %d) are malicious; up to %d of the %d clients of a round",
        type(attack).__name__, ", ".join(map(str, sorted(malicious))) or "none",
        len(malicious), num_clients, byzantine, per_round,
    )  # fmt: skip
    flipped = tuple(sorted(malicious)) if attack.poisons_labels else ()
    return Adversary(attack, malicious, seed), dataclasses.replace(
        fit_config, label_flip_clients=flipped
    )
