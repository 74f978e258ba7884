"""What a server update sees of one round: :class:`ServerRound` (docs/algorithms.md section 2.6).

:meth:`fedlightning.server.fedavg.FedAvg.aggregate` builds one per round and hands it to the one
extension hook, ``server_update(round) -> StateDict``; :func:`merge_update` then folds what the
hook returned into the server state: its values for the parameter keys it returns, the mean for
every other key some upload owns (BatchNorm statistics and counters are not gradient iterates: a
server optimizer applied to them can drive ``running_var`` negative), and nothing for the keys no
upload owns this round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from fedlightning.errors import ConfigurationError, PluginError
from fedlightning.protocol import StateDict, Upload


@dataclass(frozen=True, eq=False)
class ServerRound:
    """One round as the server update hook receives it (read-only: build new tensors).

    Attributes:
        index: the round, 0-based.
        mean: the owner-aware combination of the keys this round's uploads own: per key, the
            (sample- or uniformly) weighted mean over the uploads that own it, or the robust
            statistic after clipping (``FedAvg``'s ``aggregation``/``clip_norm``); keys no upload
            owns are absent.
        owners: per key of ``mean``, how many of this round's uploads own it.
        uploads: the round's successful uploads in sampling order, in the aggregator's key space
            (``<group>/<key>`` with ``within_groups``).
        parameters: every key of the server state that is a trainable parameter (from the model,
            :meth:`fedlightning.clients.ClientModule.server_parameter_names`); the other entries
            are buffers (BatchNorm statistics, ``num_batches_tracked``).
    """

    index: int
    mean: StateDict
    owners: Mapping[str, int]
    uploads: tuple[Upload, ...]
    parameters: frozenset[str]

    @classmethod
    def of(
        cls, index: int, mean: StateDict, uploads: Sequence[Upload], parameters: frozenset[str]
    ) -> ServerRound:
        """The round of ``uploads`` whose combination is ``mean`` (owners counted here)."""
        owners = {key: sum(key in u.weights for u in uploads) for key in mean}
        return cls(index, mean, owners, tuple(uploads), parameters)

    @property
    def parameter_keys(self) -> tuple[str, ...]:
        """The keys of ``mean`` that are trainable parameters, in ``mean``'s order: what a server
        optimizer steps."""
        return tuple(k for k in self.mean if k in self.parameters)

    @property
    def buffer_keys(self) -> tuple[str, ...]:
        """The keys of ``mean`` that are buffers (normalisation statistics, counters): they take
        the mean."""
        return tuple(k for k in self.mean if k not in self.parameters)


def merge_update(
    server_round: ServerRound, update: StateDict, updates_buffers: bool, aggregator: str
) -> StateDict:
    """The new values of the keys this round owns: ``update``'s for the parameter keys it returns
    (and for buffer keys when ``updates_buffers``; otherwise a returned buffer value is ignored),
    ``server_round.mean``'s for every other key of the mean.

    What the hook returns is checked before anything is folded in (docs/algorithms.md section
    2.6): a mapping; no key that no upload owns this round (the state would silently change key
    set); per key, a torch tensor of the mean's shape, dtype and device. A violation is a
    :class:`~fedlightning.errors.PluginError` naming ``aggregator``, the round, the key, what
    came and what was expected; the server state is untouched.
    """
    where = f"{aggregator}.server_update (round {server_round.index + 1})"
    if not isinstance(update, Mapping):
        raise PluginError(
            f"{where} returned {describe(update)}: expected a dict of tensors keyed like "
            "server_round.mean"
        )
    for key, value in update.items():
        mean = server_round.mean.get(key)
        if mean is None:
            raise PluginError(
                f"{where} returned {key!r}, which no upload owns in round "
                f"{server_round.index + 1}: return values only for keys of server_round.mean "
                "(unowned keys stay unchanged)"
            )
        if not _like(value, mean):
            raise PluginError(
                f"{where} returned {key!r} as {describe(value)}, but the server state holds "
                f"{describe(mean)}: return a tensor like server_round.mean[{key!r}]"
            )
    out = dict(server_round.mean)
    for key, value in update.items():
        if updates_buffers or key in server_round.parameters:
            out[key] = value
    return out


class Withheld:
    """What a server update may not read under a statistic that ``withholds_uploads`` (the DP
    release, docs/algorithms.md section 7.1): ``server_round.uploads`` and ``.owners``; any access
    raises a ConfigurationError naming the aggregator."""

    def __init__(self, aggregator: str) -> None:
        self.aggregator = aggregator

    def _refuse(self, *_: Any) -> NoReturn:
        raise ConfigurationError(
            f"{self.aggregator}.server_update reads the round's individual uploads (or their "
            "owner counts), which ClientLevelDP withholds: a DP round releases only the noised "
            "mean (docs/algorithms.md section 7.1); use an aggregator whose server update reads "
            "only server_round.mean"
        )

    __getitem__ = __iter__ = __len__ = __contains__ = get = keys = values = items = _refuse


def _like(value: object, mean: torch.Tensor) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.shape == mean.shape
        and value.dtype == mean.dtype
        and value.device == mean.device
    )


def describe(value: object) -> str:
    """What ``value`` is, in words that tell torch from numpy: ``a torch.Tensor of dtype
    torch.float32, shape (32, 64), on cpu``; ``a numpy.ndarray of dtype numpy.float32, shape
    (32, 64)``; ``a builtins.list``.

    >>> describe(torch.zeros(2, 3))
    'a torch.Tensor of dtype torch.float32, shape (2, 3), on cpu'
    """
    if isinstance(value, torch.Tensor):
        return (
            f"a torch.Tensor of dtype {value.dtype}, shape {tuple(value.shape)}, on {value.device}"
        )
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if dtype is not None and shape is not None:  # numpy and other array libraries
        module = kind.__module__.split(".")[0]
        return f"a {module}.{kind.__qualname__} of dtype {module}.{dtype}, shape {tuple(shape)}"
    return f"a {name}"
