"""CoFED: one-shot co-training across participants with different models, label spaces and recipes.
Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603 (docs/algorithms.md section 3).

The report (:class:`~fedlightning.cofed.report.CoFEDResult`, re-exported here, and the files of
the run directory) is :mod:`fedlightning.cofed.report`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedlightning.cofed.participant_base import Participant, Participants
from fedlightning.cofed.report import CoFEDResult, report, report_title, write_report
from fedlightning.cofed.tasks import CoFEDData, LabelSpaceTasks, Tasks
from fedlightning.cofed.torch_participants import TorchParticipants
from fedlightning.cofed.voting import vote
from fedlightning.errors import require
from fedlightning.loop.checks import check_seed
from fedlightning.seeding import derive_seed
from fedlightning.training import cpu_compute, quiet_lightning

__all__ = ["CoFED", "CoFEDResult"]


class CoFED:
    """CoFED's one round: only pseudo labels on a public unlabeled set travel, never parameters.

    1. every participant i trains locally on its private data (its own model, label space Y_i and
       recipe) and is scored on its test set: ``local_acc``;
    2. each predicts class probabilities on the public set;
    3. the server votes (:func:`fedlightning.cofed.vote`): participant i votes c on s when c is its
       top-1 and ``p_top1 - p_top2 > margin``; ``score(s, c) = sum_{i votes c on s} w_i /
       sum_{i owns c} w_i``; ``S_c = {s : score(s, c) > alpha}``; i receives
       ``R_i = {(s, c) : c in Y_i, s in S_c}`` without the samples claimed by two of its classes;
    4. each participant continues training from its local model on local data plus ``R_i``
       (class-balanced for torch participants) and is scored again: ``cofed_acc``. A participant
       with an empty ``R_i`` keeps its local model.

    The report's relative accuracy is ``cofed_acc / local_acc`` (the paper's Figure 2).

    Args:
        tasks: the tasks and public set (default ``LabelSpaceTasks()``: digits, non-IID).
        participants: how participants are built (default ``TorchParticipants()``: random CNNs).
        alpha: vote threshold in [0, 1] (default 0.3, the authors' CIFAR-100 scripts'; the
            paper's FEMNIST runs use 0.01; 0.5 with ``margin: 0`` is a strict majority vote among
            participants that own both classes).
        margin: top-1 minus top-2 probability a vote needs, in [0, 1] (0 disables; default 0.3,
            the authors' code's).
        weights: credibility weights ``w_i >= 0``, one per participant (null: all 1).
        seed: the one seed: tasks, architectures, initialisations and every fit derive from it.
        run_dir: where the report goes (the CLI's default: ``runs/<config name>``).
        progress_bar: show progress over participants.
        num_threads: torch intra-op threads during the run; default 1, as ``fit``'s
            ``loop.num_threads`` (docs/algorithms.md section 9.3): small models gain nothing from
            several threads, on a busy machine they oversubscribe the cores (1 thread was 40x
            faster than 2 for the digits CNNs on a shared 2-core machine), and the count changes
            the bits. Null: torch's default (one per core).
        onednn: use oneDNN (MKL-DNN) CPU kernels (off by default: torch 2.14.1's oneDNN
            convolution backward corrupted the heap here; see
            :func:`fedlightning.training.cpu_compute`).
    """

    def __init__(
        self,
        tasks: Tasks | None = None,
        participants: Participants | None = None,
        alpha: float = 0.3,
        margin: float = 0.3,
        weights: list[float] | None = None,
        seed: int = 0,
        run_dir: str | None = None,
        progress_bar: bool = True,
        num_threads: int | None = 1,
        onednn: bool = False,
    ) -> None:
        check_seed(seed, "seed")  # as fit checks loop.seed
        require(0.0 <= alpha <= 1.0, "alpha", alpha, "a number in [0, 1]")
        require(0.0 <= margin <= 1.0, "margin", margin, "a number in [0, 1]")
        require(
            weights is None or all(0 <= w < float("inf") for w in weights),
            "weights",
            weights,
            "null or finite numbers >= 0",
        )
        require(
            num_threads is None or num_threads >= 1,
            "num_threads",
            num_threads,
            "null or an integer >= 1",
        )
        self.tasks = tasks if tasks is not None else LabelSpaceTasks()
        self.participants = participants if participants is not None else TorchParticipants()
        self.alpha = alpha
        self.margin = margin
        self.weights = weights
        self.seed = seed
        self.run_dir = Path(run_dir if run_dir is not None else "runs/cofed")
        self.progress_bar = progress_bar
        self.num_threads = num_threads
        self.onednn = onednn
        self.console = Console(stderr=True)
        #: what the run is doing (named when a signal stops it)
        self.stage = "start-up"

    def run(self) -> CoFEDResult:
        """Run the pipeline and write the report to ``run_dir``."""
        with cpu_compute(self.num_threads, self.onednn):
            return self._run()

    def _run(self) -> CoFEDResult:
        started = time.perf_counter()
        data = self.tasks.build(derive_seed(self.seed, "tasks"))
        n = len(data.tasks)
        require(
            self.weights is None or len(self.weights) == n, "weights", self.weights,
            f"null or one weight per participant ({n})",
        )  # fmt: skip
        with quiet_lightning(), self._progress() as progress:
            models, local_acc = self._local_training(data, progress)
            self.stage = "prediction on the public set"
            task = progress.add_task("predicting on the public set", total=n)
            probs = []
            for model in models:
                probs.append(model.predict_proba(data.public_x))
                progress.advance(task)
            self.stage = "the vote"
            pseudo = vote(
                probs, [t.label_space for t in data.tasks], self.alpha, self.margin, self.weights
            )
            cofed_acc = self._update_training(data, models, pseudo, progress)
        self.stage = "writing the report"
        result = report(data, models, pseudo, local_acc, cofed_acc, time.perf_counter() - started)
        write_report(self.run_dir, data, models, result, report_title(self.tasks, n))
        self.console.print(
            f"[bold]CoFED[/]: {n} participants, mean local acc {result.summary['mean_local_acc']:.4f}, "
            f"mean CoFED acc {result.summary['mean_cofed_acc']:.4f}, mean relative acc "
            f"{result.summary['mean_relative_acc']:.4f}; run directory {self.run_dir}",
            soft_wrap=True,  # one line however narrow the terminal (or 80 columns off one)
        )
        return result

    def _local_training(
        self, data: CoFEDData, progress: Progress
    ) -> tuple[list[Participant], list[float]]:
        models, accuracy = [], []
        task = progress.add_task("local training", total=len(data.tasks))
        for i, t in enumerate(data.tasks):
            self.stage = f"local training of participant {i + 1}/{len(data.tasks)}"
            model = self.participants.build(
                i, len(t.label_space), data.sample_shape, derive_seed(self.seed, "participant", i)
            )
            model.fit(t.train_x, t.local(t.train_y), derive_seed(self.seed, "local", i))
            models.append(model)
            accuracy.append(model.accuracy(t.test_x, t.local(t.test_y)))
            progress.advance(task)
        return models, accuracy

    def _update_training(
        self,
        data: CoFEDData,
        models: list[Participant],
        pseudo: list[tuple[np.ndarray, np.ndarray]],
        progress: Progress,
    ) -> list[float]:
        accuracy = []
        task = progress.add_task("update training", total=len(models))
        for i, (t, model, (idx, labels)) in enumerate(zip(data.tasks, models, pseudo, strict=True)):
            self.stage = f"update training of participant {i + 1}/{len(models)}"
            if len(idx):
                model.update_from(
                    t.train_x, t.local(t.train_y), data.public_x[idx], t.local(labels),
                    derive_seed(self.seed, "update", i),
                )  # fmt: skip
            accuracy.append(model.accuracy(t.test_x, t.local(t.test_y)))
            progress.advance(task)
        return accuracy

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self.console, disable=not self.progress_bar,
        )  # fmt: skip
