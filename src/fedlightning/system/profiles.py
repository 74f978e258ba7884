"""Each client's system profile: compute speed, link bandwidth, latency and availability windows
(docs/algorithms.md section 6.3), drawn from seeded distributions or read from a trace file.

A fit's duration (virtual seconds) is ``samples / speed + upload_bytes / bandwidth + latency``:
``samples`` the training samples the fit processed, ``upload_bytes`` what the communication meter
counts of its upload.

The trace is a CSV file with a header and one row per client: ``client`` (0 to N-1, each once),
``speed`` (samples/s), ``bandwidth`` (bytes/s), optionally ``latency`` (s, default 0) and
``windows``: the virtual-time intervals in which the client is available, ``start-end`` pairs
separated by ``;`` (empty: always available), e.g. ``0-3600;7200-10800``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedlightning.errors import ConfigurationError
from fedlightning.seeding import derive_seed
from fedlightning.system.distributions import Constant, Distribution

__all__ = ["ClientProfiles", "as_distribution", "read_trace"]


def as_distribution(value: float | Distribution) -> Distribution:
    """A number is a :class:`Constant`."""
    return value if isinstance(value, Distribution) else Constant(float(value))


@dataclass(frozen=True)
class ClientProfiles:
    """Per client ``i``: ``speed[i]`` samples/s, ``bandwidth[i]`` bytes/s, ``latency[i]`` s and
    ``windows[i]``, the ``(start, end)`` intervals of virtual time in which it is available
    (empty: always)."""

    speed: tuple[float, ...]
    bandwidth: tuple[float, ...]
    latency: tuple[float, ...]
    windows: tuple[tuple[tuple[float, float], ...], ...] = field(default=())

    @classmethod
    def draw(
        cls,
        seed: int,
        num_clients: int,
        speed: Distribution,
        bandwidth: Distribution,
        latency: Distribution,
    ) -> ClientProfiles:
        """One draw per client of each quantity, from generators seeded by ``(seed, "system",
        quantity)`` only (so adding a quantity never moves another's draws)."""
        drawn = []
        for quantity, distribution in (("speed", speed), ("bandwidth", bandwidth),
                                       ("latency", latency)):  # fmt: skip
            generator = torch.Generator().manual_seed(derive_seed(seed, "system", quantity))
            drawn.append(tuple(distribution.sample(generator, num_clients).tolist()))
        return cls(*drawn)

    def duration(self, client: int, samples: float, upload_bytes: int) -> float:
        """``samples / speed + upload_bytes / bandwidth + latency`` of ``client``'s fit."""
        return (
            samples / self.speed[client]
            + upload_bytes / self.bandwidth[client]
            + self.latency[client]
        )

    def available_at(self, client: int, time: float) -> bool:
        """Whether ``client`` is available at virtual ``time`` (``start <= time < end`` of one of
        its windows; always without windows)."""
        spans = self.windows[client] if self.windows else ()
        return not spans or any(start <= time < end for start, end in spans)

    def check(self, num_clients: int, where: str) -> None:
        """Refuse a profile with a speed or bandwidth not > 0, or a latency not >= 0."""
        for name, values, low in (("speed", self.speed, 0.0), ("bandwidth", self.bandwidth, 0.0)):
            bad = next((i for i, v in enumerate(values) if not v > low or math.isnan(v)), None)
            if bad is not None:
                raise ConfigurationError(
                    f"{where}: client {bad}'s {name} is {values[bad]!r}: a {name} must be > 0"
                )
        bad = next((i for i, v in enumerate(self.latency) if not v >= 0), None)
        if bad is not None:
            raise ConfigurationError(
                f"{where}: client {bad}'s latency is {self.latency[bad]!r}: it must be >= 0"
            )
        if len(self.speed) != num_clients:
            raise ConfigurationError(
                f"{where} gives {len(self.speed)} clients, the run has {num_clients}: give one "
                "row per client, 0 to N-1"
            )


def read_trace(path: str | Path) -> ClientProfiles:
    """The profiles of a trace file (module docstring); refuses, naming the row, a missing
    column, a client given twice or missing, and a value that is not a number."""
    where = f"SystemModel.trace={str(path)!r}"
    try:
        with open(path, newline="") as file:
            rows = list(csv.DictReader(file))
    except OSError as error:
        raise ConfigurationError(f"{where}: cannot read it ({error.strerror})") from None
    missing = {"client", "speed", "bandwidth"} - set(rows[0] if rows else {})
    if missing:
        raise ConfigurationError(
            f"{where} lacks the column(s) {sorted(missing)}: expected client, speed, bandwidth "
            "and optionally latency and windows"
        )
    by_client: dict[int, tuple[float, float, float, tuple[tuple[float, float], ...]]] = {}
    for line, row in enumerate(rows, start=2):
        try:
            client = int(row["client"])
            values = (float(row["speed"]), float(row["bandwidth"]), float(row.get("latency") or 0))
            windows = _windows(row.get("windows") or "")
        except ValueError as error:
            raise ConfigurationError(f"{where}, line {line}: {error}") from None
        if client in by_client:
            raise ConfigurationError(f"{where}, line {line}: client {client} is given twice")
        by_client[client] = (*values, windows)
    if sorted(by_client) != list(range(len(by_client))):
        raise ConfigurationError(f"{where}: the clients must be 0 to N-1, each once")
    rows_in_order = [by_client[i] for i in range(len(by_client))]
    return ClientProfiles(*(tuple(column) for column in zip(*rows_in_order, strict=True)))


def _windows(text: str) -> tuple[tuple[float, float], ...]:
    spans = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        start, _, end = part.partition("-")
        span = (float(start), float(end))
        if not span[0] < span[1]:
            raise ValueError(f"window {part!r} is empty: expected start-end with start < end")
        spans.append(span)
    return tuple(spans)
