"""FedCross: Hu et al., "FedCross: Towards Accurate Federated Learning via Multi-Model
Cross-Aggregation", ICDE 2024, arXiv:2210.08285 (docs/algorithms.md section 2.2).

The maths are pure functions over state_dicts, tested on hand-made tensors:
:func:`similarity_matrix`, :func:`select_collaborators`, :func:`propeller_collaborators`,
:func:`cross_mix` and :func:`dynamic_alpha`. :class:`FedCross` only holds the K middleware models
across rounds and applies the schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.seeding import derive_seed
from fedlightning.server.base import Aggregator, ClientKeys
from fedlightning.server.functional import (
    clone_state,
    parameter_keys,
    uniform_average,
    weighted_average,
)

Selection = Literal["lowest_similarity", "highest_similarity", "in_order"]
SimilarityMeasure = Literal["cosine", "layerwise"]
SELECTIONS = ("lowest_similarity", "highest_similarity", "in_order")
MEASURES = ("cosine", "layerwise")


# -- pure functions ---------------------------------------------------------------------------------
def layer_groups(keys: Sequence[str]) -> list[list[str]]:
    """``keys`` grouped by owning module (``conv1.weight`` and ``conv1.bias`` form one layer), in
    order of first appearance."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(key.rsplit(".", 1)[0] if "." in key else "", []).append(key)
    return list(groups.values())


def _gram(states: Sequence[StateDict], keys: Sequence[str]) -> Tensor:
    """``G[i, j] = <flat_i, flat_j>`` over ``keys`` in float64, one key at a time (memory K x |key|)."""
    gram = torch.zeros(len(states), len(states), dtype=torch.float64)
    for key in keys:
        rows = torch.stack([s[key].detach().reshape(-1).to("cpu", torch.float64) for s in states])
        gram += rows @ rows.T
    return gram


def _cosine_from_gram(gram: Tensor) -> Tensor:
    norms = gram.diagonal().clamp_min(0).sqrt()
    denominator = torch.outer(norms, norms)
    # a zero-norm model has no direction: its cosine with anything is taken as 0
    return torch.where(
        denominator > 0, gram / denominator.clamp_min(torch.finfo(gram.dtype).tiny), 0.0
    )


def similarity_matrix(
    states: Sequence[StateDict],
    measure: SimilarityMeasure = "cosine",
    keys: Sequence[str] | None = None,
) -> Tensor:
    """The K x K (float64, symmetric) similarity of the models ``states``.

    ``cosine``: ``<X, Y> / (||X|| ||Y||)`` of the models flattened over ``keys`` (the paper's
    equation (5) with the product of norms). ``layerwise`` (the authors' code): the sum over layers of
    the cosine of each layer's flattened (weight, bias) pair, so it lies in ``[-L, L]`` for L layers.
    ``keys`` defaults to :func:`parameter_keys` of the first state.
    """
    if measure not in MEASURES:
        raise ValueError(f"similarity measure must be one of {MEASURES}, got {measure!r}")
    if not states:
        raise ValueError("similarity_matrix needs at least one state_dict")
    keys = parameter_keys(states[0]) if keys is None else list(keys)
    if measure == "cosine":
        return _cosine_from_gram(_gram(states, keys))
    total = torch.zeros(len(states), len(states), dtype=torch.float64)
    for group in layer_groups(keys):
        total += _cosine_from_gram(_gram(states, group))
    return total


def select_collaborators(
    similarity: Tensor, round: int, strategy: Selection = "lowest_similarity"
) -> list[int]:
    """The collaborator ``co(i) != i`` of each of the K trained models (docs/algorithms.md
    section 2.2 step 3).

    ``in_order``: ``co(i) = (i + (round mod (K-1)) + 1) mod K`` (the similarity values are not used,
    only K), so over K-1 consecutive rounds every other model is i's collaborator exactly once.
    ``highest_similarity`` / ``lowest_similarity``: ``argmax`` / ``argmin`` over ``j != i`` of
    ``similarity[i, j]``; ties go to the smallest j.

    Example:
        >>> sim = torch.tensor([[1.0, 0.9, 0.1], [0.9, 1.0, 0.5], [0.1, 0.5, 1.0]])
        >>> select_collaborators(sim, 0, "lowest_similarity")
        [2, 2, 0]
        >>> select_collaborators(sim, 0, "highest_similarity")
        [1, 0, 1]
        >>> select_collaborators(sim, 1, "in_order")
        [2, 0, 1]
    """
    if similarity.ndim != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be a K x K matrix, got shape {tuple(similarity.shape)}")
    k = similarity.shape[0]
    if k < 2:
        raise ValueError(f"collaborators need at least 2 models, got {k}")
    if strategy == "in_order":
        offset = round % (k - 1) + 1
        return [(i + offset) % k for i in range(k)]
    if strategy not in SELECTIONS:
        raise ValueError(f"strategy must be one of {SELECTIONS}, got {strategy!r}")
    # i is left out by position, not by an infinite diagonal, so co(i) != i even when a row holds
    # +-inf; the index into row i without its diagonal maps back as j = t + (t >= i)
    values = similarity.detach().to("cpu", torch.float64)
    others = values[~torch.eye(k, dtype=torch.bool)].reshape(k, k - 1)
    t = others.argmax(dim=1) if strategy == "highest_similarity" else others.argmin(dim=1)
    return (t + (t >= torch.arange(k)).long()).tolist()


