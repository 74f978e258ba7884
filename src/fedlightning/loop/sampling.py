"""Which clients take part in a round: a function of ``(seed, round)`` only."""

from __future__ import annotations

import math

import torch

from fedlightning.errors import ConfigurationError
from fedlightning.seeding import derive_seed


def sample_clients(seed: int, round_index: int, num_clients: int, per_round: int) -> list[int]:
    """The clients of round ``round_index``: ``per_round`` distinct ids drawn uniformly without
    replacement from a generator seeded by ``(seed, round_index)`` only, in draw order."""
    gen = torch.Generator().manual_seed(derive_seed(seed, "sample", round_index))
    return torch.randperm(num_clients, generator=gen)[:per_round].tolist()


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
