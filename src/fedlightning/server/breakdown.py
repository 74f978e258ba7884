"""Breakdown points: how many malicious uploads f among n a robust rule tolerates
(docs/algorithms.md section 8, "Breakdown points").

Start-up hands every aggregator the run's clients per round ``n`` and the most malicious clients
any round of the run holds ``f`` (:meth:`fedlightning.server.base.Aggregator.check_byzantine`);
the checks here raise a :class:`~fedlightning.errors.ConfigurationError` naming the option when f
is beyond the rule's breakdown point, before anything is trained or written.
"""

from __future__ import annotations

from fedlightning.errors import ConfigurationError

#: the option an attack's size comes from, named in every refusal
ATTACK = "loop.attack"


def _refuse(rule: str, per_round: int, byzantine: int, needs: str, fix: str) -> None:
    raise ConfigurationError(
        f"{rule} cannot tolerate the attack of {ATTACK}: a round of this run can hold "
        f"f={byzantine} malicious of its n={per_round} clients, and {rule} needs {needs}; {fix}"
    )


def require_honest_majority(rule: str, per_round: int, byzantine: int) -> None:
    """``2 f < n``: the breakdown point 1/2 of the coordinate-wise median (Yin et al., ICML 2018),
    the geometric median (Pillutla et al., IEEE TSP 2022), centered clipping and norm bounding; no
    rule that treats clients alike survives a malicious majority.

    >>> require_honest_majority("median", 10, 4)
    >>> require_honest_majority("median", 10, 5)
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigurationError: median cannot tolerate ...
    """
    if 2 * byzantine >= per_round:
        _refuse(rule, per_round, byzantine, "2f < n (an honest majority)",
                "lower loop.attack.init_args.fraction or raise loop.clients_per_round")  # fmt: skip


def require_trimmed(option: str, beta: float, per_round: int, byzantine: int) -> None:
    """``floor(beta n) >= f``: the trimmed mean cuts at least f values at each end (Yin et al.,
    ICML 2018, arXiv:1803.01498, Theorem 4 takes ``beta >= alpha``, the malicious fraction)."""
    if int(beta * per_round) < byzantine:
        _refuse(
            f"the trimmed mean with {option}={beta}", per_round, byzantine,
            f"floor({option} * n) >= f", f"set {option} >= {byzantine / per_round:.3g}",
        )  # fmt: skip


def require_krum(rule: str, per_round: int, byzantine: int, assumed: str | None = None) -> None:
    """``n > 2 f + 2`` (Blanchard et al., NeurIPS 2017, arXiv:1703.02757, Proposition 1).
    ``assumed``: the option that set f (Krum's own ``byzantine``), named instead of the attack.

    >>> require_krum("Krum", 4, 5, assumed="loop.aggregator.init_args.byzantine")
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigurationError: Krum cannot assume loop.aggregator.init_args.byzantine=5 ...
    """
    if per_round > 2 * byzantine + 2:
        return
    if assumed is None:
        _refuse(rule, per_round, byzantine, "n > 2f + 2",
                "lower loop.attack.init_args.fraction or raise loop.clients_per_round")  # fmt: skip
    raise ConfigurationError(
        f"{rule} cannot assume {assumed}={byzantine} malicious uploads: a round of this run holds "
        f"n={per_round} clients, and {rule} needs n > 2f + 2; lower {assumed} (null adopts "
        f"{ATTACK}'s, 0 without one) or raise loop.clients_per_round to at least {2 * byzantine + 3}"
    )


def require_bulyan(rule: str, per_round: int, byzantine: int) -> None:
    """``n >= 4 f + 3`` (El Mhamdi, Guerraoui, Rouault, ICML 2018, arXiv:1802.07927, section 4:
    Bulyan's selection keeps ``n - 2f`` uploads and averages ``n - 4f`` of them per coordinate).

    >>> require_bulyan("Bulyan", 23, 5)
    >>> require_bulyan("Bulyan", 22, 5)
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigurationError: Bulyan cannot tolerate ...
    """
    if per_round < 4 * byzantine + 3:
        _refuse(rule, per_round, byzantine, "n >= 4f + 3",
                "lower loop.attack.init_args.fraction or raise loop.clients_per_round")  # fmt: skip
