"""Personalized evaluation: every scored client's deployed model on its own held-out split
(docs/algorithms.md section 10; the options: :class:`~fedlightning.loop.personal_options.
PersonalEvaluation`).

For each client ``i`` of the evaluation's sample (:func:`~fedlightning.loop.evaluation.
val_clients`, drawn from ``(seed, "personal_clients", round)``): the objective builds the weights
it deploys from the server's deployable it would download (its architecture group's, or the
one the aggregator names, :meth:`~fedlightning.server.Aggregator.deployable_of`: a clustered
method's cluster model) and its persistent state
(:meth:`~fedlightning.clients.ClientModule.personal_state`; ``None``: nothing to deploy yet, the
client is skipped); the run's scoring model loads them into a network it owns, in eval mode
(:meth:`~fedlightning.loop.scoring_model.ScoringModel.load_personal`: the one scoring path, the
same as ``test_acc``'s); with fine-tuning that network is first trained on the client's training
batches (:mod:`fedlightning.loop.fine_tune`); then its predictions on the client's split give
``c_i`` correct of ``n_i``. The row gets ``personal_acc`` and its distribution over the scored
clients (:func:`~fedlightning.metrics.accuracy_distribution`: the mean of ``c_i / n_i``,
``_weighted`` ``sum c_i / sum n_i``, ``_std``, ``_min``, ``_worst10``) and ``personal_clients``.
Nothing here draws from the run's random stream, so scoring never changes training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedlightning.loop.evaluation import val_clients
from fedlightning.loop.fine_tune import fine_tune, fine_tune_batches
from fedlightning.loop.personal_options import PersonalEvaluation
from fedlightning.metrics import accuracy_distribution
from fedlightning.placement import to_cpu
from fedlightning.protocol import StateDict
from fedlightning.seeding import derive_seed

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from fedlightning.data.datamodule import FederatedDataModule
    from fedlightning.loop.scoring_model import ScoringModel
    from fedlightning.state import ClientStore


class PersonalScorer:
    """Scores the clients' deployed models of one run (module docstring).

    Args:
        scoring: the run's scoring model.
        options: ``loop.personal``, resolved (:func:`~fedlightning.loop.personal_options.
            resolve_personal`).
        seed: the run's seed.
        deployable_of: the name of the deployable each client would download when it is not its
            group's (the aggregator's :meth:`~fedlightning.server.Aggregator.deployable_of`).
    """

    def __init__(
        self,
        scoring: ScoringModel,
        options: PersonalEvaluation,
        seed: int,
        deployable_of: Callable[[int], str | None] = lambda client_id: None,
    ) -> None:
        self.scoring = scoring
        self.options = options
        self.seed = seed
        self.deployable_of = deployable_of
        #: the scored models of the last evaluation that kept them (``personal.pt``'s entries)
        self.saved: dict[str, Any] | None = None

    def evaluate(
        self,
        dm: FederatedDataModule,
        deployables: Mapping[str, StateDict],
        store: ClientStore,
        round_index: int,
        keep: bool = False,
    ) -> dict[str, float]:
        """The personal metrics of round ``round_index``'s evaluation (call after the scoring
        model's ``prepare``); ``keep``: also keep the scored models (:attr:`saved`)."""
        o = self.options
        ids = val_clients(self.seed, round_index, dm.num_clients, o.clients, "personal_clients")
        ids = range(dm.num_clients) if ids is None else ids
        split = o.split_of(dm)
        correct, counts, models = [], [], {}
        for cid in ids:
            network, architecture = self._deployed(dm, deployables, store, cid, round_index)
            if network is None:
                continue
            x, y, _ = dm.client_test_data([cid]) if split == "test" else dm.client_val_data([cid])
            correct.append(self._hits(network, x, y, dm.eval_batch_size))
            counts.append(len(y))
            if keep and o.save:
                state = to_cpu(network.state_dict(), copy=True)
                models[cid] = {"architecture": architecture, "state_dict": state}
        if keep and o.save:
            self.saved = {"round": round_index + 1, "split": split, "clients": models}
        if not counts:
            return {}
        results = accuracy_distribution(
            torch.tensor(correct, dtype=torch.float64),
            torch.tensor(counts, dtype=torch.float64),
            "personal_acc",
        )
        return {**results, "personal_clients": float(len(counts))}

    def _deployed(
        self,
        dm: FederatedDataModule,
        deployables: Mapping[str, StateDict],
        store: ClientStore,
        cid: int,
        round_index: int,
    ) -> tuple[nn.Module | None, str | None]:
        """Client ``cid``'s deployed network, fine-tuned when configured (``None``: it has none)."""
        scoring, o = self.scoring, self.options
        name = self.deployable_of(cid)
        deployed = scoring.deployed_for(cid, dm.num_clients, deployables, name)
        weights = scoring.objective.personal_state(cid, store.get(cid), deployed)
        if weights is None:
            return None, None
        network, architecture = scoring.load_personal(cid, weights)
        if o.fine_tunes:
            seed = derive_seed(self.seed, "fine-tune", round_index, cid)
            batches = fine_tune_batches(
                dm.client_train_dataloader(cid, seed), o.fine_tune_steps, o.fine_tune_epochs
            )
            fine_tune(
                network, batches, scoring.objective.make_optimizer, scoring.autocast, seed,
                o.fine_tune_lr,
            )  # fmt: skip
        return network, architecture

    @torch.no_grad()
    def _hits(self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> int:
        """Correct predictions of ``network`` on ``(x, y)``."""
        parameter = next(network.parameters())
        hits = torch.zeros((), dtype=torch.int64, device=parameter.device)
        for start in range(0, len(y), batch_size):
            xb = x[start : start + batch_size].to(parameter.device, parameter.dtype)
            with self.scoring.autocast():
                predicted = network(xb).argmax(dim=1)
            hits += (predicted == y[start : start + batch_size].to(parameter.device)).sum()
        return int(hits)
