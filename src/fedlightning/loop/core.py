"""FederatedLoop: runs rounds; the LightningCLI ``trainer_class`` (config key ``loop``).

It takes the run's options (grouped at construction, :mod:`fedlightning.loop.options`), its parts
(aggregator, backend, round components) and runs ``fit``: start-up
(:mod:`fedlightning.loop.startup`), then the rounds (:mod:`fedlightning.loop.rounds`, where a
round reads as the algorithm and every feature around it is a round component, docs/algorithms.md
section 6.2), inside the locked run directory.
"""

from __future__ import annotations

from typing import Any, Literal

from lightning.pytorch.loggers import Logger

from fedlightning.attacks.base import Attack
from fedlightning.backends.auto import AutoBackend
from fedlightning.backends.base import Backend
from fedlightning.clients.base import ClientModule
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.determinism import check_deterministic, deterministic_compute, prepare_environment
from fedlightning.errors import ConfigurationError
from fedlightning.loop.arguments import (
    check_backend,
    check_fit_config,
    client_store,
    dp_sgd_settings,
)
from fedlightning.loop.checkpoint import read_checkpoint
from fedlightning.loop.components import configured_components
from fedlightning.loop.options import RunOptions, RunParts, run_directory
from fedlightning.loop.reporting import Reporter
from fedlightning.loop.rounds import Rounds
from fedlightning.loop.run_state import RunState
from fedlightning.loop.rundir import RunDirectory, interrupted, storage_error
from fedlightning.loop.startup import open_run, prepare_run
from fedlightning.loop.summary import RunSummary
from fedlightning.privacy.dp_sgd import DPSGD
from fedlightning.protocol import FitConfig
from fedlightning.recorded_args import RecordsInitArgs, recorded_init_args
from fedlightning.round_components import RoundComponent, Row
from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg
from fedlightning.signals import StopSignal, signal_number, stop_on_signals
from fedlightning.tracking import wandb_storage_error
from fedlightning.training import cpu_compute, quiet_lightning

__all__ = ["FederatedLoop"]


