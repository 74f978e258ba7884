"""The privacy options checked at a run's start-up, before anything is written
(docs/algorithms.md section 7)."""

from __future__ import annotations

from torch import nn

from fedlightning.privacy.dp_sgd import check_dp_sgd
from fedlightning.privacy.dp_statistic import private_release
from fedlightning.protocol import FitConfig
from fedlightning.server.base import Aggregator


def check_privacy(
    aggregator: Aggregator,
    model: nn.Module,
    config: FitConfig,
    trainer_reason: str | None,
    client_sampling: str,
    sampling_rate: float,
    rounds: int,
    min_clients: int,
) -> None:
    """An aggregator over the DP release (:class:`~fedlightning.privacy.ClientLevelDP`, or any
    with a :class:`~fedlightning.privacy.NoisedMean` statistic) takes the run's client sampling
    (Poisson, rate
    ``sampling_rate``, ``rounds``; ``target_epsilon`` is calibrated here); DP-SGD clients
    (``config.dp_sgd``) are checked by :func:`~fedlightning.privacy.dp_sgd.check_dp_sgd`.
    A ConfigurationError names the option."""
    release = private_release(aggregator)
    if release is not None:
        release.plan(client_sampling, sampling_rate, rounds, min_clients)
    if config.dp_sgd is not None:
        check_dp_sgd(model, config, trainer_reason)
