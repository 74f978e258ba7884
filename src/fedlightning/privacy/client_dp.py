"""Client-level differential privacy on the server, the preset: DP-FedAvg (McMahan, Ramage,
Talwar and Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018,
arXiv:1710.06963) with fixed or adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy,
"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021, arXiv:1905.03871).
docs/algorithms.md section 7.1.

The release is a statistic, :class:`~fedlightning.privacy.dp_statistic.NoisedMean`;
:class:`ClientLevelDP` builds the inner aggregator's class with its options over that statistic
(``FedAvgM(..., statistic=NoisedMean(...))``), so the inner's server update (a server optimizer)
runs on the noised mean, which is post-processing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from fedlightning.errors import ConfigurationError
from fedlightning.privacy.accountant import DEFAULT, PrivacyAccountant
from fedlightning.privacy.client_dp_inner import inner_refusal
from fedlightning.privacy.dp_statistic import NoisedMean
from fedlightning.privacy.opacus_extra import require_opacus
from fedlightning.protocol import StateDict, Upload
from fedlightning.recorded_args import recorded_init_args
from fedlightning.server import FedAvg
from fedlightning.server.base import Aggregator
from fedlightning.server.wrapping import WrappingAggregator

OPTION = "loop.aggregator.init_args."


class ClientLevelDP(WrappingAggregator):
    """Client-level DP for an aggregator built on the owner-aware mean (docs/algorithms.md 7.1):
    the inner aggregator (its class and options) with the DP release
    :class:`~fedlightning.privacy.dp_statistic.NoisedMean` as its statistic; the release's
    options are this preset's. A preset: ``ClientLevelDP(inner=FedAvgM(weighting="uniform"),
    noise_multiplier=1.0)`` is ``FedAvgM(weighting="uniform",
    statistic=NoisedMean(noise_multiplier=1.0))``, declared state included (under ``inner``).

    The loop must sample clients by Poisson sampling (``loop.client_sampling: poisson``) and
    releases every round; the loop reports ``dp_epsilon`` at ``delta`` after every evaluated
    round and in the run's summary (:meth:`summary_line`).

    Args:
        inner: the aggregator whose mean is privatised: FedAvg (default
            ``FedAvg(weighting="uniform")``), FedAvgM, FedAdam, with ``weighting: uniform`` and
            the plain mean (``aggregation: mean``, ``clip_norm: null``); ``within_groups``
            allowed. FedNova, Scaffold, FedCross, InCo and the robust statistics are refused.
        noise_multiplier, target_epsilon, delta, clip_norm, adaptive_clipping, target_quantile,
            clip_learning_rate, count_noise_std, accountant: the release's
            (:class:`~fedlightning.privacy.dp_statistic.NoisedMean`: ``accountant`` ``pld``, the
            default, ``prv`` or ``rdp``; ``delta`` below 1 / num_clients).
    """

    def __init__(
        self,
        inner: Aggregator | None = None,
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
        require_opacus("loop.aggregator=ClientLevelDP (client-level differential privacy)")
        inner = FedAvg(weighting="uniform") if inner is None else inner
        refusal = inner_refusal(inner)
        if refusal is not None:
            raise ConfigurationError(
                f"{OPTION}inner={type(inner).__name__!r} cannot run under client-level DP: "
                f"{refusal}"
            )
        release = NoisedMean(
            noise_multiplier, target_epsilon, delta, clip_norm, adaptive_clipping,
            target_quantile, clip_learning_rate, count_noise_std, accountant,
        )  # fmt: skip
        self.inner: FedAvg = _over(inner, release)  # type: ignore[arg-type]

    @property
    def statistic(self) -> NoisedMean:
        """The release (the inner aggregator's statistic)."""
        return self.inner.statistic  # type: ignore[return-value]

    def plan(
        self, client_sampling: str, sampling_rate: float, rounds: int, min_clients: int
    ) -> None:
        """The release's :meth:`~fedlightning.privacy.dp_statistic.NoisedMean.plan`."""
        self.statistic.plan(client_sampling, sampling_rate, rounds, min_clients)

    def on_setup(self, initial: StateDict) -> None:
        self.inner.setup(
            initial, self.num_clients, self.seed, self.client_keys, parameters=self.parameters
        )

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        self.inner.aggregate(round_index, uploads)

    def round_metrics(self) -> dict[str, float]:
        return self.inner.round_metrics()

    @property
    def accountant(self) -> PrivacyAccountant:
        """The composition of the rounds released so far."""
        return self.statistic.accountant

    def epsilon(self) -> float:
        """The epsilon spent so far at ``delta``."""
        return self.statistic.epsilon()

    def summary_line(self) -> str:
        """The run's client-level privacy in one line (the run summary's)."""
        return self.statistic.summary_line()


def _over(inner: FedAvg, release: NoisedMean) -> FedAvg:
    """A new aggregator of ``inner``'s class and constructor arguments, over ``release``."""
    args = recorded_init_args(inner)
    if args is None or any(k.startswith("*") for k in args) or "statistic" not in args:
        raise ConfigurationError(
            f"{OPTION}inner={type(inner).__name__!r} takes no statistic argument: give its "
            "__init__ a 'statistic' parameter passed to FedAvg (or **kwargs)"
        )
    return type(inner)(**{**args, "statistic": release})
