"""Seeds derived from (seed, round, client id): results never depend on execution order."""

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
