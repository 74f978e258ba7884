"""The differentially private mean as a server statistic: DP-FedAvg (McMahan, Ramage, Talwar and
Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018, arXiv:1710.06963)
with fixed or adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private
Learning with Adaptive Clipping", NeurIPS 2021, arXiv:1905.03871). docs/algorithms.md sections
2.8 and 7.1.

:class:`NoisedMean` is a statistic (:mod:`fedlightning.server.statistics.base`): any aggregator
built on FedAvg takes it, ``FedAvgM(weighting="uniform", statistic=NoisedMean(...))``, and its
server update (a server optimizer) then runs on the noised mean, which is post-processing.
:class:`~fedlightning.privacy.ClientLevelDP` is the preset that builds one around an inner
aggregator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch

from fedlightning.errors import ConfigurationError, require
from fedlightning.privacy import bounds
from fedlightning.privacy.accountant import (
    DEFAULT,
    LIBRARY,
    MECHANISMS,
    PrivacyAccountant,
    calibrate_noise,
)
from fedlightning.privacy.client_dp_inner import server_update_refusal
from fedlightning.privacy.client_dp_maths import (
    adaptive_clip_norm,
    clipped_sum,
    noised_mean,
    update_noise_multiplier,
)
from fedlightning.privacy.opacus_extra import require_accountant, require_opacus
from fedlightning.protocol import StateDict
from fedlightning.seeding import derive_seed
from fedlightning.server.functional import owner_counts
from fedlightning.server.statistics.base import Statistic, StatisticContext
from fedlightning.server.summation import wide_dtype

OPTION = "loop.aggregator.init_args."


class NoisedMean(Statistic):
    """Client-level DP's release of the mean (docs/algorithms.md section 7.1).

    Round t, with server model ``w``, the uploads ``w_i`` of the Poisson-sampled clients and
    ``u_i = w_i - w`` (parameters and float buffers, over the keys client i owns)::

        S     = sum_i u_i min(1, C_t / ||u_i||)                  (each update clipped to C_t)
        mean  = w + (S + N(0, (z_D C_t)^2 I)) / (q N_p)          (per key p, every floating key)

    ``q`` is the run's client sampling rate and ``N_p`` the number of clients owning key p: ``q
    N_p`` is the expected number of sampled owners, a fixed denominator (dividing by the number
    actually sampled would leak it). The server update sees no upload (``withholds_uploads``:
    ``server_round.uploads`` and ``.owners`` raise); every round is released, also one with no
    upload (``releases_every_round``). Integer buffers keep the server's value; ``running_var`` is
    clamped at 0.

    Fixed clipping: ``C_t = clip_norm`` and ``z_D = z``. Adaptive clipping (Andrew et al.,
    Algorithm 1): ``b~ = (sum_i ([||u_i|| <= C_t] - 1/2) + N(0, sigma_b^2)) / m + 1/2`` with
    ``m = q N``, ``C_{t+1} = C_t exp(-clip_learning_rate (b~ - target_quantile))``, starting at
    ``clip_norm``; ``z_D = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` so that the two releases together are
    one Gaussian mechanism with noise multiplier ``z`` (Theorem 1).

    Privacy: every round is one Poisson-subsampled Gaussian mechanism (noise multiplier ``z``,
    rate ``q``, sensitivity ``C_t`` of the sum over all keys, add/remove one client), composed by
    the ``accountant`` (docs/algorithms.md section 7.3). The noise is drawn on the server device
    from ``(seed, round)``: runs and resumes are reproducible, so the seed must stay secret in a
    deployment. ``target_epsilon`` (instead of ``noise_multiplier``) calibrates ``z`` once, in
    :meth:`plan`, for ``loop.rounds`` rounds with the same accountant
    (:func:`~fedlightning.privacy.accountant.calibrate_noise`); a resume must keep
    ``loop.rounds``. Start-up checks ``delta`` against the run's clients and that the accountant
    bounds the planned rounds (:func:`~fedlightning.privacy.checks.check_privacy`).

    State (declared): ``privacy_spent`` (the accountant's ``[z, q, rounds]`` history, never rolled
    back) and ``current_clip`` (``C_t`` of the next round).

    Args:
        noise_multiplier: z in [0.3, 1e6] (null: calibrated from ``target_epsilon``).
        target_epsilon: the epsilon to spend over ``loop.rounds`` rounds (null: ``z`` given).
        delta: delta in (0, 1 / num_clients) (checked against the run's clients at start-up).
        clip_norm: C in [1e-9, 1e9], the L2 norm each client's update is clipped to (adaptive:
            its start).
        adaptive_clipping: move C towards the ``target_quantile`` of the update norms.
        target_quantile: gamma in (0, 1), the fraction of updates left unclipped.
        clip_learning_rate: eta_C in (0, 10] of the geometric update.
        count_noise_std: sigma_b > z / 2, the std of the clipped count's noise (null: m / 20).
        accountant: ``pld`` (dp-accounting's PLD, the tightest: default), ``prv`` or ``rdp``
            (Opacus's PRVAccountant or RDPAccountant); docs/algorithms.md section 7.3.
    """

    owner_aware = True
    withholds_uploads = True
    releases_every_round = True
    #: what the last release used, for :meth:`round_metrics` only
    transient_attributes = frozenset({"last_round"})

    def __init__(
        self,
        noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        delta: float = 1e-5,
        clip_norm: float = 1.0,
        adaptive_clipping: bool = False,
        target_quantile: float = 0.5,
        clip_learning_rate: float = 0.2,
        count_noise_std: float | None = None,
        accountant: Literal["pld", "prv", "rdp"] = DEFAULT,
    ) -> None:
        require_opacus("client-level differential privacy (NoisedMean, ClientLevelDP)")
        check_options(noise_multiplier, target_epsilon, delta, clip_norm, target_quantile,
                      clip_learning_rate, count_noise_std, accountant)  # fmt: skip
        self.target_epsilon, self.delta, self.clip_norm = target_epsilon, delta, clip_norm
        self.noise_multiplier = noise_multiplier
        self.adaptive_clipping, self.target_quantile = adaptive_clipping, target_quantile
        self.clip_learning_rate, self.count_noise_std = clip_learning_rate, count_noise_std
        self.mechanism = accountant
        self.sampling_rate: float | None = None  # set by plan()
        self.rounds = 0
        self.add_state("privacy_spent", [], rollback=False)
        self.add_state("current_clip", float(clip_norm))
        self.last_round: dict[str, float] = {}
        self.denominators: dict[str, float] = {}
        self.update_noise = 0.0  # z_D

    # -- the run's plan ---------------------------------------------------------------------------
    def plan(
        self, client_sampling: str, sampling_rate: float, rounds: int, min_clients: int
    ) -> None:
        """Take the run's client sampling (start-up, before set-up): it must be Poisson sampling
        at rate ``q``, every round aggregates (``min_clients`` 1), and ``target_epsilon``
        calibrates ``z`` for ``rounds`` rounds at that rate."""
        require(
            client_sampling == "poisson", "loop.client_sampling", client_sampling,
            "'poisson' under ClientLevelDP: its accountant (the Poisson-subsampled Gaussian "
            "mechanism) assumes each client joins a round independently with probability q, "
            "which a fixed number of clients per round does not",
        )  # fmt: skip
        require(
            min_clients == 1, "loop.min_clients", min_clients,
            "1 under ClientLevelDP: every round releases the noised sum, also one where fewer "
            "clients succeeded (skipping it would reveal how many were sampled)",
        )  # fmt: skip
        require(0 < sampling_rate <= 1, "loop.clients_per_round", sampling_rate, "a rate in (0, 1]")
        self.sampling_rate, self.rounds = float(sampling_rate), rounds
        if self.target_epsilon is not None:
            self.noise_multiplier = calibrate_noise(
                self.target_epsilon, self.delta, self.sampling_rate, rounds, self.mechanism,
                option=OPTION + "target_epsilon",
            )  # fmt: skip

    @property
    def expected_clients(self) -> float:
        """m = q N, the expected number of clients per round."""
        return (self.sampling_rate or 0.0) * self.num_clients

    def on_setup(self, initial: StateDict) -> None:
        if self.sampling_rate is None:
            raise ConfigurationError(
                "ClientLevelDP needs the run's client sampling rate before setup: run it in a "
                "FederatedLoop with loop.client_sampling: poisson (or call plan() first)"
            )
        key_sets = None if self.client_keys is None else [ck.keys for ck in self.client_keys]
        floating = [k for k, v in initial.items() if v.is_floating_point()]
        owners = owner_counts(floating, key_sets, self.num_clients)
        self.denominators = {k: self.sampling_rate * owners[k] for k in floating}
        z = float(self.noise_multiplier)  # type: ignore[arg-type]
        self.update_noise = z
        if self.adaptive_clipping:
            sigma_b = self.count_noise_std or self.expected_clients / 20
            require(
                2 * sigma_b > z, OPTION + "count_noise_std", sigma_b,
                f"more than noise_multiplier / 2 = {z / 2:.4g} (Andrew et al., Theorem 1; the "
                "default is the expected clients per round / 20)",
            )  # fmt: skip
            self.update_noise = update_noise_multiplier(z, sigma_b)

    def check_aggregator(self, aggregator: Any) -> None:
        """Refuse an aggregator whose server update reads more than the released mean, or that
        weights clients by n_i (docs/algorithms.md section 7.1, "Which aggregators qualify")."""
        refusal = server_update_refusal(aggregator)
        if refusal is not None:
            raise ConfigurationError(
                f"loop.aggregator={type(aggregator).__name__!r} cannot run under client-level DP: "
                f"{refusal}"
            )

    # -- one round --------------------------------------------------------------------------------
    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        """The round's differentially private mean (class docstring)."""
        model, clip = context.model, self.current_clip
        device = next(iter(model.values())).device
        generator = torch.Generator(device=device)
        generator.manual_seed(derive_seed(context.seed, "client-dp", context.index))
        total, unclipped = clipped_sum(model, uploads, clip)
        self.last_round = {"dp_clip_norm": clip}
        if self.adaptive_clipping:
            sigma_b = self.count_noise_std or self.expected_clients / 20
            count_noise = torch.randn((), generator=generator, device=device,
                                      dtype=wide_dtype(device)) * sigma_b  # fmt: skip
            self.current_clip, fraction = adaptive_clip_norm(
                clip, float(unclipped), len(uploads), float(count_noise), self.expected_clients,
                self.target_quantile, self.clip_learning_rate,
            )  # fmt: skip
            self.last_round["dp_unclipped_fraction"] = fraction
        mean = noised_mean(model, total, self.update_noise * clip, self.denominators, generator)
        accountant = self.accountant
        accountant.step(float(self.noise_multiplier or 0.0), float(self.sampling_rate or 0.0))
        self.privacy_spent = accountant.history
        return mean

    @property
    def accountant(self) -> PrivacyAccountant:
        """The composition of the rounds released so far (from ``privacy_spent``)."""
        return PrivacyAccountant(self.mechanism, self.privacy_spent)

    def epsilon(self) -> float:
        """The epsilon spent so far at ``delta``."""
        return self.accountant.epsilon(self.delta)

    def round_metrics(self) -> dict[str, float]:
        return {
            "dp_epsilon": self.epsilon(), "dp_delta": self.delta,
            "dp_noise_multiplier": float(self.noise_multiplier or 0.0), **self.last_round,
        }  # fmt: skip

    def summary_line(self) -> str:
        """The run's client-level privacy in one line (the run summary's)."""
        return (
            f"privacy: client-level (epsilon={self.epsilon():.4g}, delta={self.delta:g}) after "
            f"{self.accountant.steps} round(s): Poisson q={self.sampling_rate:.4g}, noise "
            f"multiplier {self.noise_multiplier:.4g}, {self.mechanism} accountant "
            f"({LIBRARY[self.mechanism]})"
        )

    def on_load_state(self, state: dict[str, Any]) -> None:
        """Refuse a checkpoint whose rounds used another noise multiplier than this run's (with
        ``target_epsilon``, z is calibrated for ``loop.rounds``)."""
        used = {float(z) for z, _, _ in state["privacy_spent"]}
        stored = next(iter(used - {self.noise_multiplier}), None)
        if stored is not None:
            raise ConfigurationError(
                f"the checkpoint's ClientLevelDP rounds used noise multiplier {stored:.6g}, this "
                f"run's is {self.noise_multiplier:.6g} (target_epsilon={self.target_epsilon} "
                f"calibrates it for loop.rounds={self.rounds}): resume with the loop.rounds the "
                "checkpoint's run was planned for, or start a new run"
            )


def private_release(aggregator: object) -> NoisedMean | None:
    """The DP release ``aggregator`` combines its uploads by: its statistic's, or that of the
    aggregator it wraps (``inner``), at any depth; ``None`` without one."""
    while aggregator is not None:
        statistic = getattr(aggregator, "statistic", None)
        if isinstance(statistic, NoisedMean):
            return statistic
        aggregator = getattr(aggregator, "inner", None)
    return None


def check_options(
    noise_multiplier: float | None, target_epsilon: float | None, delta: float, clip_norm: float,
    target_quantile: float, clip_learning_rate: float, count_noise_std: float | None,
    accountant: str,
) -> None:  # fmt: skip
    """Refuse the release's options in one line naming the option."""
    if (noise_multiplier is None) == (target_epsilon is None):
        raise ConfigurationError(
            f"{OPTION}noise_multiplier={noise_multiplier!r} and target_epsilon="
            f"{target_epsilon!r}: set exactly one of them (z, or the epsilon to calibrate z for)"
        )
    positive = "a finite number > 0"
    if noise_multiplier is not None:
        bounds.require_noise_multiplier(OPTION + "noise_multiplier", noise_multiplier)
    if target_epsilon is not None:
        require(_positive(target_epsilon), OPTION + "target_epsilon", target_epsilon, positive)
    require(0 < delta < 1, OPTION + "delta", delta, "a number in (0, 1)")
    bounds.require_clip_norm(OPTION + "clip_norm", clip_norm)
    require(0 < target_quantile < 1, OPTION + "target_quantile", target_quantile,
            "a number in (0, 1)")  # fmt: skip
    bounds.require_clip_learning_rate(OPTION + "clip_learning_rate", clip_learning_rate)
    require(count_noise_std is None or _positive(count_noise_std),
            OPTION + "count_noise_std", count_noise_std, f"null or {positive}")  # fmt: skip
    require(accountant in MECHANISMS, OPTION + "accountant", accountant,
            " or ".join(map(repr, MECHANISMS)))  # fmt: skip
    require_accountant(accountant, f"{OPTION}accountant={accountant!r}")


def _positive(value: float) -> bool:
    return value > 0 and math.isfinite(value)
