"""Evaluation: plain ``no_grad`` passes (no Trainer, no metric objects per round).

Each deployable model is scored through the run's scoring model (networks it owns, in eval mode
under ``no_grad``, never the objective's own modules: :mod:`fedlightning.loop.scoring_model`,
docs/algorithms.md section 6.1) on the global test set (``test_acc``, ``test_loss``; models other
than ``"global"`` prefixed by their name, e.g. ``resnet10/test_acc``), the global model on the
validation splits of the round's scored clients in one batched pass (``val_acc``: the unweighted
mean over those clients of each client's accuracy, with the distribution's sample-weighted mean,
std, min and worst 10%: :mod:`fedlightning.metrics`), each scored client's deployed model on its
own split when the run scores them (``personal_acc``: :mod:`fedlightning.loop.personal`), then
the objective adds its own metrics (:meth:`ClientModule.evaluate_clients`).

The scored clients (``loop.val_clients``, :func:`val_clients`): every client when there are at most
``val_clients`` of them (or with ``"all"``), otherwise a sample of ``val_clients`` clients drawn
without replacement from ``(seed, round)`` alone, a fresh one per evaluated round, so an
evaluation costs the same at 100 or 100,000 clients. ``val_acc`` is then the mean over that sample:
an unbiased estimate of the mean over all clients, and the same sample for every backend and on a
resume.

The test metrics are computed as torchmetrics' ``MulticlassAccuracy(average="micro")`` and
``MeanMetric`` computed them (float32 quotients of the summed counts and per-sample losses), so
their values did not change when those objects left the hot path; a NaN in any per-sample test loss
makes ``test_loss`` NaN (``MeanMetric`` dropped it), which fails the round
(:mod:`fedlightning.loop.server_guard`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.metrics import accuracy_distribution
from fedlightning.protocol import StateDict
from fedlightning.seeding import derive_seed

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule
    from fedlightning.loop.personal import PersonalScorer
    from fedlightning.loop.scoring_model import ScoringModel
    from fedlightning.state import ClientStore

ValClients = int | Literal["all"]


def val_clients(
    seed: int, round_index: int, num_clients: int, scored: ValClients, stream: str = "val_clients"
) -> list[int] | None:
    """The clients whose validation splits round ``round_index`` scores: ``None`` for every
    client (``scored`` is ``"all"`` or at least ``num_clients``), else ``scored`` distinct ids
    drawn uniformly without replacement from a generator seeded by ``(seed, round_index)`` only
    (and the draw's name, ``stream``: personalized evaluation draws its own), in increasing
    order."""
    if scored == "all" or scored >= num_clients:
        return None
    gen = torch.Generator().manual_seed(derive_seed(seed, stream, round_index))
    return sorted(torch.randperm(num_clients, generator=gen)[:scored].tolist())


class Evaluator:
    """Scores deployables through ``scoring`` (the run's :class:`~fedlightning.loop.
    scoring_model.ScoringModel`: networks it owns, in eval mode, on its device, under the run's
    autocast); ``seed`` and ``scored`` choose each round's scored clients (:func:`val_clients`);
    ``personal`` scores the clients' deployed models (``None``: the run does not)."""

    def __init__(
        self,
        scoring: ScoringModel,
        seed: int = 0,
        scored: ValClients = "all",
        personal: PersonalScorer | None = None,
    ) -> None:
        self.scoring = scoring
        self.personal = personal
        self.device = scoring.device
        self.autocast = scoring.autocast
        self.seed = seed
        self.scored = scored
        self._every_client: tuple[Tensor, Tensor, Tensor] | None = None  # gathered once

    @torch.no_grad()
    def test(
        self, network: nn.Module, batches: Iterable[tuple[Tensor, Tensor]]
    ) -> dict[str, float]:
        """``test_acc`` (micro accuracy) and ``test_loss`` (mean cross-entropy per sample)."""
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        count = 0
        dtype = next(network.parameters()).dtype  # float64 in a 64-true run
        for x, y in batches:
            x, y = x.to(self.device, dtype), y.to(self.device)
            with self.autocast():
                logits = network(x)
            correct += (logits.argmax(dim=1) == y).sum()
            loss += F.cross_entropy(logits.float(), y, reduction="none").sum()
            count += len(y)
        total = torch.tensor(float(count), dtype=torch.float32, device=self.device)
        accuracy = correct.float() / total if count else torch.zeros(())
        return {"test_acc": float(accuracy), "test_loss": float(loss / total)}

    def test_models(
        self,
        networks: Mapping[str, Callable[[], nn.Module]],
        batches: Callable[[], Iterable[tuple[Tensor, Tensor]]],
    ) -> dict[str, float]:
        """:meth:`test` of each network, loaded in turn by ``networks[name]()``: ``test_acc`` and
        ``test_loss`` for ``"global"``, prefixed by the name for the others
        (``resnet10/test_acc``), and with several client groups scored, their mean
        ``group_mean_acc``."""
        results: dict[str, float] = {}
        for name, load in networks.items():
            prefix = "" if name == "global" else f"{name}/"
            for key, value in self.test(load(), batches()).items():
                results[prefix + key] = value
        groups = [g for g in self.scoring.group_names if f"{g}/test_acc" in results]
        if len(groups) > 1:  # heterogeneous clients: the paper's headline number
            results["group_mean_acc"] = sum(results[f"{g}/test_acc"] for g in groups) / len(groups)
        return results

    @torch.no_grad()
    def client_accuracy(
        self, network: nn.Module, x: Tensor, y: Tensor, owner: Tensor, batch_size: int
    ) -> dict[str, float]:
        """The distribution of each client's accuracy on its own samples
        (:func:`~fedlightning.metrics.accuracy_distribution`: ``val_acc`` is the
        unweighted mean over clients, with ``_weighted``, ``_std``, ``_min`` and ``_worst10``)."""
        size = int(owner.max()) + 1
        correct = torch.zeros(size, dtype=torch.float64, device=self.device)
        dtype = next(network.parameters()).dtype
        for start in range(0, len(y), batch_size):
            xb = x[start : start + batch_size].to(self.device, dtype)
            yb = y[start : start + batch_size].to(self.device)
            ob = owner[start : start + batch_size].to(self.device)
            with self.autocast():
                hits = (network(xb).argmax(dim=1) == yb).to(torch.float64)
            correct += torch.bincount(ob, weights=hits, minlength=size)
        counts = torch.bincount(owner, minlength=size).to(self.device, torch.float64)
        return accuracy_distribution(correct, counts, "val_acc")

    def evaluate(
        self,
        dm: FederatedDataModule,
        deployables: Mapping[str, StateDict],
        client_ids: Sequence[int],
        store: ClientStore,
        round_index: int = 0,
        last: bool = False,
    ) -> dict[str, float]:
        """Every metric of round ``round_index``'s evaluation (see the module docstring);
        ``client_ids``: the clients whose uploads the round aggregated (for the objective's
        own metrics); ``last``: the run's last round (its personal models are kept for
        ``personal.pt``)."""
        scoring = self.scoring
        scoring.prepare(store, deployables)
        loaders = {name: functools.partial(scoring.load, w) for name, w in deployables.items()}
        results = self.test_models(loaders, dm.test_dataloader)
        x, y, owner = self._val_data(dm, round_index)
        if len(y):
            network = scoring.load(deployables["global"])
            results.update(self.client_accuracy(network, x, y, owner, dm.eval_batch_size))
        if self.personal is not None and self.personal.options.scores(round_index, last):
            results.update(self.personal.evaluate(dm, deployables, store, round_index, last))
        results.update(scoring.evaluate_clients(client_ids, store, dm.client_val_dataloader))
        return results

    def _val_data(self, dm: FederatedDataModule, round_index: int) -> tuple[Tensor, Tensor, Tensor]:
        """The scored clients' validation samples, ``(x, y, client_id)``: every client's gathered
        once per run, a sample's gathered per round."""
        ids = val_clients(self.seed, round_index, dm.num_clients, self.scored)
        if ids is not None:
            return dm.client_val_data(ids)
        if self._every_client is None:
            self._every_client = dm.client_val_data()
        return self._every_client
