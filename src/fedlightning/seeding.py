"""Seeds derived from (seed, round, client id): results never depend on execution order; and the
rounds' client draws (:func:`sample_clients`, :func:`poisson_sample_clients`), functions of
``(seed, round)`` only."""

from __future__ import annotations

import functools
import hashlib
import random

import numpy as np
import torch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of ``parts`` (e.g. ``(seed, "fit", round, client)``).

    Hashing rather than arithmetic keeps seeds of neighbouring rounds and clients unrelated.

    >>> derive_seed(0, "fit", 3, 7)
    1995699019845030951
    >>> derive_seed(0, "fit", 3, 7) == derive_seed(0, "fit", 3, 7)  # no hidden state
    True
    >>> derive_seed(0, "fit", 3, 8) == derive_seed(0, "fit", 3, 7)
    False
    >>> 0 <= derive_seed("any", "parts") < 2**63
    True
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seed_fit(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (CPU, and CUDA where present) with
    ``seed mod 2**32`` before one client fit: the generator states of Lightning's
    ``seed_everything`` without its per-call cost (environment variables, logging, a stack trace
    captured per device for lazy CUDA seeding), which shows when a run makes thousands of small fits.
    """
    seed %= 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)
    if _cuda_available():
        torch.cuda.manual_seed_all(seed)


@functools.cache
def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once: it loads NVML through ctypes on every call."""
    return torch.cuda.is_available()


def sample_clients(seed: int, round_index: int, num_clients: int, per_round: int) -> list[int]:
    """The clients of round ``round_index``: ``per_round`` distinct ids drawn uniformly without
    replacement from a generator seeded by ``(seed, round_index)`` only, in draw order."""
    gen = torch.Generator().manual_seed(derive_seed(seed, "sample", round_index))
    return torch.randperm(num_clients, generator=gen)[:per_round].tolist()


def poisson_sample_clients(seed: int, round_index: int, num_clients: int, rate: float) -> list[int]:
    """The clients of round ``round_index`` under Poisson sampling: each of the ``num_clients``
    independently with probability ``rate`` (one uniform draw per client, in float64, from a
    generator seeded by ``(seed, round_index)`` only), in increasing order; possibly none.

    >>> poisson_sample_clients(0, 3, 10, 1.0)
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> poisson_sample_clients(0, 3, 10, 0.5) == poisson_sample_clients(0, 3, 10, 0.5)
    True
    """
    gen = torch.Generator().manual_seed(derive_seed(seed, "poisson-sample", round_index))
    draws = torch.rand(num_clients, generator=gen, dtype=torch.float64)
    return (draws < rate).nonzero().flatten().tolist()