def propeller_collaborators(num_models: int, round: int) -> list[tuple[int, int]]:
    """The two in-order propeller models ``(p1(i), p2(i))`` of each model i (paper 3.2.4).

    ``p1(i) = (i + o) mod K`` and ``p2(i) = (i + o + 1) mod K`` with ``o = (round mod (K-1)) + 1``,
    skipping i itself: ``p1`` is the in-order collaborator and ``p2`` the next model after it in the
    ring of the others. With K = 2 both are the one other model.
    """
    if num_models < 2:
        raise ValueError(f"propeller models need at least 2 models, got {num_models}")
    offset = round % (num_models - 1)
    pairs = []
    for i in range(num_models):
        others = [(i + 1 + t) % num_models for t in range(num_models - 1)]
        pairs.append((others[offset], others[(offset + 1) % (num_models - 1)]))
    return pairs


def cross_mix(own: StateDict, collaborators: Sequence[StateDict], alpha: float) -> StateDict:
    """``alpha * own + (1 - alpha) * mean(collaborators)`` (step 4; propellers pass two).

    Float entries, BatchNorm running statistics included, are mixed like parameters (a BN layer's
    statistics then stay consistent with its mixed weights); integer entries (``num_batches_tracked``)
    are ``own``'s. Computed in float64, cast back to each entry's dtype.

    Example:
        >>> mixed = cross_mix({"w": torch.tensor([1.0])}, [{"w": torch.tensor([3.0])}], alpha=0.75)
        >>> mixed["w"]
        tensor([1.5000])
    """
    if not collaborators:
        raise ValueError("cross_mix needs at least one collaborator")
    share = (1.0 - alpha) / len(collaborators)
    return weighted_average([own, *collaborators], [alpha] + [share] * len(collaborators))


def dynamic_alpha(step: int, alpha_start: float, alpha_step: float, alpha_max: float) -> float:
    """The dynamic-alpha ramp ``min(alpha_max, alpha_start + step * alpha_step)``.

    Example:
        >>> dynamic_alpha(10, 0.5, 0.005, 0.99), dynamic_alpha(1000, 0.5, 0.005, 0.99)
        (0.55, 0.99)
    """
    return min(alpha_max, alpha_start + step * alpha_step)


