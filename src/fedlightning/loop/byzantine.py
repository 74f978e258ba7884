"""The run's attack (``loop.attack``), resolved at start-up and applied in one place each round
(docs/algorithms.md section 8.1), and the breakdown check that no round escapes (section 8,
"Breakdown points").

:func:`prepare_attack` (from the :class:`~fedlightning.loop.components.Adversary` component's
set-up, at start-up, before anything is written) draws the malicious clients, computes ``f``, the most of them a round can hold
(:func:`most_malicious_per_round`, in closed form: start-up does not depend on the number of
rounds), and has the attack, the aggregator and the backend refuse what they cannot serve
(:meth:`~fedlightning.server.base.Aggregator.check_byzantine`; a backend that delivers the server
only the sum of the uploads cannot carry an attack that replaces uploads). Each round,
:meth:`Adversary.corrupt` replaces the malicious uploads after the fits and their checks, before
the aggregation: the same place for every backend; then :meth:`Adversary.admits` checks the
round's own n uploads and f malicious ones against the rule
(:meth:`~fedlightning.server.base.Aggregator.check_round_byzantine`): a round beyond the
breakdown point (Poisson sampling drew few clients, failures left few uploads) is not aggregated
but fails loudly, as a round whose server state went non-finite does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from fedlightning.attacks.base import Attack, AttackRound
from fedlightning.backends.base import Backend
from fedlightning.errors import ConfigurationError, RunStopped
from fedlightning.loop.summary import RunSummary
from fedlightning.protocol import Payload, Upload
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
        return {"malicious_uploads": float(self.count(uploads))}

    def count(self, uploads: Sequence[Upload]) -> int:
        """How many of ``uploads`` come from malicious clients."""
        return sum(u.client_id in self.malicious for u in uploads)

    def admits(
        self, round_index: int, uploads: Sequence[Upload], aggregator: Aggregator,
        summary: RunSummary, on_round_failure: str,
    ) -> bool:  # fmt: skip
        """Whether the round's ``uploads`` may be aggregated: the rule tolerates their f
        malicious among n (:meth:`~fedlightning.server.base.Aggregator.check_round_byzantine`).
        If not, the round fails: logged with both numbers, counted in the ``summary`` (as
        skipped), and with ``on_round_failure='stop'`` a RunStopped."""
        byzantine = self.count(uploads)
        try:
            aggregator.check_round_byzantine(len(uploads), byzantine)
        except ConfigurationError as error:
            name = type(aggregator).__name__
            summary.record_failed_round(
                round_index, f"beyond {name}'s breakdown point", aggregated=False
            )
            message = (
                f"round {round_index + 1}: {byzantine} of the {len(uploads)} uploads it would "
                f"aggregate are malicious ({error})"
            )
            if on_round_failure == "stop":
                raise RunStopped(f"{message}; stopping as on_round_failure='stop'") from None
            log.error("%s; the round is not aggregated", message)
            return False
        return True


def most_malicious_per_round(
    sampling: str, num_clients: int, per_round: int, malicious: frozenset[int]
) -> int:
    """f: the most malicious clients a round can hold, whatever the seed and the number of
    rounds. ``fixed`` sampling draws ``per_round`` of the ``num_clients`` clients, any subset
    with some probability, so ``f = min(m, K)`` for the ``m`` malicious ones; ``poisson``
    sampling may draw every malicious client in one round, ``f = m``.

    >>> most_malicious_per_round("fixed", 20, 10, frozenset(range(6)))
    6
    >>> most_malicious_per_round("fixed", 20, 4, frozenset(range(6)))
    4
    >>> most_malicious_per_round("poisson", 20, 4, frozenset(range(6)))
    6
    """
    if sampling == "poisson":
        return len(malicious)
    return min(len(malicious), per_round)


def prepare_attack(
    attack: Attack,
    aggregator: Aggregator,
    backend: Backend,
    num_clients: int,
    per_round: int,
    sampling: str,
    seed: int,
) -> tuple[Adversary, tuple[int, ...]]:
    """The run's :class:`Adversary` and the clients whose fits train on flipped labels (a
    label-flipping attack's malicious clients; none otherwise); refuses an attack the aggregator
    cannot tolerate in a round of ``per_round`` clients (the expected size under Poisson
    ``sampling``), the attack cannot form or the backend cannot carry, with a ConfigurationError
    naming the option."""
    if not attack.poisons_labels and not backend.individual_uploads:
        raise ConfigurationError(
            f"loop.attack={type(attack).__name__} replaces the malicious clients' uploads on the "
            f"server, but {type(backend).__name__} delivers the server only the sum of the "
            "uploads (secure aggregation), so there is no upload to replace: use LabelFlip "
            "(the malicious clients train on flipped labels, before the masking), or turn off "
            "loop.backend.init_args.secure_aggregation"
        )
    malicious = frozenset(attack.malicious_clients(num_clients, seed))
    byzantine = most_malicious_per_round(sampling, num_clients, per_round, malicious)
    attack.check_round(per_round, byzantine)
    aggregator.check_byzantine(per_round, byzantine)
    how = (
        f"up to {byzantine} of the {per_round} clients of a round"
        if sampling == "fixed"
        else f"up to {byzantine} in a round of about {per_round} clients (Poisson sampling: "
        "a round that holds more than the aggregator tolerates fails)"
    )
    log.warning(
        "attack %s: clients %s (%d of %d) are malicious; %s",
        type(attack).__name__, ", ".join(map(str, sorted(malicious))) or "none",
        len(malicious), num_clients, how,
    )  # fmt: skip
    flipped = tuple(sorted(malicious)) if attack.poisons_labels else ()
    return Adversary(attack, malicious, seed), flipped
