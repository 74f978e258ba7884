"""Seeds derived from (seed, round, client id): results never depend on execution order."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of ``parts`` (e.g. ``(seed, "fit", round, client)``).

    Hashing rather than arithmetic keeps seeds of neighbouring rounds and clients unrelated.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