# -- the aggregator ---------------------------------------------------------------------------------
class FedCross(Aggregator):
    """Multi-model cross aggregation: K middleware models, each trained by one client per round.

    Round r: the K sampled clients are shuffled (from ``(seed, "fedcross-shuffle", r)``, never the
    global RNG) and the i-th receives middleware model ``W[i]`` (``Payload.model_index = i``), so
    communication equals FedAvg's. With ``v_i`` the model trained from ``W[i]``, all i at once::

        W[i] <- alpha_r * v_i + (1 - alpha_r) * v_co(i)                      (plain FedCross)
        W[i] <- alpha_r * v_i + (1 - alpha_r)/2 * (v_p1(i) + v_p2(i))        (propeller rounds)

    with ``co(i)`` from :func:`select_collaborators` on :func:`similarity_matrix` of the trained
    models and ``p1, p2`` from :func:`propeller_collaborators`. ``alpha_r = alpha`` except in the
    dynamic-alpha rounds ``[a, b)``, where ``alpha_r = min(alpha, alpha_start + (r - a) *
    alpha_step)`` (the ramp starts where its range starts; with ``a = 0`` this is
    docs/algorithms.md's ``alpha_start + r * alpha_step``). The deployable global model is the uniform mean of the K
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

    All middleware models start from the one ``initial`` state the loop gives :meth:`setup`; K
    independent initialisations would need the model builder, which the server does not have.

    Args:
        alpha: the own model's share ``alpha`` in ``[0.5, 1.0)``; the paper's default 0.99.
        selection: collaborator rule: ``lowest_similarity`` (default, the paper's best),
            ``highest_similarity`` or ``in_order``.
        similarity: ``cosine`` over all float parameters (the paper) or ``layerwise`` (the authors'
            code: sum over layers of each layer's (weight, bias) cosine). Running statistics of
            normalisation layers are not parameters and are left out (:func:`parameter_keys`).
        num_models: K; ``null`` takes the number of clients sampled in the first round. It must
            equal the loop's clients per round (one model per sampled client).
        first_stage_bound: rounds of FedAvg warm-up (authors' code; 0 = none).
        propeller_rounds: rounds ``r < propeller_rounds`` use two propeller collaborators.
        dynamic_alpha_rounds: ``[a, b]``: rounds ``a <= r < b`` use the dynamic-alpha ramp.
        alpha_start: the ramp's first value, in ``[0.5, alpha]``.
        alpha_step: the ramp's increase per round (> 0).
        evaluate_middleware: also evaluate every middleware model (metrics ``middleware_<i>/...``).
    """

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
    ) -> None:
        super().__init__()
        _require(0.5 <= alpha < 1.0, "alpha", alpha, "a number in [0.5, 1.0)")
        _require(selection in SELECTIONS, "selection", selection, f"one of {', '.join(SELECTIONS)}")
        _require(similarity in MEASURES, "similarity", similarity, f"one of {', '.join(MEASURES)}")
        _require(
            num_models is None or num_models >= 2,
            "num_models",
            num_models,
            "null or an integer >= 2",
        )
        _require(first_stage_bound >= 0, "first_stage_bound", first_stage_bound, "an integer >= 0")
        _require(propeller_rounds >= 0, "propeller_rounds", propeller_rounds, "an integer >= 0")
        if dynamic_alpha_rounds is not None:
            dynamic_alpha_rounds = tuple(dynamic_alpha_rounds)
            _require(
                len(dynamic_alpha_rounds) == 2 and 0 <= dynamic_alpha_rounds[0] < dynamic_alpha_rounds[1],
                "dynamic_alpha_rounds", list(dynamic_alpha_rounds), "null or [a, b] with 0 <= a < b",
            )  # fmt: skip
        _require(
            0.5 <= alpha_start <= alpha,
            "alpha_start",
            alpha_start,
            f"a number in [0.5, alpha={alpha}]",
        )
        _require(alpha_step > 0, "alpha_step", alpha_step, "a number > 0")
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
        self.k = num_models  # K, resolved from the first round when num_models is null
        self.initial: StateDict = {}
        self.models: list[StateDict] = []
        self._assignment: dict[int, int] = {}
        self._global: StateDict | None = None

    # -- schedule -------------------------------------------------------------------------------
    def alpha_at(self, round_index: int) -> float:
        """``alpha_r``: the ramp inside ``dynamic_alpha_rounds``, ``alpha`` elsewhere."""
        if self.dynamic_alpha_rounds is not None:
            start, end = self.dynamic_alpha_rounds
            if start <= round_index < end:
                return dynamic_alpha(
                    round_index - start, self.alpha_start, self.alpha_step, self.alpha
                )
        return self.alpha

    def uses_propellers(self, round_index: int) -> bool:
        return round_index < self.propeller_rounds

    def is_warmup(self, round_index: int) -> bool:
        return round_index < self.first_stage_bound

    # -- the contract ---------------------------------------------------------------------------
    def setup(
        self,
        initial: StateDict,
        num_clients: int,
        seed: int = 0,
        client_keys: Sequence[ClientKeys] | None = None,
    ) -> None:
        super().setup(initial, num_clients, seed, client_keys)
        partial = [g for g, keys in self.group_keys().items() if keys != set(initial)]
        if partial:
            raise ConfigurationError(
                f"FedCross's middleware models are whole models, but client groups {partial} own "
                "only part of the server model: FedCross needs every client to train the whole "
                "model (one architecture); use FedAvg or InCo for heterogeneous clients"
            )
        self.initial = clone_state(initial)
        self.k = self.num_models
        self.models = []
        self._assignment = {}
        self._global = None

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        if self.k is None:
            _require(
                len(client_ids) >= 2,
                "num_models",
                len(client_ids),
                "at least 2 clients per round (K >= 2)",
            )
            self.k = len(client_ids)
        if len(client_ids) != self.k:
            raise ConfigurationError(
                f"FedCross num_models={self.k} but {len(client_ids)} clients are sampled per round: "
                f"each middleware model is trained by one sampled client, so set loop.clients_per_round "
                f"to {self.k} (or leave num_models null)"
            )
        if not self.models:
            # identical initial models share one read-only dict: nothing ever updates in place
            self.models = [self.initial] * self.k
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "fedcross-shuffle", round_index))
        order = torch.randperm(self.k, generator=gen).tolist()
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
                torch.zeros(len(trained), len(trained))
                if self.selection == "in_order"
                else similarity_matrix(trained, self.similarity)
            )
            partners = [[c] for c in select_collaborators(sim, round_index, self.selection)]
        mixed = [
            cross_mix(trained[a], [trained[c] for c in partners[a]], alpha)
            for a in range(len(trained))
        ]
        for a, i in enumerate(indices):
            self.models[i] = mixed[a]

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

    def state_dict(self) -> dict[str, Any]:
        return {"models": self.models, "num_models": self.k, "num_clients": self.num_clients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.num_models is not None and state["num_models"] not in (None, self.num_models):
            raise ConfigurationError(
                f"FedCross num_models={self.num_models} but the checkpoint holds {state['num_models']} "
                f"middleware models: resume with the same num_models"
            )
        self.k = state["num_models"]
        self.models = [clone_state(w) for w in state["models"]]
        self.num_clients = state["num_clients"]
        self._global = None


def _require(ok: bool, option: str, value: Any, allowed: str) -> None:
    require(ok, f"FedCross {option}", value, allowed)
