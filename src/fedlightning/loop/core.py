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

from fedlightning.attacks.base import Attack
from fedlightning.backends.auto import AutoBackend
from fedlightning.backends.base import Backend
from fedlightning.clients.base import ClientModule
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.determinism import deterministic_compute, prepare_environment
from fedlightning.errors import ConfigurationError, RunStopped
from fedlightning.loop.checkpoint import atomic_save, make_checkpoint, read_checkpoint
from fedlightning.loop.checkpoint_writer import CheckpointWriter
from fedlightning.loop.communication import CommunicationMeter
from fedlightning.loop.deployables import save_models
from fedlightning.loop.evaluation import Evaluator
from fedlightning.loop.failures import check_for_bug, sort_results
from fedlightning.loop.reporting import Reporter
from fedlightning.loop.run_state import RunState
from fedlightning.loop.rundir import RunDirectory, interrupted, storage_error
from fedlightning.loop.sampling import round_clients
from fedlightning.loop.scoring_model import ScoringModel
from fedlightning.loop.server_guard import ServerGuard
from fedlightning.loop.startup import check_arguments, open_run, prepare_run
from fedlightning.loop.summary import RunSummary
from fedlightning.loop.targets import TargetTracker
from fedlightning.privacy import DPSGD
from fedlightning.privacy.report import PrivacyReport
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg
from fedlightning.signals import StopSignal, finished, signal_number, stop_on_signals
from fedlightning.state import ClientStore
from fedlightning.training import cpu_compute, quiet_lightning

log = logging.getLogger("fedlightning")

__all__ = ["FederatedLoop"]


