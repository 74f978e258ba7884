"""What a statistic's ``combine`` must return, checked every round before the server folds it in
(docs/algorithms.md section 2.8, "The server statistic"): a dict holding every key some upload
owns (a key left out would keep its value for ever: that layer never trains) and no key the
server model does not have, each a torch tensor of the server entry's shape, kind (floating or
integer) and device. A violation stops the run with a
:class:`~fedlightning.errors.PluginError` naming the statistic, the round, the key, what came and
what was expected; the server state is untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedlightning.errors import PluginError
from fedlightning.protocol import StateDict
from fedlightning.server.round import describe
from fedlightning.server.statistics.base import Statistic


def statistic_name(statistic: Statistic) -> str:
    """The statistic as configured (:attr:`Statistic.option`):
    ``loop.aggregator.init_args.statistic=MyMedian``, or a preset's ``loop.aggregator=Krum``."""
    option = statistic.option
    return option if "=" in option else f"{option}={type(statistic).__name__}"


def check_combined(
    statistic: Statistic,
    combined: object,
    uploads: Sequence[StateDict],
    model: StateDict,
    round_index: int,
) -> StateDict:
    """``combined``, the value ``statistic.combine`` returned for ``uploads`` in round
    ``round_index`` (0-based) over the server ``model``, once it is checked (module docstring)."""
    where = f"{statistic_name(statistic)}: combine (round {round_index + 1})"
    if not isinstance(combined, Mapping):
        raise PluginError(
            f"{where} returned {describe(combined)}: return a dict of torch tensors, one per key "
            "some upload owns"
        )
    for key, value in combined.items():
        if key not in model:
            raise PluginError(
                f"{where} returned {key!r}, which the server model does not have: return only "
                "keys of the uploads"
            )
        if not _like(value, model[key]):
            raise PluginError(
                f"{where} returned {key!r} as {describe(value)}, but the server model holds "
                f"{describe(model[key])}: return a torch tensor like the uploads' (e.g. "
                f"torch.as_tensor(value, dtype=upload[{key!r}].dtype, "
                f"device=upload[{key!r}].device))"
            )
    missing = [key for key in model if key not in combined and any(key in u for u in uploads)]
    if missing:
        owners = sum(missing[0] in u for u in uploads)
        raise PluginError(
            f"{where} left out {len(missing)} key(s) the uploads own, first {missing[0]!r} "
            f"({owners} of the {len(uploads)} uploads own it): that entry would never train; "
            "return the combined value of every key some upload owns"
        )
    return combined if isinstance(combined, dict) else dict(combined)


def _like(value: object, reference: torch.Tensor) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.shape == reference.shape
        and value.is_floating_point() == reference.is_floating_point()
        and value.device == reference.device
    )