class FederatedLoop(RecordsInitArgs):
    """Runs federated training rounds.

    Each round ``r`` (0-based): sample ``clients_per_round`` clients from ``(seed, r)``; ask the
    aggregator for their payloads; fit each client's module for ``local_epochs`` epochs (or
    ``local_steps`` optimizer steps) on the ``backend``, seeded from ``(seed, r, client)``;
    aggregate the successful uploads; every ``eval_every`` rounds evaluate; report; checkpoint
    (:class:`~fedlightning.loop.rounds.Rounds`; the features around a round are round
    components, docs/algorithms.md section 6.2). ``__init__`` is over 60 lines by its signature
    alone: one argument per option of the CLI's ``loop:`` section; its body puts each, by name,
    in its group (:mod:`fedlightning.loop.options`), where it is checked.

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
            ``all``, or K: every client when there are at most K, otherwise K sampled from
            ``(seed, round)`` afresh each evaluated round (:mod:`fedlightning.loop.evaluation`).
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
        client_state: keep per-client state in ``memory`` (in every checkpoint) or on ``disk``
            under ``run_dir/client_state`` (a file per client: :mod:`fedlightning.state.disk`).
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
        num_threads: torch intra-op threads during the run; default 1: with a second thread
            the shipped configs' rounds took 15 to 72 times as long on a loaded 2-core machine,
            and the count decides how a reduction is split, so the default gives the same bits
            on machines with any number of cores (``benchmarks/defaults.py``,
            docs/algorithms.md section 9.3). Parallelism across clients comes from the cohort
            or Ray; more threads suit a large model on an idle machine (null: the process's
            setting, torch's one per core unless ``OMP_NUM_THREADS`` says otherwise). Part of
            the run's identity.
        onednn: use oneDNN (MKL-DNN) CPU kernels during the run. Off by default: torch 2.14.1's
            oneDNN convolution backward corrupted the heap (the process aborts) on this project's
            CPUs; see :func:`fedlightning.training.cpu_compute`. No effect on GPU kernels.
        target_acc: shorthand for the target tracker's ``target`` (a
            :class:`~fedlightning.loop.targets.TargetTracker` in ``components``): report the first
            evaluated round (and the wall time) at which ``test_acc`` reaches this value
            (``rounds_to_target``, ``time_to_target_s``); null: off.
        overwrite: replace the results of an earlier run in ``run_dir`` (by default a run refuses
            a directory holding another run's results unless it resumes from ``ckpt_path``; see
            :mod:`fedlightning.loop.rundir`).
        log_every: with stderr not a terminal (a cluster log), print one plain line every this
            many rounds (at evaluated rounds).
        max_skipped_fraction: the run fails (exit status 1 from the CLI) when more than this
            fraction of its rounds skipped aggregation, or when no round aggregated.
        attack: shorthand for the adversary's ``attack`` (an
            :class:`~fedlightning.loop.components.Adversary` in ``components``): Byzantine
            clients for robustness experiments (``fedlightning.attacks``: a seeded fraction or a
            list of malicious clients and what they do; docs/algorithms.md section 8.1); every
            evaluated row then has ``malicious_uploads``. Null: none.
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
        components: round components of the run besides the built-ins, each by ``class_path``
            and ``init_args`` (yours, or the built-in ``TargetTracker`` and ``Adversary`` the
            shorthands ``target_acc`` and ``attack`` also configure: one spelling per run); they
            run after the built-ins, in the order listed (:mod:`fedlightning.loop.components`,
            docs/algorithms.md section 6.2; time: ``SystemModel``, ``FedBuff``, ``FedAsync``,
            sections 6.3-6.4). Part of the run's identity.
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
        num_threads: int | None = 1,
        onednn: bool = False,
        overwrite: bool = False,
        log_every: int = 1,
        max_skipped_fraction: float = 0.5,
        target_acc: float | None = None,
        attack: Attack | None = None,
        client_sampling: Literal["fixed", "poisson"] = "fixed",
        dp_sgd: DPSGD | None = None,
        deterministic: bool | Literal["warn"] = True,
        components: list[RoundComponent] | None = None,
    ) -> None:
        check_deterministic(deterministic)
        prepare_environment(deterministic)  # cuBLAS reads it when CUDA starts: before any fit
        self.options = RunOptions(
            rounds=rounds, clients_per_round=clients_per_round, client_sampling=client_sampling,
            min_clients=min_clients, seed=seed, eval_every=eval_every, val_clients=val_clients,
            run_dir=run_directory(run_dir), overwrite=overwrite,
            checkpoint_every=checkpoint_every, on_round_failure=on_round_failure,
            max_skipped_fraction=max_skipped_fraction,
        )  # fmt: skip
        self.fit_config = FitConfig(
            local_epochs=local_epochs, local_steps=local_steps, precision=precision,
            accelerator=accelerator, seed=seed, gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm, fit_with=fit_with,
            num_threads=num_threads, onednn=onednn, dp_sgd=dp_sgd_settings(dp_sgd),
            deterministic=deterministic,
        )  # fmt: skip
        check_fit_config(self.fit_config, devices)
        self.reporter = Reporter(
            self.options.run_dir, loggers or (), wandb,
            {"project": wandb_project, "group": wandb_group, "tags": wandb_tags, "name": wandb_name},
            progress_bar, plots, log_every,
        )  # fmt: skip
        self.aggregator = aggregator if aggregator is not None else FedAvg()
        self.backend = AutoBackend() if check_backend(backend) is None else backend
        self.components = configured_components(components, attack, target_acc)
        self.store = client_store(client_state, self.options.run_dir)
        self.history: list[Row] = []
        self.summary = RunSummary()
        #: the resolved config the CLI writes to ``run_dir/config.yaml`` once every check passed
        self.config_text: str | None = None
        #: what start-up resolved for the current (or last) ``fit`` (:func:`prepare_run`)
        self.run_state: RunState | None = None

    @property
    def precision(self) -> str:
        return self.fit_config.precision

    @property
    def console(self):
        """The rich console progress and the closing line go to (``console.quiet = True`` mutes it)."""
        return self.reporter.console

    def parts(self) -> RunParts:
        """What start-up, the rounds and the round components read of this loop, taken now."""
        return RunParts(
            options=self.options, fit_config=self.fit_config, aggregator=self.aggregator,
            backend=self.backend, components=self.components, store=self.store,
            reporter=self.reporter, history=self.history, summary=self.summary,
            config_text=self.config_text, loop_args=recorded_init_args(self) or {},
        )  # fmt: skip

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
        parts = self.parts()
        self.run_state = run = prepare_run(parts, model, datamodule, ckpt_path)
        if run.checkpoint is not None:
            self.history[:] = run.checkpoint["history"]
        if run.nothing_to_train:  # decided (and said) by start-up: the run's files stay as they are
            return self.history[-1] if self.history else {}
        run_dir, overwrite = self.options.run_dir, self.options.overwrite
        with RunDirectory(
            run_dir, overwrite and run.checkpoint is None,  # a resume rewrites its history
            resuming=run.resumes_in_place or overwrite,
        ):  # fmt: skip
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
                    open_run(parts, model, datamodule, run)
                    return Rounds(parts, run, datamodule).run()
                except (KeyboardInterrupt, StopSignal) as stop:
                    raise interrupted(self._newest_checkpoint(), signal_number(stop)) from None
                except OSError as error:  # the run's own files (or W&B's): never a client's
                    what = wandb_storage_error(error)  # W&B's folders under HOME are not the run's
                    raise what or storage_error(error, run_dir, "write the run's files") from None
                finally:
                    self.reporter.release()  # a failed run's loggers (a finished run's are closed)
                    self.backend.stop()
                    self.store.close()

    def _newest_checkpoint(self) -> tuple[int, str] | None:
        """``(rounds, path)`` of the checkpoint that resumes this run now: the file on disk is the
        truth (a Ctrl-C may land between its rename and the bookkeeping after it)."""
        path = self.options.run_dir / "last.ckpt"
        try:
            return int(read_checkpoint(str(path))["round"]), str(path)
        except ConfigurationError:
            return self.run_state.last_checkpoint if self.run_state is not None else None
