"""The privacy options checked at a run's start-up against the run itself, before anything is
written (docs/algorithms.md section 7.4): delta below one over the protected population, the noise
calibrated for the planned rounds, and the epsilon the planned steps spend computable and finite.
The options' own ranges are checked when they are constructed
(:mod:`~fedlightning.privacy.bounds`)."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from fedlightning.errors import ConfigurationError
from fedlightning.privacy.accountant import PrivacyAccountant
from fedlightning.privacy.bounds import require_delta
from fedlightning.privacy.dp_sgd import DPSGD, check_dp_sgd, fit_plan
from fedlightning.privacy.dp_statistic import private_release
from fedlightning.protocol import FitConfig
from fedlightning.server.base import Aggregator

CLIENT_LEVEL = "loop.aggregator.init_args."
SAMPLE_LEVEL = "loop.dp_sgd.init_args."


def check_privacy(
    aggregator: Aggregator,
    model: nn.Module,
    config: FitConfig,
    trainer_reason: str | None,
    client_sampling: str,
    sampling_rate: float,
    rounds: int,
    min_clients: int,
    datamodule: Any,
) -> None:
    """An aggregator over the DP release (:class:`~fedlightning.privacy.ClientLevelDP`, or any
    with a :class:`~fedlightning.privacy.NoisedMean` statistic) takes the run's client sampling
    (Poisson, rate ``sampling_rate``, ``rounds``; ``target_epsilon`` is calibrated here), the
    release's delta must be below 1 / N over the ``datamodule``'s N clients, and its accountant
    must bound the ``rounds`` planned rounds by a finite epsilon. DP-SGD clients
    (``config.dp_sgd``) are checked by :func:`~fedlightning.privacy.dp_sgd.check_dp_sgd`, their
    delta against the run's training samples, and their accountant on the plans of the clients
    with the fewest and the most samples. A ConfigurationError names the option."""
    release = private_release(aggregator)
    if release is not None:
        require_delta(CLIENT_LEVEL + "delta", release.delta, datamodule.num_clients, "clients")
        release.plan(client_sampling, sampling_rate, rounds, min_clients)
        plan = [(release.noise_multiplier, release.sampling_rate, rounds)]
        check_accountable(CLIENT_LEVEL, release.mechanism, plan, release.delta)
    if config.dp_sgd is not None:
        check_dp_sgd(model, config, trainer_reason)
        options = DPSGD(**config.dp_sgd)
        sizes = [datamodule.client_num_samples(i) for i in range(datamodule.num_clients)]
        require_delta(SAMPLE_LEVEL + "delta", options.delta, sum(sizes), "training samples")
        for size in {min(sizes), max(sizes)}:
            rate, steps = fit_plan(math.ceil(size / datamodule.batch_size), config)
            plan = [(options.noise_multiplier, rate, steps * rounds)]
            check_accountable(SAMPLE_LEVEL, options.accountant, plan, options.delta)


def check_accountable(
    option: str, mechanism: str, plan: list[tuple[float, float, int]], delta: float
) -> None:
    """Refuse a run whose planned composition ``plan`` (``(z, q, steps)``: every step the run may
    take) the accountant ``mechanism`` cannot bound by a finite epsilon at ``delta``: one line
    naming ``option``'s accountant and what failed. Epsilon grows with the steps, so every
    epsilon the run then reports is finite too; the value is cached for the run's last report."""
    try:
        epsilon = PrivacyAccountant(mechanism, plan).epsilon(delta)
        failure = None if math.isfinite(epsilon) else f"epsilon is {epsilon}"
    except (ArithmeticError, MemoryError, ValueError, RuntimeError) as error:
        failure = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    if failure is not None:
        z, q, steps = plan[0]
        raise ConfigurationError(
            f"{option}accountant={mechanism!r} cannot bound this run's privacy ({failure}) for "
            f"{steps} step(s) at noise multiplier {z:g}, q={q:.4g}, delta={delta:g}: use another "
            "accountant ('pld', 'prv', 'rdp'), more noise, fewer steps or a larger delta"
        )
