"""Pairing rules, checked at start-up before anything is written: an objective and an aggregator
must send and receive what the other needs, and the objective must train in the run's precision."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlightning.errors import ConfigurationError

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.server.base import Aggregator


def check_pairing(model: ClientModule, aggregator: Aggregator, precision: str) -> None:
    """Refuse a client objective and aggregator that do not fit each other, or a precision
    the objective cannot train with."""
    model.check_precision(precision)
    agg, objective = type(aggregator).__name__, type(model).__name__
    missing = model.required_payload_extras - aggregator.payload_extras
    if missing:
        raise ConfigurationError(
            f"client objective {objective} needs {sorted(missing)} from the server, which aggregator "
            f"{agg} does not send: pair it with its own aggregator"
        )
    weighting = getattr(aggregator, "weighting", None)
    if model.required_weighting is not None and weighting not in (None, model.required_weighting):
        raise ConfigurationError(
            f"client objective {objective} needs its uploads averaged with weighting="
            f"{model.required_weighting!r}, but aggregator {agg} has weighting={weighting!r}: "
            f"set loop.aggregator.init_args.weighting: {model.required_weighting}"
        )
    missing = aggregator.required_upload_extras - model.upload_extras
    if missing:
        raise ConfigurationError(
            f"aggregator {agg} needs {sorted(missing)} in each upload, which client objective "
            f"{objective} does not produce: pair it with its own client objective"
        )
