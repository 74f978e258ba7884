"""FederatedLoop: runs rounds; the LightningCLI ``trainer_class`` (config key ``loop``).

A round reads as the algorithm (:meth:`FederatedLoop._round`): sample clients from
``(seed, round)``, dispatch the aggregator's payloads, train on the backend, screen the results
(the failure policy), aggregate, evaluate, record. Every feature around it (the communication
meter, the targets, the privacy report, the adversary, the server guard, the checkpoint writer)
is a round component that start-up builds once per run and the round calls at named points
(:mod:`fedlightning.round_components`, docs/algorithms.md section 6.2). The loop knows that
protocol, the payload/upload contract (:mod:`fedlightning.protocol`) and the Backend protocol,
and nothing of what an objective optimises, how an aggregator combines, how a backend fits or
what a component does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.loggers import Logger

from fedlightning.attacks.base import Attack
from fedlightning.backends.auto import AutoBackend
from fedlightning.backends.base import Backend
from fedlightning.clients.base import ClientModule
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.determinism import deterministic_compute, prepare_environment
from fedlightning.errors import ConfigurationError
from fedlightning.loop.arguments import check_arguments
from fedlightning.loop.checkpoint import read_checkpoint
from fedlightning.loop.options import RunOptions, fit_config_from, reporter_from
from fedlightning.loop.rounds import Rounds
from fedlightning.loop.run_state import RunState
from fedlightning.loop.rundir import RunDirectory, interrupted, storage_error
from fedlightning.loop.startup import open_run, prepare_run
from fedlightning.loop.summary import RunSummary
from fedlightning.privacy.dp_sgd import DPSGD
from fedlightning.round_components import Row
from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg
from fedlightning.signals import StopSignal, signal_number, stop_on_signals
from fedlightning.state import ClientStore
from fedlightning.tracking import wandb_storage_error
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
    :mod:`fedlightning.loop.checkpoint_writer`). The rounds run in
    :class:`~fedlightning.loop.rounds.Rounds`, the features around them as round components
    (docs/algorithms.md section 6.2). ``__init__`` is over 60 lines by its signature alone: one
    argument per option of the CLI's ``loop:`` section; its body checks them and builds the
    loop's parts.

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
    ) -> None:
        self.init_args = {k: v for k, v in locals().items() if k != "self"}  # config.yaml
        check_arguments(**self.init_args)
        prepare_environment(deterministic)  # cuBLAS reads it when CUDA starts: before any fit
        self.rounds, self.clients_per_round, self.seed = rounds, clients_per_round, seed
        self.aggregator = aggregator if aggregator is not None else FedAvg()
        self.backend = backend if backend is not None else AutoBackend()
        self.attack, self.dp_sgd, self.target_acc = attack, dp_sgd, target_acc
        self.fit_config = fit_config_from(self.init_args)
        self.client_sampling, self.eval_every, self.val_clients = (
            client_sampling,
            eval_every,
            val_clients,
        )
        self.run_dir = Path(run_dir if run_dir is not None else "runs/run")
        self.checkpoint_every, self.min_clients = checkpoint_every, min_clients
        self.on_round_failure, self.max_skipped_fraction = on_round_failure, max_skipped_fraction
        self.overwrite = overwrite
        self.store = ClientStore(client_state, self.run_dir / "client_state")
        self.reporter = reporter_from(self.init_args, self.run_dir)
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

    def start_options(self) -> RunOptions:
        """What start-up, the rounds and the round components read of this loop, taken now."""
        names = RunOptions.__dataclass_fields__
        return RunOptions(**{name: getattr(self, name) for name in names})

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
        options = self.start_options()
        self.run_state = run = prepare_run(options, model, datamodule, ckpt_path)
        if run.checkpoint is not None:
            self.history[:] = run.checkpoint["history"]
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
                    open_run(options, model, datamodule, run)
                    return Rounds(options, run, datamodule).run()
                except (KeyboardInterrupt, StopSignal) as stop:
                    raise interrupted(self._newest_checkpoint(), signal_number(stop)) from None
                except OSError as error:  # the run's own files (or W&B's): never a client's
                    what = wandb_storage_error(error)  # W&B's folders under HOME are not the run's
                    raise what or storage_error(
                        error, self.run_dir, "write the run's files"
                    ) from None
                finally:
                    self.reporter.release()  # a failed run's loggers (a finished run's are closed)
                    self.backend.stop()
                    self.store.close()

    def _newest_checkpoint(self) -> tuple[int, str] | None:
        """``(rounds, path)`` of the checkpoint that resumes this run now: the file on disk is the
        truth (a Ctrl-C may land between its rename and the bookkeeping after it)."""
        path = self.run_dir / "last.ckpt"
        try:
            return int(read_checkpoint(str(path))["round"]), str(path)
        except ConfigurationError:
            return self.run_state.last_checkpoint if self.run_state is not None else None
