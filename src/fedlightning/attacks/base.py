"""The Attack contract: which clients are malicious, and what they do (docs/algorithms.md section
8.1).

An attack is the loop option ``loop.attack`` (``class_path`` and ``init_args``, like the
aggregator); its constructor arguments are part of the run's identity. It marks a seeded
``fraction`` of the clients (or an explicit list ``clients``) as malicious, once per run
(:meth:`Attack.malicious_clients`). Then either

- the malicious clients train on poisoned data (:class:`~fedlightning.attacks.LabelFlip`): the
  clients travel in :attr:`fedlightning.protocol.FitConfig.label_flip_clients`, so every
  backend's fit (sequential, cohort, a Ray actor, a Flower SuperNode) reads their flipped labels;
- or they train honestly and their uploads are replaced after the fits, on the server, before
  aggregation (:meth:`Attack.corrupt`): one place for every backend, so every backend gives the
  same malicious uploads. Randomness comes from ``(seed, round, client)``, never the global RNG.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict, Upload
from fedlightning.recorded_args import RecordsInitArgs
from fedlightning.seeding import derive_seed

PREFIX = "loop.attack.init_args"


@dataclass(frozen=True, eq=False)
class AttackRound:
    """One round as an attack receives it (read-only: build new tensors).

    Attributes:
        index: the round, 0-based.
        seed: the run's seed (randomness derives from ``(seed, index, client)``).
        uploads: the round's successful uploads, in sampling order, as trained.
        references: per upload, the weights its client received (its payload's, restricted to
            the keys it uploaded): ``w`` in ``u_i = w_i - w``.
        malicious: per upload, whether its client is malicious.
    """

    index: int
    seed: int
    uploads: tuple[Upload, ...]
    references: tuple[StateDict, ...]
    malicious: tuple[bool, ...]


class Attack(RecordsInitArgs, ABC):
    """Base of the Byzantine attacks.

    The malicious set is ``clients`` when given, else ``round(fraction * N)`` clients (halves
    rounded up) drawn without replacement from a generator seeded by the run's seed only, so the
    same clients are malicious in every round and on every backend.

    Args:
        fraction: the share of the N clients that is malicious, in [0, 1).
        clients: the malicious clients' ids instead (each in [0, N), no repeats).
    """

    #: the malicious clients train on poisoned labels (data side) instead of corrupting uploads
    poisons_labels: ClassVar[bool] = False
    #: the attributes the attack keeps across rounds (what the mimic attack has learnt): its
    #: state, checkpointed with the run and restored on resume (:meth:`state_dict`); none by
    #: default, since most attacks are functions of their round
    state_attributes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, fraction: float = 0.0, clients: list[int] | None = None) -> None:
        require(0.0 <= fraction < 1.0, f"{PREFIX}.fraction", fraction, "a number in [0, 1)")
        if clients is not None:
            require(fraction == 0.0, f"{PREFIX}.clients", clients,
                    f"null when {PREFIX}.fraction is set (give one of the two)")  # fmt: skip
            require(len(set(clients)) == len(clients), f"{PREFIX}.clients", clients,
                    "distinct client ids")  # fmt: skip
        self.fraction = fraction
        self.clients = None if clients is None else tuple(int(c) for c in clients)

    def malicious_clients(self, num_clients: int, seed: int) -> tuple[int, ...]:
        """The malicious clients among ``num_clients``, sorted (see the class docstring)."""
        if self.clients is not None:
            unknown = [c for c in self.clients if not 0 <= c < num_clients]
            require(not unknown, f"{PREFIX}.clients", list(self.clients),
                    f"client ids in [0, {num_clients}) (unknown: {unknown})")  # fmt: skip
            return tuple(sorted(self.clients))
        count = math.floor(self.fraction * num_clients + 0.5)
        if self.fraction > 0 and count == 0:
            raise ConfigurationError(
                f"{PREFIX}.fraction={self.fraction} of {num_clients} clients makes no malicious "
                f"client: use a fraction >= {0.5 / num_clients:.3g} or list {PREFIX}.clients"
            )
        generator = torch.Generator().manual_seed(derive_seed(seed, "malicious"))
        return tuple(sorted(torch.randperm(num_clients, generator=generator)[:count].tolist()))

    def check_round(self, per_round: int, byzantine: int) -> None:  # noqa: B027 (optional)
        """Refuse (ConfigurationError naming the option) an attack that cannot be formed when a
        round of ``per_round`` clients holds up to ``byzantine`` malicious ones; nothing by
        default."""

    @abstractmethod
    def corrupt(self, attack_round: AttackRound) -> list[StateDict]:
        """The weights each upload of the round carries to the aggregator: a malicious upload's
        replaced, an honest one's as uploaded."""

    def state_dict(self) -> dict[str, Any]:
        """Copies of the :attr:`state_attributes`, for a checkpoint."""
        return {name: copy.deepcopy(getattr(self, name)) for name in self.state_attributes}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (``{}``: a checkpoint of a run without the attack's
        state keeps the initial values)."""
        for name in self.state_attributes:
            if name in state:
                setattr(self, name, copy.deepcopy(state[name]))


class UploadAttack(Attack):
    """An attack that replaces each malicious upload on its own (:meth:`corrupt_upload`)."""

    def corrupt(self, attack_round: AttackRound) -> list[StateDict]:
        rows = zip(attack_round.uploads, attack_round.references, attack_round.malicious,
                   strict=True)  # fmt: skip
        return [
            self.corrupt_upload(attack_round, upload, reference) if bad else upload.weights
            for upload, reference, bad in rows
        ]

    @abstractmethod
    def corrupt_upload(
        self, attack_round: AttackRound, upload: Upload, ref: StateDict
    ) -> StateDict:
        """The weights malicious ``upload`` carries instead of its own (``ref``: the weights its
        client received)."""
