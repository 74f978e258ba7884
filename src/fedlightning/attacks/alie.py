""" "A little is enough": Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses
For Distributed Learning", NeurIPS 2019, arXiv:1902.06156 (Algorithm 3). docs/algorithms.md
section 8.1."""

from __future__ import annotations

from typing import Literal

from fedlightning.attacks.base import PREFIX, Attack, AttackRound
from fedlightning.attacks.maths import alie_update, alie_z
from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict
from fedlightning.server.summation import wide


class ALIE(Attack):
    """Every malicious upload becomes the same shifted mean of the round's updates
    ``u_j = w_j - w``, per coordinate (:func:`~fedlightning.attacks.maths.alie_update`):

    - ``space="gradient"`` (the default): ``w + mu + z sigma``, i.e. the attackers send
      ``mu_g - z sigma_g`` of the pseudo-gradients ``g_j = w - w_j``, the direction of the
      reference code of Karimireddy, He and Jaggi (``epfml/byzantine-robust-noniid-optimizer``,
      ``codes/attacks/alittle.py``: its workers send gradients and the server steps
      ``x - lr * aggregate``) and of the gradient-space implementations of Baruch et al.'s
      attack;
    - ``space="update"``: ``w + mu - z sigma``, ``mu - z sigma`` of the updates: the opposite
      direction (the library's former default).

    ``mu`` and ``sigma`` are the per-coordinate mean and sample standard deviation of the
    round's updates as trained: every sampled client's under ``variant="all"`` (the malicious
    clients trained honestly on their own data too: the omniscient form of Baruch et al.'s
    estimate), the honest clients' only under ``variant="honest"`` (the reference code's).
    ``z`` is the paper's, from the round's ``n`` uploads and ``m`` malicious ones
    (:func:`~fedlightning.attacks.maths.alie_z`; under ``honest`` a quantile among the ``n - m``
    honest workers, as the reference code computes it: 0.157 against 0.385 at n = 20 with 4
    attackers), unless set. ``variant="honest"`` with the default ``space`` is the attack of the
    tables of Karimireddy, He and Jaggi (ICLR 2022, arXiv:2006.09365).

    Each coordinate stays within ``z`` standard deviations of the honest mean, inside what
    coordinate-wise and distance-based defenses accept, and all malicious uploads agree, so they
    pull the robust statistic the same way every round (docs/algorithms.md section 8.1).

    Args:
        fraction, clients: the malicious clients (:class:`~fedlightning.attacks.base.Attack`).
        z: the deviation in standard deviations, >= 0; ``null``: the paper's formula per round
            (start-up then refuses a round with a malicious majority, where it has no value).
        variant: ``all`` (statistics and z over every sampled upload) or ``honest``.
        space: ``gradient`` (``w + mu + z sigma``) or ``update`` (``w + mu - z sigma``).
    """

    def __init__(
        self,
        fraction: float = 0.0,
        clients: list[int] | None = None,
        z: float | None = None,
        variant: Literal["all", "honest"] = "all",
        space: Literal["gradient", "update"] = "gradient",
    ) -> None:
        super().__init__(fraction, clients)
        require(z is None or z >= 0, f"{PREFIX}.z", z, "null or a number >= 0")
        require(variant in ("all", "honest"), f"{PREFIX}.variant", variant, "'all' or 'honest'")
        require(space in ("gradient", "update"), f"{PREFIX}.space", space,
                "'gradient' (w + mu + z sigma) or 'update' (w + mu - z sigma)")  # fmt: skip
        self.z = z
        self.variant = variant
        self.space = space

    def check_round(self, per_round: int, byzantine: int) -> None:
        if self.z is None and 2 * byzantine > per_round:
            raise ConfigurationError(
                f"loop.attack=ALIE with {PREFIX}.z=null takes z from the honest supporters the "
                f"attackers need, but a round of this run can hold {byzantine} malicious of "
                f"{per_round} clients, a majority that needs none: set {PREFIX}.z"
            )

    def corrupt(self, attack_round: AttackRound) -> list[StateDict]:
        uploads, references = attack_round.uploads, attack_round.references
        count = sum(attack_round.malicious)
        if count == 0:
            return [u.weights for u in uploads]
        z = self.z if self.z is not None else alie_z(len(uploads), count, self.variant)
        updates = [
            {k: wide(v) - wide(ref[k]) for k, v in u.weights.items() if v.is_floating_point()}
            for u, ref, bad in zip(uploads, references, attack_round.malicious, strict=True)
            if self.variant == "all" or not bad
        ]
        if not updates:  # no honest upload this round: nothing to hide among
            updates = [{k: wide(v) - wide(v) for k, v in r.items() if v.is_floating_point()}
                       for r in references]  # fmt: skip
        shift = alie_update(updates, z, self.space)
        return [
            {
                k: (wide(ref[k]) + shift[k]).to(v.dtype) if v.is_floating_point() else v
                for k, v in upload.weights.items()
            }
            if bad
            else upload.weights
            for upload, ref, bad in zip(uploads, references, attack_round.malicious, strict=True)
        ]
