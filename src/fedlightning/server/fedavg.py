"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, arXiv:1602.05629 (Algorithm 1); owner-aware for clients that own different
sub-state_dicts as in HeteroFL (Diao et al., ICLR 2021, arXiv:2010.01264) and the InCo paper's
HeteroAvg (Chan et al., ICLR 2024, arXiv:2308.11464). docs/algorithms.md sections 2.1 and 2.3."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.server.base import Aggregator, ClientKeyList, ClientKeys, group_keys, restrict
from fedlightning.server.round import ServerRound, Withheld, merge_update
from fedlightning.server.statistics import Mean, Median, StatisticContext, TrimmedMean
from fedlightning.server.statistics.base import Statistic, check_statistic, setup_statistic
from fedlightning.server.statistics.contract import check_combined

AGGREGATIONS = ("mean", "median", "trimmed_mean")
#: joins a group's name and a key in the server state of ``within_groups`` (model keys hold dots)
GROUP_SEPARATOR = "/"


class FedAvg(Aggregator):
    """Federated averaging of the uploaded models, per key over the uploads that own it.

    Per key p with sampled owners O_p: ``w_p <- sum_{i in O_p} q_i w_{i,p}``,
    ``q_i = n_i / sum_{j in O_p} n_j`` (``weighting="samples"``) or ``1/|O_p|`` (``"uniform"``),
    i.e. ``w_p += sum_i q_i (w_{i,p} - w_p)``; a key no sampled client owns is unchanged. With
    homogeneous clients (every client owns every key) this is McMahan et al.'s
    ``w <- sum_{i in S} p_i w_i``. Integer buffers come from the first owner, BatchNorm
    ``running_var`` is clamped to >= 0. Each client receives the sub-state_dict of its own keys.

    ``aggregate`` is the template of every server update (docs/algorithms.md sections 2.6 and
    2.8): the injected **statistic** combines the uploads,
    ``mean = statistic.combine(states, weights, context)`` (:mod:`fedlightning.server.statistics`:
    the owner-aware mean by default, a robust rule, the DP noised mean, any
    :class:`~fedlightning.server.statistics.Statistic` subclass), then the one hook :meth:`server_update` receives the round
    (:class:`~fedlightning.server.round.ServerRound`: the combination, per-key owner counts, the
    uploads, which keys are parameters) and returns new values for parameter keys; buffers
    (BatchNorm statistics, counters) take the combination unless a subclass sets
    ``updates_buffers``. FedAvg's update is the combination itself. So a server optimizer
    (FedAvgM, FedAdam) composes with any statistic with no new class. State kept across rounds is
    declared with :meth:`~fedlightning.server.base.Aggregator.add_state` (FedAvg's: ``weights``;
    the statistic's own under ``statistic``).

    Computed on the device of the server state and the uploads (the loop's server device): the
    mean accumulates in float64, or as a compensated float32 sum on a device without float64
    (docs/algorithms.md section 2.1, "Where and how exactly the server computes").

    Robust options (shorthands for a statistic; homogeneous clients only, but the clipped mean):
    ``clip_norm`` first clips each client's update ``u_i = w_i - w`` to ``||u_i|| <= clip_norm``
    (one flat L2 norm over all floating entries); ``aggregation`` then replaces the weighted mean
    by the coordinate-wise ``median`` or the coordinate-wise ``trimmed_mean`` that drops the
    ``floor(trim_beta * K)`` largest and smallest values (Yin et al., ICML 2018,
    arXiv:1803.01498): ``Median(clip_norm)``, ``TrimmedMean(trim_beta, clip_norm)``,
    ``Mean(clip_norm)``. Both robust statistics are unweighted.

    ``within_groups`` (the InCo paper's baseline, Table 2: "FedAvg only aggregates gradients from
    the models sharing the same architectures"): each client group keeps its own model, averaged
    only over its own group's uploads (shared key names never mix across groups); payloads and
    deployables are each group's model, ``"global"`` the group's model with the most keys. It is
    a change of key space (the server state holds ``<group>/<key>``), so every subclass keeps its
    own rule (SCAFFOLD's ``c``, a server optimizer's state) per group.

    Args:
        weighting: ``samples`` (by n_i, the paper) or ``uniform``.
        aggregation: ``mean`` (FedAvg), ``median`` or ``trimmed_mean``.
        trim_beta: fraction trimmed at each end by ``trimmed_mean``, in [0, 0.5).
        clip_norm: if set (> 0), the largest L2 norm of a client update.
        within_groups: one model per client group, no sharing across groups.
        statistic: what combines the uploads (null: from ``aggregation``, ``trim_beta`` and
            ``clip_norm``; given, those keep their defaults).
    """

    #: whether :meth:`server_update`'s values for buffer keys (BatchNorm statistics, counters)
    #: are used; by default buffers always take the mean
    updates_buffers: bool = False

    def __init__(
        self,
        weighting: Literal["samples", "uniform"] = "samples",
        aggregation: Literal["mean", "median", "trimmed_mean"] = "mean",
        trim_beta: float = 0.1,
        clip_norm: float | None = None,
        within_groups: bool = False,
        statistic: Statistic | None = None,
    ) -> None:
        if weighting not in ("samples", "uniform"):
            raise ConfigurationError(
                f"FedAvg weighting must be 'samples' or 'uniform', got {weighting!r}"
            )
        if aggregation not in AGGREGATIONS:
            raise ConfigurationError(
                f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}"
            )
        if not 0 <= trim_beta < 0.5:
            raise ConfigurationError(f"trim_beta must lie in [0, 0.5), got {trim_beta}")
        if clip_norm is not None and not clip_norm > 0:
            raise ConfigurationError(f"clip_norm must be > 0 or null, got {clip_norm}")
        self.weighting = weighting
        self.aggregation = aggregation
        self.trim_beta = trim_beta
        self.clip_norm = clip_norm
        self.within_groups = within_groups
        if statistic is not None and (aggregation != "mean" or clip_norm is not None):
            raise ConfigurationError(
                f"loop.aggregator.init_args.statistic is set, and so is aggregation="
                f"{aggregation!r} / clip_norm={clip_norm!r}: give the statistic alone (they are "
                "its shorthands)"
            )
        self.statistic: Statistic = (
            check_statistic(statistic)
            if statistic is not None
            else _from_options(aggregation, trim_beta, clip_norm)
        )
        self.weights: StateDict = {}  # the server model (see add_state)
        self.add_state("weights", "model")

    # -- setup and payloads ---------------------------------------------------------------------
    def server_key_space(
        self, initial: StateDict, client_keys: ClientKeyList, parameters: frozenset[str]
    ) -> tuple[StateDict, ClientKeyList, frozenset[str]]:
        """``within_groups``: each group's keys (and parameters) as ``<group>/<key>``."""
        if not (self.within_groups and client_keys is not None):
            return initial, client_keys, parameters
        groups = group_keys(client_keys)
        initial = {
            _join(g, k): v for g, keys in groups.items() for k, v in initial.items() if k in keys
        }
        owned = {g: frozenset(_join(g, k) for k in keys) for g, keys in groups.items()}
        client_keys = [ClientKeys(g, owned[g]) for g, _ in client_keys]
        parameters = frozenset(
            _join(g, k) for g, keys in groups.items() for k in parameters if k in keys
        )
        return initial, client_keys, parameters

    def on_setup(self, initial: StateDict) -> None:
        """Set the statistic up (its declared state; a statistic that is not ``owner_aware``
        refuses clients owning different keys) and let it refuse this aggregator
        (``check_aggregator``: the DP release refuses a server update that reads uploads)."""
        setup_statistic(self.statistic, initial, self.parameters, self.num_clients, self.seed,
                        self.client_keys, self.is_heterogeneous())  # fmt: skip
        self.statistic.check_aggregator(self)

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        """The statistic's breakdown point (docs/algorithms.md section 8, "Breakdown points"):
        the median and clipping need an honest majority, the trimmed mean
        ``floor(trim_beta * n) >= f``, Krum ``n > 2f + 2``; the plain mean checks nothing (the
        baseline)."""
        self.statistic.check_byzantine(per_round, byzantine)

    def check_round_byzantine(self, uploads: int, byzantine: int) -> None:
        """The statistic's test of one round (``check_round_byzantine``: its ``check_byzantine``
        by default), so Krum tests the round against the f it adopted at start-up."""
        self.statistic.check_round_byzantine(uploads, byzantine)

    @property
    def releases_every_round(self) -> bool:  # type: ignore[override]
        """Whether every round must be aggregated, also one with no upload (the statistic's: the
        DP release, docs/algorithms.md section 7.1)."""
        return self.statistic.releases_every_round

    def round_metrics(self) -> dict[str, float]:
        """The statistic's numbers of the last round (e.g. ``weiszfeld_iterations``)."""
        return dict(self.statistic.round_metrics())

    @property
    def grouped(self) -> bool:
        """Whether the server state holds one model per client group (``within_groups``)."""
        return self.within_groups and self.client_keys is not None

    def payload(self, keys: frozenset[str] | None) -> Payload:
        """The payload for clients owning ``keys`` (server key space; ``None``: every key)."""
        return Payload(restrict(self.weights, keys))

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        make = (lambda keys: _ungroup_payload(self.payload(keys))) if self.grouped else self.payload
        return self.payloads(client_ids, make)

    # -- aggregation: the template --------------------------------------------------------------
    def client_weights(self, uploads: Sequence[Upload]) -> list[float]:
        """q_i before normalisation: n_i or 1."""
        return [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in uploads]

    def server_update(self, server_round: ServerRound) -> StateDict:
        """The extension hook: new values for parameter keys of ``server_round.mean``, computed
        from the round and the current (pre-round) ``self.weights``. Keys it leaves out take the
        mean; values for buffer keys are ignored unless ``updates_buffers``; keys no upload owns
        stay unchanged. FedAvg takes the mean itself (``{}``)."""
        return {}

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        if self.grouped:
            uploads = [self._group_upload(u) for u in uploads]
        context = StatisticContext(round_index, self.seed, self.weights)
        states = [u.weights for u in uploads]
        combined = self.statistic.combine(states, self.client_weights(uploads), context)
        mean = check_combined(self.statistic, combined, states, self.weights, round_index)
        if self.statistic.withholds_uploads:
            withheld = Withheld(type(self).__name__)
            server_round = ServerRound(round_index, mean, withheld, withheld, self.parameters)  # type: ignore[arg-type]
        else:
            server_round = ServerRound.of(round_index, mean, uploads, self.parameters)
        update = self.server_update(server_round)
        new = merge_update(server_round, update, self.updates_buffers, type(self).__name__)
        self.weights = {**self.weights, **new}

    # -- state ----------------------------------------------------------------------------------
    def group_models(self) -> dict[str, StateDict]:
        """Each client group's own model (``within_groups``; empty otherwise)."""
        if not self.grouped:
            return {}
        return {g: _ungroup(restrict(self.weights, keys)) for g, keys in self.group_keys().items()}

    def global_state(self) -> StateDict:
        if self.grouped:
            return max(self.group_models().values(), key=len)
        return self.weights

    def deployables(self) -> dict[str, StateDict]:
        if self.grouped:
            models = self.group_models()
            return {"global": max(models.values(), key=len), **models}
        return super().deployables()

    def _group_upload(self, upload: Upload) -> Upload:
        group = self.client_keys[upload.client_id].group  # type: ignore[index]
        return dataclasses.replace(
            upload,
            weights={_join(group, k): v for k, v in upload.weights.items()},
            extras={
                name: {_join(group, k): v for k, v in value.items()}
                if isinstance(value, dict)
                else value
                for name, value in upload.extras.items()
            },
        )


def _from_options(aggregation: str, trim_beta: float, clip_norm: float | None) -> Statistic:
    """The statistic FedAvg's shorthand options name, named after them in messages."""
    path = "loop.aggregator.init_args"
    if aggregation == "median":
        return Median(clip_norm).named(f"{path}.aggregation='median'", path)
    if aggregation == "trimmed_mean":
        return TrimmedMean(trim_beta, clip_norm).named(f"{path}.aggregation='trimmed_mean'", path)
    option = f"{path}.clip_norm={clip_norm!r}" if clip_norm is not None else f"{path}.aggregation"
    return Mean(clip_norm).named(option, path)


# within_groups' key space: state_dict-valued extras (SCAFFOLD's c, delta_c) are keyed like the model
def _join(group: str, key: str) -> str:
    return f"{group}{GROUP_SEPARATOR}{key}"


def _ungroup(state: StateDict) -> StateDict:
    return {k.split(GROUP_SEPARATOR, 1)[1]: v for k, v in state.items()}


def _ungroup_payload(payload: Payload) -> Payload:
    extras = {k: _ungroup(v) if isinstance(v, dict) else v for k, v in payload.extras.items()}
    return dataclasses.replace(payload, weights=_ungroup(payload.weights), extras=extras)
