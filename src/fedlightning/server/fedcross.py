"""FedCross: Hu et al., "FedCross: Towards Accurate Federated Learning via Multi-Model
Cross-Aggregation", ICDE 2024, arXiv:2210.08285 (docs/algorithms.md section 2.2).

The maths are pure functions over state_dicts in :mod:`fedlightning.server.fedcross_maths`
(re-exported here): :func:`similarity_matrix`, :func:`select_collaborators`,
:func:`propeller_collaborators`, :func:`cross_mix` and :func:`dynamic_alpha`. :class:`FedCross`
only holds the K middleware models across rounds and applies the schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.seeding import derive_seed
from fedlightning.server.base import Aggregator
from fedlightning.server.fedcross_maths import (
    Selection,
    SimilarityMeasure,
    cross_mix,
    dynamic_alpha,
    layer_groups,
    propeller_collaborators,
    select_collaborators,
    similarity_matrix,
)
from fedlightning.server.fedcross_options import check_fedcross_options
from fedlightning.server.functional import (
    clone_state,
    parameter_keys,
    uniform_average,
    weighted_average,
)

__all__ = [
    "FedCross", "cross_mix", "dynamic_alpha", "layer_groups", "parameter_keys",
    "propeller_collaborators", "select_collaborators", "similarity_matrix",
]  # fmt: skip


# -- the aggregator ---------------------------------------------------------------------------------
class FedCross(Aggregator):
    """Multi-model cross aggregation: K middleware models, each trained by one client per round.

    FedCross overrides ``aggregate`` instead of the ``server_update`` hook of
    :class:`~fedlightning.server.fedavg.FedAvg` (docs/algorithms.md section 2.6): there is no
    single mean to update, each of the K middleware models is mixed with its collaborators'
    trained models. Its state is the list of the K models, declared (``add_state("models", [])``:
    empty until the first round or :meth:`set_initial_states`); K is its length.

    Round r: the K sampled clients are shuffled (from ``(seed, "fedcross-shuffle", r)``, never the
    global RNG) and the i-th receives middleware model ``W[i]`` (``Payload.model_index = i``), so
    communication equals FedAvg's. With ``v_i`` the model trained from ``W[i]``, all i at once::

        W[i] <- alpha_r * v_i + (1 - alpha_r) * v_co(i)                      (plain FedCross)
        W[i] <- alpha_r * v_i + (1 - alpha_r)/2 * (v_p1(i) + v_p2(i))        (propeller rounds)

    with ``co(i)`` from :func:`select_collaborators` on :func:`similarity_matrix` of the trained
    models and ``p1, p2`` from :func:`propeller_collaborators`. ``alpha_r = alpha`` except in the
    dynamic-alpha rounds ``[a, b)``, where ``alpha_r = min(alpha, alpha_start + r * alpha_step)``
    with the absolute round r (``alpha_ramp="absolute"``, the spec: one ramp continuous over the
    whole schedule) or ``min(alpha, alpha_start + (r - a) * alpha_step)``
    (``alpha_ramp="range_start"``: the ramp restarts at ``a``, so "w/ PM-DA" with a late R1 still
    ramps; with the absolute ramp and the defaults, alpha reaches 0.99 at r = 98). The deployable global model is the uniform mean of the K
    middleware models; it never trains. Rounds ``r < first_stage_bound`` are a FedAvg warm-up: the
    uploads' sample-weighted mean (as the authors' code) replaces every middleware model.

    The paper's acceleration variants (section 3.2.4) as options, R1 < R2:

    =========  ==========================================================
    w/ PM      ``propeller_rounds: R1``
    w/ DA      ``dynamic_alpha_rounds: [0, R1]``
    w/ PM-DA   ``propeller_rounds: R1``, ``dynamic_alpha_rounds: [R1, R2]``
    =========  ==========================================================

    Ranges may overlap (propellers with the ramped alpha); the warm-up takes precedence.

    Failed clients: when fewer than K uploads arrive, a middleware model whose client failed keeps
    its weights and is nobody's collaborator this round; the K' trained models choose collaborators
    among themselves as if K were K' (``in_order`` and propellers on the ring of the K' trained
    indices). A single trained model takes its trained weights (no collaborator exists).

    All middleware models start from the one ``initial`` state the loop gives :meth:`setup`, or,
    with ``independent_init=True`` (Algorithm 1 line 2), from K independent initialisations: the
    loop asks :meth:`initial_states_needed` and feeds :meth:`set_initial_states` with K fresh
    initialisations of the model, the i-th seeded from ``derive_seed(seed, "initial-state", i)``
    (:func:`fedlightning.loop.initial_states.independent_states`).

    Args:
        alpha: the own model's share ``alpha`` in ``[0.5, 1.0)``; the paper's default 0.99.
        selection: collaborator rule: ``lowest_similarity`` (default, the paper's best),
            ``highest_similarity`` or ``in_order``.
        similarity: ``cosine`` over all float parameters (the paper) or ``layerwise`` (the authors'
            code: sum over layers of each layer's (weight, bias) cosine), over the model's
            trainable parameters (normalisation running statistics and counters are left out).
        num_models: K; ``null`` takes the number of clients sampled in the first round. It must
            equal the loop's clients per round (one model per sampled client).
        first_stage_bound: rounds of FedAvg warm-up (authors' code; 0 = none).
        propeller_rounds: rounds ``r < propeller_rounds`` use two propeller collaborators.
        dynamic_alpha_rounds: ``[a, b]``: rounds ``a <= r < b`` use the dynamic-alpha ramp.
        alpha_ramp: ``absolute`` (default, the spec: ``r`` counts from round 0) or
            ``range_start`` (``r - a``: the ramp restarts where its range starts).
        independent_init: K independently initialised middleware models instead of K copies.
        alpha_start: the ramp's first value, in ``[0.5, alpha]``.
        alpha_step: the ramp's increase per round (> 0).
        evaluate_middleware: also evaluate every middleware model (metrics ``middleware_<i>/...``).
    """

    #: the round's client -> model assignment (configure_round to aggregate) and the cached mean
    transient_attributes = frozenset({"_assignment", "_global"})

    def __init__(
        self,
        alpha: float = 0.99,
        selection: Selection = "lowest_similarity",
        similarity: SimilarityMeasure = "cosine",
        num_models: int | None = None,
        first_stage_bound: int = 0,
        propeller_rounds: int = 0,
        dynamic_alpha_rounds: tuple[int, int] | None = None,
        alpha_start: float = 0.5,
        alpha_step: float = 0.005,
        evaluate_middleware: bool = False,
        alpha_ramp: Literal["absolute", "range_start"] = "absolute",
        independent_init: bool = False,
    ) -> None:
        super().__init__()
        dynamic_alpha_rounds = check_fedcross_options(
            alpha, selection, similarity, num_models, first_stage_bound, propeller_rounds,
            dynamic_alpha_rounds, alpha_start, alpha_step, alpha_ramp,
        )  # fmt: skip
        self.alpha_ramp = alpha_ramp
        self.independent_init = independent_init
        self.alpha = alpha
        self.selection = selection
        self.similarity = similarity
        self.num_models = num_models
        self.first_stage_bound = first_stage_bound
        self.propeller_rounds = propeller_rounds
        self.dynamic_alpha_rounds = dynamic_alpha_rounds
        self.alpha_start = alpha_start
        self.alpha_step = alpha_step
        self.evaluate_middleware = evaluate_middleware
        self.initial: StateDict = {}
        self.models: list[StateDict] = []
        self.add_state("models", [])
        self._assignment: dict[int, int] = {}
        self._global: StateDict | None = None

    @property
    def k(self) -> int | None:
        """K: the number of middleware models (``num_models``, or the clients of the first round
        when it is null; ``None`` until then)."""
        return len(self.models) if self.models else self.num_models

    # -- schedule -------------------------------------------------------------------------------
    def alpha_at(self, round_index: int) -> float:
        """``alpha_r``: the ramp inside ``dynamic_alpha_rounds``, ``alpha`` elsewhere."""
        if self.dynamic_alpha_rounds is not None:
            start, end = self.dynamic_alpha_rounds
            if start <= round_index < end:
                t = round_index if self.alpha_ramp == "absolute" else round_index - start
                return dynamic_alpha(t, self.alpha_start, self.alpha_step, self.alpha)
        return self.alpha

    def uses_propellers(self, round_index: int) -> bool:
        return round_index < self.propeller_rounds

    def is_warmup(self, round_index: int) -> bool:
        return round_index < self.first_stage_bound

    # -- the contract ---------------------------------------------------------------------------
    def on_setup(self, initial: StateDict) -> None:
        partial = [g for g, keys in self.group_keys().items() if keys != set(initial)]
        if partial:
            raise ConfigurationError(
                f"FedCross's middleware models are whole models, but client groups {partial} own "
                "only part of the server model: FedCross needs every client to train the whole "
                "model (one architecture); use FedAvg or InCo for heterogeneous clients"
            )
        self.initial = clone_state(initial)
        self._assignment = {}
        self._global = None

    def initial_states_needed(self, clients_per_round: int) -> int:
        """K independent initial states when ``independent_init``, else none."""
        if not self.independent_init:
            return 0
        return self.num_models if self.num_models is not None else clients_per_round

    def set_initial_states(self, states: Sequence[StateDict]) -> None:
        """Start middleware model i from ``states[i]`` (K = ``len(states)``)."""
        for state in states:
            if set(state) != set(self.initial):
                raise ConfigurationError(
                    "FedCross independent initial states must have the server model's keys"
                )
        self.models = [clone_state(state) for state in states]
        self._global = None

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        k = self.k
        if k is None:
            require(len(client_ids) >= 2, "FedCross num_models", len(client_ids),
                    "at least 2 clients per round (K >= 2)")  # fmt: skip
            k = len(client_ids)
        if len(client_ids) != k:
            raise ConfigurationError(
                f"FedCross num_models={k} but {len(client_ids)} clients are sampled per round: "
                f"each middleware model is trained by one sampled client, so set loop.clients_per_round "
                f"to {k} (or leave num_models null)"
            )
        if not self.models:
            # identical initial models share one read-only dict: nothing ever updates in place
            self.models = [self.initial] * k
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "fedcross-shuffle", round_index))
        order = torch.randperm(k, generator=gen).tolist()
        self._assignment = {client_ids[j]: i for i, j in enumerate(order)}
        return {cid: Payload(self.models[i], model_index=i) for cid, i in self._assignment.items()}

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        if not uploads:
            return
        uploads = sorted(uploads, key=lambda u: u.model_index)
        indices = [u.model_index for u in uploads]
        if len(set(indices)) != len(indices) or not all(0 <= i < len(self.models) for i in indices):
            raise ValueError(
                f"FedCross needs distinct model indices in [0, {len(self.models)}), got {indices}"
            )
        for upload in uploads:
            expected = self._assignment.get(upload.client_id, upload.model_index)
            if upload.model_index != expected:
                raise ValueError(
                    f"client {upload.client_id} uploaded model {upload.model_index} but was sent model {expected}"
                )
        trained = [u.weights for u in uploads]
        self._global = None
        if self.is_warmup(round_index):
            mean = weighted_average(trained, [float(u.num_samples) for u in uploads])
            self.models = [mean] * len(self.models)
            return
        if len(trained) == 1:
            self.models[indices[0]] = clone_state(trained[0])
            return
        alpha = self.alpha_at(round_index)
        if self.uses_propellers(round_index):
            partners = [list(pair) for pair in propeller_collaborators(len(trained), round_index)]
        else:
            sim = (
                torch.zeros(len(trained), len(trained))  # in_order reads only K
                if self.selection == "in_order"
                else similarity_matrix(trained, self.similarity, self._parameter_order())
            )
            partners = [[c] for c in select_collaborators(sim, round_index, self.selection)]
        mixed = [
            cross_mix(trained[a], [trained[c] for c in partners[a]], alpha)
            for a in range(len(trained))
        ]
        for a, i in enumerate(indices):
            self.models[i] = mixed[a]

    def _parameter_order(self) -> list[str]:
        """The trainable parameters (the model's, :meth:`setup`), in the state's order."""
        return [k for k in self.initial if k in self.parameters]

    def global_state(self) -> StateDict:
        if not self.models:
            return self.initial
        if self._global is None:
            self._global = uniform_average(self.models)
        return self._global

    def deployables(self) -> dict[str, StateDict]:
        out = super().deployables()
        if self.evaluate_middleware:
            out.update({f"middleware_{i}": w for i, w in enumerate(self.models)})
        return out

    def on_load_state(self, state: dict[str, Any]) -> None:
        """Refuse a checkpoint holding another number of middleware models than ``num_models``."""
        held = len(state["models"])
        if self.num_models is not None and held not in (0, self.num_models):
            raise ConfigurationError(
                f"FedCross num_models={self.num_models} but the checkpoint holds {held} "
                f"middleware models: resume with the same num_models"
            )
