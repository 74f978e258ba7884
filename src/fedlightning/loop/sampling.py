"""Which clients take part in a round: a function of ``(seed, round)`` only.

Two rules (``loop.client_sampling``): ``fixed`` draws ``clients_per_round`` distinct clients
uniformly without replacement; ``poisson`` takes each client independently with probability
``q`` (so the number varies from round to round, and may be 0), the sampling Opacus's accountants
assume for client-level differential privacy (docs/algorithms.md section 7.1). The two draws
live in :mod:`fedlightning.seeding` (beside the run's other seeded draws, below every layer that
samples: the loop and the asynchronous servers).
"""

from __future__ import annotations

import math

from fedlightning.errors import ConfigurationError, require
from fedlightning.seeding import poisson_sample_clients, sample_clients
from fedlightning.server.base import Aggregator
from fedlightning.server.fedcross import FedCross

__all__ = ["SAMPLINGS", "poisson_sample_clients", "round_clients", "sample_clients"]

#: the values of ``loop.client_sampling``
SAMPLINGS = ("fixed", "poisson")


def round_clients(
    sampling: str, seed: int, round_index: int, num_clients: int, per_round: int, rate: float
) -> list[int]:
    """The clients of round ``round_index`` by the rule ``sampling`` (``fixed``: ``per_round`` of
    them; ``poisson``: each with probability ``rate``)."""
    if sampling == "poisson":
        return poisson_sample_clients(seed, round_index, num_clients, rate)
    return sample_clients(seed, round_index, num_clients, per_round)


def sampling_rate(value: int | float, num_clients: int) -> float:
    """q, the probability that a given client takes part in a round: ``clients_per_round / N`` for
    an integer, the fraction itself for a float (``fixed`` sampling: K / N; ``poisson``: the rate
    each client is drawn with)."""
    return value / num_clients if isinstance(value, int) else float(value)


def check_sampling(sampling: str, aggregator: Aggregator) -> None:
    """Raise a ConfigurationError unless ``sampling`` is a known rule that ``aggregator`` serves
    (FedCross trains exactly ``clients_per_round`` middleware models a round)."""
    require(sampling in SAMPLINGS, "loop.client_sampling", sampling, "'fixed' or 'poisson'")
    if sampling == "poisson" and isinstance(aggregator, FedCross):
        raise ConfigurationError(
            f"loop.client_sampling='poisson' draws a varying number of clients a round, but "
            f"{type(aggregator).__name__} needs exactly clients_per_round of them: use 'fixed'"
        )


def clients_per_round(value: int | float, num_clients: int, min_clients: int) -> int:
    """K from ``loop.clients_per_round`` (an int, or a fraction of N rounded up), checked against
    ``num_clients`` and ``loop.min_clients``."""
    per_round = math.ceil(value * num_clients) if isinstance(value, float) else value
    if per_round > num_clients:
        raise ConfigurationError(
            f"clients_per_round={value} exceeds num_clients={num_clients}: choose at most {num_clients}"
        )
    if min_clients > per_round:
        raise ConfigurationError(
            f"min_clients={min_clients} exceeds clients_per_round={per_round}: choose at most {per_round}"
        )
    return per_round