class FederatedLoop:
    """Runs federated training rounds.

    Each round ``r`` (0-based): sample ``clients_per_round`` clients from ``(seed, r)``; ask the
    aggregator for their payloads; fit each client's module for ``local_epochs`` epochs (or
    ``local_steps`` optimizer steps) on the ``backend``, seeded from ``(seed, r, client)``;
    aggregate the successful uploads; every ``eval_every`` rounds evaluate the deployable model(s)
    on the global test set and the global model on the scored clients' validation splits
    (``val_clients``); report; checkpoint atomically (written in the background,
    :mod:`fedlightning.loop.checkpoint_writer`).

    Args:
        rounds: number of communication rounds R.
        clients_per_round: clients sampled per round, an int K or a fraction of ``num_clients``.
        local_epochs: local epochs E per client fit.
        local_steps: if set, train exactly this many optimizer steps per fit instead of epochs.
        aggregator: the server algorithm (default ``FedAvg()``).
        backend: how a round's client fits run (default ``AutoBackend()``: the cohort where it
            applies and measures clearly faster, else sequential; also ``SequentialBackend``,
            ``CohortBackend`` and ``RayBackend``, by ``class_path``). Results do not depend on it,
            beyond the cohort's float rounding: with BatchNorm ResNets or dropout it agrees
            after a step, and over many rounds in distribution (:mod:`fedlightning.backends.base`).
        precision: Lightning precision of every client fit and evaluation (which path runs
            which precision: :mod:`fedlightning.compute`; ``16-mixed`` runs ``bf16-mixed`` on a
            CPU, as in Lightning).
        accelerator: Lightning accelerator (``auto``, ``cpu``, ``gpu``...), resolved once per run
            with the precision (:class:`~fedlightning.compute.Compute`); its device is also the
            server device, where the server state stays between rounds
            (:mod:`fedlightning.loop.server_device`).
        devices: devices per client fit (one; several GPUs are reached through a backend).
        seed: seeds sampling, client fits, model initialisation (CLI) and the partition.
        eval_every: evaluate every this many rounds (and always after the last round).
        val_clients: the clients whose validation splits an evaluated round scores (``val_acc``):
            ``all``, or an integer K: every client when there are at most K, otherwise K clients
            sampled from ``(seed, round)`` afresh each evaluated round, so evaluation does not
            grow with the number of clients (``val_acc`` is then the mean over the sample;
            :mod:`fedlightning.loop.evaluation`). Default 100.
        run_dir: where ``config.yaml``, ``partition.csv``, ``metrics.csv``, ``last.ckpt``,
            ``global.pt`` and ``models.pt`` (every deployable: :mod:`fedlightning.loop.deployables`)
            go (default ``runs/<config name>`` from the CLI, ``runs/run`` otherwise).
        checkpoint_every: write ``last.ckpt`` every this many rounds (and after the last round).
        min_clients: a round aggregates only if at least this many uploads succeed.
        on_round_failure: ``skip`` the aggregation of a round with fewer than ``min_clients``
            successful uploads (the server state stays as it was), or ``stop`` the run. Either
            way, failures that are bugs stop the run (:mod:`fedlightning.loop.failures`). A round
            that leaves NaN/Inf in the server state or a non-finite test loss is a failed round
            too: its aggregation is undone (:mod:`fedlightning.loop.server_guard`).
        client_state: keep per-client state in ``memory`` (every checkpoint then holds every
            client's state, so its cost grows with the clients that have state) or on ``disk``
            under ``run_dir/client_state`` (a file per client; memory and checkpoints stay the
            same size however many clients have state: :mod:`fedlightning.state.disk`).
        plots: write ``partition.png`` and ``curves.png`` to the run directory.
        loggers: Lightning loggers besides ``metrics.csv`` (always written), each by
            ``class_path`` (``TensorBoardLogger``, ``MLFlowLogger``, ``WandbLogger``...); each
            gets the resolved config and, where it takes images, the run's figures
            (:mod:`fedlightning.loop.logger_outputs`).
        wandb: shorthand for a W&B logger (offline unless ``WANDB_API_KEY`` is set).
        wandb_project, wandb_group, wandb_tags, wandb_name: settings of that W&B logger.
        progress_bar: show the progress over rounds (a bar on a terminal, one display updated
            in place in Jupyter: :mod:`fedlightning.loop.progress`).
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
        attack: Byzantine clients for robustness experiments (``fedlightning.attacks``: a seeded
            fraction or a list of malicious clients and what they do; docs/algorithms.md section
            8.1); every evaluated row then has ``malicious_uploads``. Null: none.
        client_sampling: ``fixed``: ``clients_per_round`` clients a round, drawn uniformly
            without replacement; ``poisson``: each client independently with probability
            ``q = clients_per_round / num_clients`` (or the fraction given), so a round may have
            none (it trains no client and aggregates only under client-level DP). Both from
            ``(seed, round)`` (:mod:`fedlightning.loop.sampling`); ``poisson`` is what
            ``fedlightning.privacy.ClientLevelDP`` needs (docs/algorithms.md section 7.1).
        dp_sgd: sample-level differential privacy in every client fit
            (:class:`fedlightning.privacy.DPSGD`, docs/algorithms.md section 7.2); null: off.
        deterministic: ``true``: deterministic algorithms everywhere the run computes (torch's,
            cuDNN's, cuBLAS's workspace), so that a seed repeats bit for bit on the GPU too; an op
            without a deterministic implementation stops the run naming it; ``warn``: such an op
            runs with a warning; ``false``: torch's fastest kernels (:mod:`fedlightning.
            determinism`, docs/algorithms.md section 9.1). Part of the run's identity.
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
        val_clients: int | Literal["all"] = 100,
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
        attack: Attack | None = None,
        client_sampling: Literal["fixed", "poisson"] = "fixed",
        dp_sgd: DPSGD | None = None,
        deterministic: bool | Literal["warn"] = True,
    ) -> None:
        self.init_args = {k: v for k, v in locals().items() if k != "self"}  # config.yaml
        check_arguments(**self.init_args)
        prepare_environment(deterministic)  # cuBLAS reads it when CUDA starts: before any fit
        self.rounds = rounds
        self.clients_per_round = clients_per_round
        self.aggregator = aggregator if aggregator is not None else FedAvg()
        self.attack = attack
        self.backend = backend if backend is not None else AutoBackend()
        self.fit_config = FitConfig(
            local_epochs=local_epochs, local_steps=local_steps, precision=precision,
            accelerator=accelerator, seed=seed, gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm, fit_with=fit_with,
            num_threads=num_threads, onednn=onednn,
            dp_sgd=dp_sgd.settings() if dp_sgd is not None else None, deterministic=deterministic,
        )  # fmt: skip
        self.client_sampling = client_sampling
        self.privacy = PrivacyReport(dp_sgd)
        self.seed = seed
        self.eval_every = eval_every
        self.val_clients = val_clients
        self.run_dir = Path(run_dir if run_dir is not None else "runs/run")
        self.checkpoint_every = checkpoint_every
        self.min_clients = min_clients
        self.on_round_failure = on_round_failure
        self.store = ClientStore(client_state, self.run_dir / "client_state")
        self.reporter = Reporter(
            self.run_dir, loggers or (), wandb,
            dict(project=wandb_project, group=wandb_group, tags=wandb_tags, name=wandb_name),
            progress_bar, plots, log_every,
        )  # fmt: skip
        self.history: list[dict[str, float]] = []
        self.overwrite = overwrite
        self.max_skipped_fraction = max_skipped_fraction
        self.summary = RunSummary()
        #: the resolved config the CLI writes to ``run_dir/config.yaml`` once every check passed
        self.config_text: str | None = None
        self.communication = CommunicationMeter()
        self.target = TargetTracker(target_acc)
        #: what start-up resolved for the current (or last) ``fit`` (:func:`prepare_run`)
        self.run_state: RunState | None = None

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
        self.run_state = run = prepare_run(self, model, datamodule, ckpt_path)
        if run.checkpoint is not None:
            self._resume_records(run.checkpoint)
            if run.first_round >= self.rounds:  # nothing to train: the run's files stay as they are
                return self.history[-1] if self.history else {}
        overwrite = self.overwrite and run.checkpoint is None  # a resume rewrites its history
        with RunDirectory(self.run_dir, overwrite, resuming=run.resumes_in_place or self.overwrite):
            with (
                cpu_compute(self.fit_config.num_threads, self.fit_config.onednn),
                deterministic_compute(self.fit_config.deterministic),
                quiet_lightning(),
                stop_on_signals(),  # SIGINT and SIGTERM alike, Trainer fits included
            ):
                try:
                    self.backend.start(
                        model, datamodule, run.fit_config, run.compute, self.reporter.client_done
                    )
                    return self._run(model, datamodule, run)
                except (KeyboardInterrupt, StopSignal) as stop:
                    raise interrupted(self._newest_checkpoint(), signal_number(stop)) from None
                except OSError as error:  # the run's own files: never a client failure
                    raise storage_error(error, self.run_dir, "write the run's files") from None
                finally:
                    self.backend.stop()
                    self.store.close()

    def _resume_records(self, checkpoint: dict[str, Any]) -> None:
        """The loop's own records of a resumed run: its history and meters."""
        self.history = list(checkpoint["history"])
        meters = checkpoint.get("meters", {})
        self.communication.load_state_dict(meters.get("communication", {}))
        self.target.load_state_dict(meters.get("target", {}))
        self.privacy.load_state_dict(meters.get("privacy", {}))

    # -- the rounds -----------------------------------------------------------------------------
    def _run(self, model: ClientModule, dm: FederatedDataModule, run: RunState) -> dict[str, float]:
        open_run(self, model, dm, run)
        writer = CheckpointWriter(type(self.aggregator).__name__)
        try:
            metrics, unsaved, started = self._rounds(model, dm, run, writer)
        except BaseException:  # the checkpoint in flight lands before the error goes up
            writer.close(raise_error=False)
            raise
        writer.close()  # and before global.pt
        return self._finish(metrics, unsaved, started, dm.num_clients, run.scoring)

    def _rounds(
        self, model: ClientModule, dm: FederatedDataModule, run: RunState, writer: CheckpointWriter
    ) -> tuple[dict[str, float], str | None, float]:
        """The rounds: the last evaluated metrics, why the final model must not be saved
        (``None``: it is finite) and when the rounds started."""
        start_round, per_round = run.first_round, run.clients_per_round
        evaluator = Evaluator(run.scoring, self.seed, self.val_clients)
        metrics: dict[str, float] = self.history[-1] if self.history else {}
        guard = ServerGuard(self.aggregator, self.summary, self.on_round_failure)
        started = time.perf_counter()
        with self.reporter.progress(self.rounds, start_round) as advance:
            for r in range(start_round, self.rounds):
                round_start = time.perf_counter()
                writer.poll()  # a failed background checkpoint write stops the run here
                client_ids = round_clients(
                    self.client_sampling, self.seed, r, dm.num_clients, per_round, run.sampling_rate
                )
                payloads = self.aggregator.configure_round(r, client_ids)
                jobs = [ClientJob(r, cid, payloads[cid], self.store.get(cid)) for cid in client_ids]
                with self.reporter.watch_round(r, len(jobs)):  # Poisson sampling may draw none
                    results = run.server.arrivals(self.backend.run(r, jobs)) if jobs else {}
                traffic = self.communication.count(jobs, results)
                outcome = sort_results(
                    r, client_ids, results, payloads, self.summary,
                    frozenset(self.aggregator.required_upload_extras), self.precision,
                )  # fmt: skip
                if jobs:
                    check_for_bug(r, r == start_round, outcome)
                for cid, result in outcome.results:
                    self.store.put(cid, result.state)
                self.privacy.update(outcome.results)
                uploads = outcome.uploads
                if run.adversary is not None:  # one place for every backend: after the fits
                    uploads = run.adversary.corrupt(r, uploads, payloads)
                # client-level DP releases every round, also one with no upload
                aggregates = len(uploads) >= self.min_clients or (
                    self.aggregator.releases_every_round
                )
                # a round beyond the rule's breakdown point fails (logged, counted, or stops)
                admitted = (
                    not aggregates
                    or run.adversary is None
                    or run.adversary.admits(
                        r, uploads, self.aggregator, self.summary, self.on_round_failure
                    )
                )
                self.summary.record_round(aggregates and admitted, drew_clients=bool(jobs))
                if aggregates and admitted:
                    guard.aggregate(r, uploads)  # undone if it leaves NaN/Inf in the state
                elif not jobs:  # Poisson sampling drew no client: nothing failed
                    log.info("round %d: Poisson sampling drew no client", r + 1)
                elif self.on_round_failure == "stop":
                    writer.wait()  # the message names the checkpoint on disk
                    self._stop(r, len(uploads), len(jobs))
                elif admitted:
                    log.warning(
                        "round %d: only %d of %d clients succeeded (min_clients=%d): aggregation skipped",
                        r + 1, len(uploads), len(jobs), self.min_clients,
                    )  # fmt: skip
                last = r == self.rounds - 1
                if (r + 1) % self.eval_every == 0 or last:
                    metrics = {
                        "round": r + 1,
                        **evaluator.evaluate(
                            dm,
                            self.aggregator.deployables(),
                            [u.client_id for u in uploads],
                            self.store,
                            r,
                        ),  # fmt: skip
                        "train_loss": _mean(
                            [u.metrics.get("train_loss", math.nan) for u in uploads]
                        ),
                        "clients_failed": len(outcome.failed),
                        "clients_rejected": len(outcome.rejected),
                        "round_time_s": time.perf_counter() - round_start,
                        **traffic,
                        **self.aggregator.round_metrics(),
                        **(run.adversary.round_metrics(uploads) if run.adversary else {}),
                        **self.privacy.metrics(dm.num_clients),
                    }
                    self.target.add_time(metrics["round_time_s"])
                    if guard.evaluation_failed(r, metrics):  # state restored, row not logged
                        metrics = self.history[-1] if self.history else {}
                    else:
                        metrics.update(self.target.update(r + 1, metrics, last))
                        self.history.append(metrics)
                        self.reporter.log(metrics)
                        self.reporter.round_line(metrics, self.rounds, last)
                else:
                    self.target.add_time(time.perf_counter() - round_start)
                if (r + 1) % self.checkpoint_every == 0 or last:
                    self._save_checkpoint(run, r + 1, writer)
                advance(metrics)
        return metrics, guard.final_model_problem(self.aggregator.global_state()), started

    def _finish(
        self, metrics: dict[str, float], unsaved: str | None, started: float, num_clients: int,
        scoring: ScoringModel,
    ) -> dict[str, float]:  # fmt: skip
        """After the rounds and their last checkpoint write: ``global.pt`` and ``models.pt``
        (every deployable, as ``scoring`` scores it; unless ``unsaved`` says why not), the summary
        (privacy spent over the ``num_clients`` clients) and the run's verdict."""
        if unsaved is None:
            atomic_save(self.aggregator.global_state(), self.run_dir / "global.pt")
            deployables = self.aggregator.deployables()
            scoring.prepare(self.store, deployables)
            save_models(scoring.saved(deployables), self.rounds, self.run_dir)
        self.reporter.close()
        self.reporter.summary(
            [*self.summary.lines(), *self.privacy.lines(self.aggregator, num_clients)]
        )
        failure = unsaved or self.summary.verdict(self.max_skipped_fraction)
        if failure is not None:
            raise RunStopped(f"run failed: {failure}; results are in {self.run_dir}")
        finished()  # every file is complete: a signal from now on changes nothing
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
    def _save_checkpoint(self, run: RunState, rounds_done: int, writer: CheckpointWriter) -> None:
        clients = self.store.state_dict()
        checkpoint = make_checkpoint(
            rounds_done, run.identity, self.aggregator.state_dict(), clients,
            self.history, {"wandb": self.reporter.wandb_id()},
            {"communication": self.communication.state_dict(), "target": self.target.state_dict(),
             "privacy": self.privacy.state_dict()},
        )  # fmt: skip
        path = self.run_dir / "last.ckpt"

        def written() -> None:  # on the loop's thread, once the file is on disk
            run.last_checkpoint = (rounds_done, str(path))
            self.store.commit(clients)  # the state files this checkpoint no longer needs

        writer.submit(checkpoint, path, written)

    def _newest_checkpoint(self) -> tuple[int, str] | None:
        """``(rounds, path)`` of the checkpoint that resumes this run now: the file on disk is the
        truth (a Ctrl-C may land between its rename and the bookkeeping after it)."""
        path = self.run_dir / "last.ckpt"
        try:
            return int(read_checkpoint(str(path))["round"]), str(path)
        except ConfigurationError:
            return self.run_state.last_checkpoint if self.run_state is not None else None


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan
