"""FederatedLoop: runs rounds; the LightningCLI ``trainer_class`` (config key ``loop``).

A round: sample clients from ``(seed, round)``, ask the aggregator for their payloads, hand the
jobs to the backend, apply the failure policy, aggregate, evaluate, report, checkpoint. The loop
knows the payload/upload contract (:mod:`fedlightning.protocol`) and the Backend protocol, and
nothing of what an objective optimises, how an aggregator combines or how a backend fits.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.loggers import Logger

from fedlightning.backends.auto import AutoBackend
from fedlightning.backends.base import Backend
from fedlightning.clients.base import ClientModule
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.errors import ConfigurationError, RunStopped
from fedlightning.fit import fabric_for
from fedlightning.loop.checkpoint import atomic_save, make_checkpoint, read_checkpoint
from fedlightning.loop.communication import CommunicationMeter
from fedlightning.loop.evaluation import Evaluator
from fedlightning.loop.failures import check_for_bug, sort_results
from fedlightning.loop.reporting import Reporter
from fedlightning.loop.rundir import RunDirectory, interrupted, storage_error
from fedlightning.loop.sampling import sample_clients
from fedlightning.loop.startup import PRECISIONS, check_arguments, open_run, prepare_run
from fedlightning.loop.summary import RunSummary
from fedlightning.loop.targets import TargetTracker
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg
from fedlightning.signals import StopSignal, signal_number, stop_on_signals
from fedlightning.state import ClientStore
from fedlightning.training import cpu_compute, quiet_lightning

log = logging.getLogger("fedlightning")

__all__ = ["PRECISIONS", "FederatedLoop"]


class FederatedLoop:
    """Runs federated training rounds.

    Each round ``r`` (0-based): sample ``clients_per_round`` clients from ``(seed, r)``; ask the
    aggregator for their payloads; fit each client's module for ``local_epochs`` epochs (or
    ``local_steps`` optimizer steps) on the ``backend``, seeded from ``(seed, r, client)``;
    aggregate the successful uploads; every ``eval_every`` rounds evaluate the deployable model(s)
    on the global test set and on every client's validation split; report; checkpoint atomically.

    Args:
        rounds: number of communication rounds R.
        clients_per_round: clients sampled per round, an int K or a fraction of ``num_clients``.
        local_epochs: local epochs E per client fit.
        local_steps: if set, train exactly this many optimizer steps per fit instead of epochs.
        aggregator: the server algorithm (default ``FedAvg()``).
        backend: how a round's client fits run (default ``AutoBackend()``: sequential on the CPU,
            the cohort on an accelerator where it applies; also ``SequentialBackend``,
            ``CohortBackend`` and ``RayBackend``, by ``class_path``). Results do not depend on it.
        precision: Lightning precision of every client fit and evaluation.
        accelerator: Lightning accelerator (``auto``, ``cpu``, ``gpu``...); its device is also the
            server device, where the server state stays between rounds
            (:mod:`fedlightning.loop.server_device`).
        devices: devices per client fit (one; several GPUs are reached through a backend).
        seed: seeds sampling, client fits, model initialisation (CLI) and the partition.
        eval_every: evaluate every this many rounds (and always after the last round).
        run_dir: where ``config.yaml``, ``partition.csv``, ``metrics.csv``, ``last.ckpt`` and
            ``global.pt`` go (default ``runs/<config name>`` from the CLI, ``runs/run`` otherwise).
        checkpoint_every: write ``last.ckpt`` every this many rounds (and after the last round).
        min_clients: a round aggregates only if at least this many uploads succeed.
        on_round_failure: ``skip`` the aggregation of a round with fewer than ``min_clients``
            successful uploads (the server state stays as it was), or ``stop`` the run. Either
            way, failures that are bugs stop the run (:mod:`fedlightning.loop.failures`).
        client_state: keep per-client state in ``memory`` or on ``disk`` under
            ``run_dir/client_state`` (bounded memory for thousands of stateful clients).
        plots: write ``partition.png`` and ``curves.png`` to the run directory.
        loggers: Lightning loggers besides the CSV logger (``metrics.csv``), each by
            ``class_path`` (``TensorBoardLogger``, ``MLFlowLogger``, ``WandbLogger``...).
        wandb: shorthand for a W&B logger (offline unless ``WANDB_API_KEY`` is set).
        wandb_project, wandb_group, wandb_tags, wandb_name: settings of that W&B logger.
        progress_bar: show a rich progress bar over rounds.
        fit_with: ``auto``: Lightning Fabric fits every objective that states its loss, a lean
            Trainer those that need one (manual optimization, overridden training hooks);
            ``trainer``: a Trainer for every fit.
        gradient_clip_val: clip each client's gradients to this total norm (or value); null: off.
        gradient_clip_algorithm: ``norm`` or ``value``.
        num_threads: torch intra-op threads during the run (null: torch's default).
        onednn: use oneDNN (MKL-DNN) CPU kernels during the run. Off by default: torch 2.14.1's
            oneDNN convolution backward corrupted the heap (the process aborts) on this project's
            CPUs; see :func:`fedlightning.training.cpu_compute`. No effect on GPU kernels.
        target_acc: report the first evaluated round (and the wall time) at which ``test_acc``
            reaches this value (``rounds_to_target``, ``time_to_target_s``;
            :mod:`fedlightning.loop.targets`); null: off. Every evaluated row also has the
            communication columns of :mod:`fedlightning.loop.communication`.
        overwrite: replace the results of an earlier run in ``run_dir`` (by default a run refuses
            a directory holding another run's results unless it resumes from ``ckpt_path``; see
            :mod:`fedlightning.loop.rundir`).
        log_every: with stderr not a terminal (a cluster log), print one plain line every this
            many rounds (at evaluated rounds).
        max_skipped_fraction: the run fails (exit status 1 from the CLI) when more than this
            fraction of its rounds skipped aggregation, or when no round aggregated.
    """

    def __init__(
        self,
        rounds: int = 10,
        clients_per_round: int | float = 10,
        local_epochs: int = 1,
        local_steps: int | None = None,
        aggregator: Aggregator | None = None,
        backend: Backend | None = None,
        precision: Literal["32-true", "32", "bf16-mixed", "16-mixed", "64-true"] = "32-true",
        accelerator: str = "auto",
        devices: int = 1,
        seed: int = 0,
        eval_every: int = 1,
        run_dir: str | None = None,
        checkpoint_every: int = 1,
        min_clients: int = 1,
        on_round_failure: Literal["skip", "stop"] = "skip",
        client_state: Literal["memory", "disk"] = "memory",
        plots: bool = True,
        loggers: list[Logger] | None = None,
        wandb: bool = False,
        wandb_project: str = "fedlightning",
        wandb_group: str | None = None,
        wandb_tags: list[str] | None = None,
        wandb_name: str | None = None,
        progress_bar: bool = True,
        fit_with: Literal["auto", "trainer"] = "auto",
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        num_threads: int | None = None,
        onednn: bool = False,
        overwrite: bool = False,
        log_every: int = 1,
        max_skipped_fraction: float = 0.5,
        target_acc: float | None = None,
    ) -> None:
        self.init_args = {k: v for k, v in locals().items() if k != "self"}  # config.yaml
        check_arguments(**self.init_args)
        self.rounds = rounds
        self.clients_per_round = clients_per_round
        self.aggregator = aggregator if aggregator is not None else FedAvg()
        self.backend = backend if backend is not None else AutoBackend()
        self.fit_config = FitConfig(
            local_epochs=local_epochs, local_steps=local_steps, precision=precision,
            accelerator=accelerator, seed=seed, gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm, fit_with=fit_with,
            num_threads=num_threads, onednn=onednn,
        )  # fmt: skip
        self.seed = seed
        self.eval_every = eval_every
        self.run_dir = Path(run_dir if run_dir is not None else "runs/run")
        self.checkpoint_every = checkpoint_every
        self.min_clients = min_clients
        self.on_round_failure = on_round_failure
        self.store = ClientStore(client_state, self.run_dir / "client_state")
        self.reporter = Reporter(
            self.run_dir, loggers or (), wandb,
            dict(project=wandb_project, group=wandb_group, tags=wandb_tags, name=wandb_name),
            progress_bar, plots,
        )  # fmt: skip
        self.history: list[dict[str, float]] = []
        self.overwrite = overwrite
        self.max_skipped_fraction = max_skipped_fraction
        self.reporter.log_every = log_every
        self.summary = RunSummary()
        #: the resolved config the CLI writes to ``run_dir/config.yaml`` once every check passed
        self.config_text: str | None = None
        self.communication = CommunicationMeter()
        self.target = TargetTracker(target_acc)

    @property
    def precision(self) -> str:
        return self.fit_config.precision

    @property
    def console(self):
        """The rich console progress and the closing line go to (``console.quiet = True`` mutes it)."""
        return self.reporter.console

    # -- public API -----------------------------------------------------------------------------
    def fit(
        self,
        model: ClientModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: FederatedDataModule | None = None,
        ckpt_path: str | None = None,
    ) -> dict[str, float]:
        """Run federated training of ``model`` on ``datamodule``; resume from ``ckpt_path`` if given.

        Returns the last evaluated metrics.
        """
        if datamodule is None or train_dataloaders is not None or val_dataloaders is not None:
            raise ConfigurationError(
                "FederatedLoop.fit needs a FederatedDataModule as `datamodule`"
            )
        per_round, checkpoint, resuming = prepare_run(self, model, datamodule, ckpt_path)
        overwrite = self.overwrite and checkpoint is None  # a resume rewrites its history itself
        with RunDirectory(self.run_dir, overwrite, resuming=resuming or self.overwrite):
            with (
                cpu_compute(self.fit_config.num_threads, self.fit_config.onednn),
                quiet_lightning(),
                stop_on_signals(),  # SIGINT and SIGTERM alike, Trainer fits included
            ):
                try:
                    self.backend.start(model, datamodule, self.fit_config)
                    return self._run(model, datamodule, per_round, checkpoint)
                except (KeyboardInterrupt, StopSignal) as stop:
                    raise interrupted(self._newest_checkpoint(), signal_number(stop)) from None
                except OSError as error:  # the run's own files: never a client failure
                    raise storage_error(error, self.run_dir, "write the run's files") from None
                finally:
                    self.backend.stop()

    # -- the rounds -----------------------------------------------------------------------------
    def _run(
        self,
        model: ClientModule,
        dm: FederatedDataModule,
        per_round: int,
        checkpoint: dict[str, Any] | None,
    ) -> dict[str, float]:
        start_round = open_run(self, model, dm, checkpoint)
        fabric = fabric_for(self.fit_config.accelerator, self.precision)  # evaluation's context
        evaluator = Evaluator(fabric.device, fabric.autocast)
        metrics: dict[str, float] = self.history[-1] if self.history else {}
        started = time.perf_counter()
        with self.reporter.progress(self.rounds, start_round) as advance:
            for r in range(start_round, self.rounds):
                round_start = time.perf_counter()
                client_ids = sample_clients(self.seed, r, dm.num_clients, per_round)
                payloads = self.aggregator.configure_round(r, client_ids)
                jobs = [ClientJob(r, cid, payloads[cid], self.store.get(cid)) for cid in client_ids]
                with self.reporter.watch_round(r, len(jobs)):
                    results = self.server.arrivals(self.backend.run(r, jobs))
                traffic = self.communication.count(jobs, results)
                outcome = sort_results(r, client_ids, results, payloads, self.summary)
                check_for_bug(r, r == start_round, outcome)
                for cid, result in outcome.results:
                    self.store.put(cid, result.state)
                uploads = outcome.uploads
                self.summary.record_round(len(uploads) >= self.min_clients)
                if len(uploads) >= self.min_clients:
                    self.aggregator.aggregate(r, uploads)
                elif self.on_round_failure == "stop":
                    self._stop(r, len(uploads), per_round)
                else:
                    log.warning(
                        "round %d: only %d of %d clients succeeded (min_clients=%d): aggregation skipped",
                        r + 1, len(uploads), per_round, self.min_clients,
                    )  # fmt: skip
                last = r == self.rounds - 1
                if (r + 1) % self.eval_every == 0 or last:
                    metrics = {
                        "round": r + 1,
                        **evaluator.evaluate(
                            model,
                            dm,
                            self.aggregator.deployables(),
                            [u.client_id for u in uploads],
                            self.store,
                        ),  # fmt: skip
                        "train_loss": _mean(
                            [u.metrics.get("train_loss", math.nan) for u in uploads]
                        ),
                        "clients_failed": len(outcome.failed),
                        "clients_rejected": len(outcome.rejected),
                        "round_time_s": time.perf_counter() - round_start,
                        **traffic,
                        **self.aggregator.round_metrics(),
                    }
                    self.target.add_time(metrics["round_time_s"])
                    metrics.update(self.target.update(r + 1, metrics, last))
                    self.history.append(metrics)
                    self.reporter.log(metrics)
                    self.reporter.round_line(metrics, self.rounds, last)
                else:
                    self.target.add_time(time.perf_counter() - round_start)
                if (r + 1) % self.checkpoint_every == 0 or last:
                    self._save_checkpoint(r + 1)
                advance(f"test_acc {metrics['test_acc']:.4f}" if "test_acc" in metrics else "")
        atomic_save(self.aggregator.global_state(), self.run_dir / "global.pt")
        self.reporter.close()
        self.reporter.summary(self.summary.lines())
        failure = self.summary.verdict(self.max_skipped_fraction)
        if failure is not None:
            raise RunStopped(f"run failed: {failure}; results are in {self.run_dir}")
        self.reporter.done(
            metrics, self.rounds, time.perf_counter() - started, self.target.summary()
        )
        return metrics

    def _stop(self, r: int, succeeded: int, per_round: int) -> None:
        checkpoint = self.run_dir / "last.ckpt"
        resume = f"; --ckpt_path {checkpoint} resumes" if checkpoint.is_file() else ""
        raise RunStopped(
            f"round {r + 1}: only {succeeded} of {per_round} clients succeeded "
            f"(min_clients={self.min_clients}); stopping as on_round_failure='stop'" + resume
        )

    # -- checkpoints ----------------------------------------------------------------------------
    def _save_checkpoint(self, rounds_done: int) -> None:
        checkpoint = make_checkpoint(
            rounds_done, self.identity, self.aggregator.state_dict(), self.store.state_dict(),
            self.history, {"wandb": self.reporter.wandb_id()},
            {"communication": self.communication.state_dict(), "target": self.target.state_dict()},
        )  # fmt: skip
        atomic_save(checkpoint, self.run_dir / "last.ckpt")
        self._last_checkpoint = (rounds_done, str(self.run_dir / "last.ckpt"))
        self.store.commit()

    def _newest_checkpoint(self) -> tuple[int, str] | None:
        """``(rounds, path)`` of the checkpoint that resumes this run now: the file on disk is the
        truth (a Ctrl-C may land between its rename and the bookkeeping after it)."""
        path = self.run_dir / "last.ckpt"
        try:
            return int(read_checkpoint(str(path))["round"]), str(path)
        except ConfigurationError:
            return self._last_checkpoint


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan
