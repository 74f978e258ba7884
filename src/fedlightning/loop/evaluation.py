"""Evaluation: plain ``no_grad`` passes with torchmetrics (no Trainer per round).

Each deployable model is scored on the global test set (``test_acc``, ``test_loss``; models other
than ``"global"`` prefixed by their name, e.g. ``resnet10/test_acc``), the global model on every
client's validation split (``val_acc``: the unweighted mean over clients of each client's
accuracy, with the distribution's sample-weighted mean, std, min and worst 10%:
:mod:`fedlightning.metrics`), then the objective adds its own metrics (:meth:`ClientModule.evaluate_clients`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from fedlightning.metrics import accuracy_distribution
from fedlightning.protocol import StateDict

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule
    from fedlightning.state import ClientStore


class Evaluator:
    """Scores models on ``device`` under ``autocast`` (the run's precision context)."""

    def __init__(
        self, device: torch.device, autocast: Callable[[], AbstractContextManager]
    ) -> None:
        self.device = device
        self.autocast = autocast

    @torch.no_grad()
    def test(
        self, model: ClientModule, batches: Iterable[tuple[Tensor, Tensor]]
    ) -> dict[str, float]:
        """``test_acc`` (micro accuracy) and ``test_loss`` (mean cross-entropy per sample)."""
        accuracy = MulticlassAccuracy(model.num_classes, average="micro").to(self.device)
        loss = MeanMetric().to(self.device)
        dtype = next(model.parameters()).dtype  # float64 after a 64-true fit
        for x, y in batches:
            x, y = x.to(self.device, dtype), y.to(self.device)
            with self.autocast():
                logits = model(x)
            accuracy.update(logits, y)
            loss.update(F.cross_entropy(logits.float(), y, reduction="none"))
        return {"test_acc": float(accuracy.compute()), "test_loss": float(loss.compute())}

    @torch.no_grad()
    def client_accuracy(
        self, model: ClientModule, x: Tensor, y: Tensor, owner: Tensor, batch_size: int
    ) -> dict[str, float]:
        """The distribution of each client's accuracy on its own samples
        (:func:`~fedlightning.metrics.accuracy_distribution`: ``val_acc`` is the
        unweighted mean over clients, with ``_weighted``, ``_std``, ``_min`` and ``_worst10``)."""
        correct = torch.zeros(0, dtype=torch.float64, device=self.device)
        counts = torch.zeros(0, dtype=torch.float64, device=self.device)
        dtype = next(model.parameters()).dtype
        for start in range(0, len(y), batch_size):
            xb = x[start : start + batch_size].to(self.device, dtype)
            yb = y[start : start + batch_size].to(self.device)
            ob = owner[start : start + batch_size].to(self.device)
            with self.autocast():
                hits = (model(xb).argmax(dim=1) == yb).to(torch.float64)
            size = max(int(ob.max()) + 1, len(counts))
            correct = _pad(correct, size) + torch.bincount(ob, weights=hits, minlength=size)
            counts = _pad(counts, size) + torch.bincount(ob, minlength=size).to(torch.float64)
        return accuracy_distribution(correct, counts, "val_acc")

    def evaluate(
        self,
        model: ClientModule,
        dm: FederatedDataModule,
        deployables: Mapping[str, StateDict],
        client_ids: Sequence[int],
        store: ClientStore,
    ) -> dict[str, float]:
        """Every metric of one evaluated round (see the module docstring)."""
        model.to(self.device).eval()
        model.prepare_evaluation(store)
        results: dict[str, float] = {}
        for name, weights in deployables.items():
            model.load_network_state(weights)
            prefix = "" if name == "global" else f"{name}/"
            for key, value in self.test(model, dm.test_dataloader()).items():
                results[prefix + key] = value
        groups = [g for g in model.groups if f"{g}/test_acc" in results]
        if len(groups) > 1:  # heterogeneous clients: the paper's headline number
            results["group_mean_acc"] = sum(results[f"{g}/test_acc"] for g in groups) / len(groups)
        model.load_network_state(deployables["global"])
        x, y, owner = dm.client_val_data()
        if len(y):
            results.update(self.client_accuracy(model, x, y, owner, dm.eval_batch_size))
        results.update(
            model.evaluate_clients(client_ids, store, dm.client_val_dataloader, self.device)
        )
        model.train()
        return results


def _pad(values: Tensor, size: int) -> Tensor:
    return F.pad(values, (0, size - len(values)))
