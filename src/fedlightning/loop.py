"""FederatedLoop: sample clients, dispatch, fit each with a lean Lightning Trainer, aggregate,
evaluate, log and checkpoint; the LightningCLI ``trainer_class`` (config key ``loop``).

The loop knows the payload/upload contract (:mod:`fedlightning.protocol`) and nothing of what a
client objective optimises or how an aggregator combines.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
import traceback
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger, Logger
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedlightning.analysis.plots import plot_curves, plot_partition
from fedlightning.clients.base import ClientModule
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.data.loader import TensorBatches
from fedlightning.errors import ConfigurationError, RunStopped, require
from fedlightning.protocol import Payload, Upload
from fedlightning.seeding import derive_seed, seed_fit
from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg
from fedlightning.state import ClientStore
from fedlightning.training import (
    cpu_compute,
    direct_fit,
    direct_fit_refusal,
    lean_trainer,
    quiet_lightning,
)

log = logging.getLogger("fedlightning")

CHECKPOINT_FORMAT = "fedlightning-checkpoint-1"
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "64-true")


def sample_clients(seed: int, round_index: int, num_clients: int, per_round: int) -> list[int]:
    """The clients of round ``round_index``: ``per_round`` distinct ids drawn uniformly without
    replacement from a generator seeded by ``(seed, round_index)`` only, in draw order."""
    gen = torch.Generator().manual_seed(derive_seed(seed, "sample", round_index))
    return torch.randperm(num_clients, generator=gen)[:per_round].tolist()


class FederatedLoop:
    """Runs federated training rounds.

    Each round ``r`` (0-based): sample ``clients_per_round`` clients from ``(seed, r)``; ask the
    aggregator for their payloads; fit each client's module for ``local_epochs`` epochs (or
    ``local_steps`` optimizer steps) with a Trainer that has no logger, checkpointing, progress bar
    or sanity check, seeded from ``(seed, r, client)``; aggregate the successful uploads; every
    ``eval_every`` rounds evaluate the deployable model(s) on the global test set and on every
    client's validation split; log; checkpoint atomically.

    Args:
        rounds: number of communication rounds R.
        clients_per_round: clients sampled per round, an int K or a fraction of ``num_clients``.
        local_epochs: local epochs E per client fit.
        local_steps: if set, train exactly this many optimizer steps per fit instead of epochs.
        aggregator: the server algorithm (default ``FedAvg()``).
        precision: Lightning precision of every client fit and evaluation.
        accelerator: Lightning accelerator (``auto``, ``cpu``, ``gpu``...).
        devices: devices per client fit (one; several GPUs are reached through a backend).
        seed: seeds sampling, client fits, model initialisation (CLI) and the partition.
        eval_every: evaluate every this many rounds (and always after the last round).
        run_dir: where ``config.yaml``, ``partition.csv``, ``metrics.csv``, ``last.ckpt`` and
            ``global.pt`` go (default ``runs/<config name>`` from the CLI, ``runs/run`` otherwise).
        checkpoint_every: write ``last.ckpt`` every this many rounds (and after the last round).
        min_clients: a round aggregates only if at least this many uploads succeed.
        on_round_failure: ``skip`` the aggregation of a round with fewer than ``min_clients``
            successful uploads (the server state stays as it was), or ``stop`` the run.
        wandb: also log to Weights & Biases (offline unless ``WANDB_API_KEY`` is set).
        wandb_project, wandb_group, wandb_tags, wandb_name: W&B run settings.
        client_state: keep per-client state in ``memory`` or on ``disk`` under
            ``run_dir/client_state`` (bounded memory for thousands of stateful clients).
        plots: write ``partition.png`` and ``curves.png`` to the run directory.
        progress_bar: show a rich progress bar over rounds.
        direct_fit: fit a client whose module needs no Trainer machinery (automatic optimization,
            ``32-true``, ``bf16-mixed`` or ``16-mixed``, no batch-transfer/clipping/scheduler
            hooks) with
            :func:`fedlightning.training.direct_fit`: the same hooks and steps as ``Trainer.fit``
            (bitwise equal results) without its per-fit setup; other clients, and all of them
            when this is off, get a lean Trainer each.
        cohort: train all sampled clients of a round at once (:mod:`fedlightning.backends.cohort`:
            ``torch.func.vmap`` over stacked per-client parameters); for ClientModule/FedProx with
            SGD, full precision and no BatchNorm/dropout, refused otherwise. Equal to the sequential
            fits up to floating-point rounding.
        num_threads: torch intra-op threads during the run (null: torch's default). Small models
            gain little from several threads, and they oversubscribe a busy machine.
        onednn: use oneDNN (MKL-DNN) CPU kernels during the run. Off by default: torch 2.14.1's
            oneDNN convolution backward corrupted the heap (the process aborts) on this project's
            CPUs; see :func:`fedlightning.training.cpu_compute`. No effect on GPU kernels.
        backend: run client fits one after the other in this process (``sequential``) or on
            long-lived Ray actors that keep the data (``ray``, :mod:`fedlightning.backends.ray`;
            needs the ``ray`` extra). Results do not depend on the backend.
        ray_address: Ray cluster to join (``null``: start a local instance).
        num_workers: Ray actors (``null``: one per GPU when ``num_gpus_per_client > 0``, else one
            per CPU divided by ``num_cpus_per_client``).
        num_gpus_per_client: GPUs (or a fraction of one) each Ray actor holds.
        num_cpus_per_client: CPUs (and torch threads) each Ray actor holds.
    """

    def __init__(
        self,
        rounds: int = 10,
        clients_per_round: int | float = 10,
        local_epochs: int = 1,
        local_steps: int | None = None,
        aggregator: Aggregator | None = None,
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
        wandb: bool = False,
        wandb_project: str = "fedlightning",
        wandb_group: str | None = None,
        wandb_tags: list[str] | None = None,
        wandb_name: str | None = None,
        progress_bar: bool = True,
        direct_fit: bool = True,
        cohort: bool = False,
        backend: Literal["sequential", "ray"] = "sequential",
        ray_address: str | None = None,
        num_workers: int | None = None,
        num_gpus_per_client: float = 0.0,
        num_cpus_per_client: int = 1,
        num_threads: int | None = None,
        onednn: bool = False,
    ) -> None:
        require(rounds >= 1, "loop.rounds", rounds, "an integer >= 1")
        require(
            num_threads is None or num_threads >= 1,
            "loop.num_threads",
            num_threads,
            "null or an integer >= 1",
        )
        require(
            clients_per_round > 0 and (isinstance(clients_per_round, int) or clients_per_round <= 1),
            "loop.clients_per_round", clients_per_round, "an integer >= 1 or a fraction in (0, 1]",
        )  # fmt: skip
        require(local_epochs >= 1, "loop.local_epochs", local_epochs, "an integer >= 1")
        require(
            local_steps is None or local_steps >= 1,
            "loop.local_steps",
            local_steps,
            "null or an integer >= 1",
        )
        require(
            precision in PRECISIONS, "loop.precision", precision, f"one of {', '.join(PRECISIONS)}"
        )
        require(devices == 1, "loop.devices", devices, "1 (each client fit uses one device)")
        require(eval_every >= 1, "loop.eval_every", eval_every, "an integer >= 1")
        require(checkpoint_every >= 1, "loop.checkpoint_every", checkpoint_every, "an integer >= 1")
        require(min_clients >= 1, "loop.min_clients", min_clients, "an integer >= 1")
        require(
            on_round_failure in ("skip", "stop"),
            "loop.on_round_failure",
            on_round_failure,
            "'skip' or 'stop'",
        )
        require(
            client_state in ("memory", "disk"),
            "loop.client_state",
            client_state,
            "'memory' or 'disk'",
        )
        self.rounds = rounds
        self.clients_per_round = clients_per_round
        self.local_epochs = local_epochs
        self.local_steps = local_steps
        self.aggregator = aggregator if aggregator is not None else FedAvg()
        self.precision = precision
        self.accelerator = accelerator
        self.devices = devices
        self.seed = seed
        self.eval_every = eval_every
        self.run_dir = Path(run_dir if run_dir is not None else "runs/run")
        self.checkpoint_every = checkpoint_every
        self.min_clients = min_clients
        self.on_round_failure = on_round_failure
        self.wandb = wandb
        self.wandb_settings = dict(
            project=wandb_project, group=wandb_group, tags=wandb_tags, name=wandb_name
        )
        self.progress_bar = progress_bar
        self.direct_fit = direct_fit
        require(backend in ("sequential", "ray"), "loop.backend", backend, "'sequential' or 'ray'")
        require(
            not (cohort and backend == "ray"),
            "loop.cohort",
            cohort,
            "false with loop.backend='ray'",
        )
        require(
            num_workers is None or num_workers >= 1,
            "loop.num_workers",
            num_workers,
            "null or an integer >= 1",
        )
        require(
            num_gpus_per_client >= 0,
            "loop.num_gpus_per_client",
            num_gpus_per_client,
            "a number >= 0",
        )
        require(
            num_cpus_per_client >= 1,
            "loop.num_cpus_per_client",
            num_cpus_per_client,
            "an integer >= 1",
        )
        self.cohort = cohort
        self.backend = backend
        self.num_threads = num_threads
        self.onednn = onednn
        self.ray_settings = dict(
            address=ray_address, num_workers=num_workers, num_gpus_per_client=num_gpus_per_client,
            num_cpus_per_client=num_cpus_per_client,
        )  # fmt: skip
        self._remote: Any = None  # the started Ray backend and what it was started with
        self._device: torch.device | None = None
        self.plots = plots
        self.store = ClientStore(client_state, self.run_dir / "client_state")
        self.history: list[dict[str, float]] = []
        self.loggers: list[Logger] = []
        self.console = Console(stderr=True)

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
        datamodule.setup("fit")
        per_round = self.resolve_clients_per_round(datamodule.num_clients)
        self._check_pairing(model)
        classes = getattr(model, "num_classes", None)
        if classes is not None and classes < datamodule.num_classes:
            raise ConfigurationError(
                f"model num_classes={classes} but the {datamodule.dataset!r} labels run up to "
                f"{datamodule.num_classes - 1}: use num_classes >= {datamodule.num_classes}"
            )
        try:
            with cpu_compute(self.num_threads, self.onednn), quiet_lightning():
                return self._run(model, datamodule, per_round, ckpt_path)
        finally:
            self._stop_remote()

    def resolve_clients_per_round(self, num_clients: int) -> int:
        """K from ``clients_per_round`` (an int, or a fraction of N rounded up)."""
        value = self.clients_per_round
        per_round = math.ceil(value * num_clients) if isinstance(value, float) else value
        if per_round > num_clients:
            raise ConfigurationError(
                f"clients_per_round={value} exceeds num_clients={num_clients}: choose at most {num_clients}"
            )
        if self.min_clients > per_round:
            raise ConfigurationError(
                f"min_clients={self.min_clients} exceeds clients_per_round={per_round}: choose at most {per_round}"
            )
        return per_round

    # -- the rounds -----------------------------------------------------------------------------
    def _run(
        self, model: ClientModule, dm: FederatedDataModule, per_round: int, ckpt_path: str | None
    ) -> dict[str, float]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.run_dir.glob(".last.ckpt.tmp-*"):  # left by a run killed mid-write
            stale.unlink()
        if self.backend == "sequential":  # Ray workers place their own copy
            self.place_training_data(dm)
        dm.save_partition(self.run_dir / "partition.csv")
        if self.plots:
            plot_partition(
                dm.partition_table(),
                self.run_dir / "partition.png",
                title=f"{dm.dataset} partition",
            )
        initial = {
            k: v.detach().to("cpu", copy=True) for k, v in model.network.state_dict().items()
        }
        # each client's group and keys; None unless clients' architectures differ
        client_keys = model.client_key_sets(dm.num_clients)
        if client_keys is None:
            self.aggregator.setup(initial, dm.num_clients, self.seed)
        else:
            agg = type(self.aggregator).__name__
            require(
                self.aggregator.heterogeneous,
                "loop.aggregator",
                agg,
                "one for heterogeneous clients (HeteroAvg, InCo...)",
            )
            self.aggregator.setup(initial, dm.num_clients, self.seed, client_keys=client_keys)
        start_round, wandb_id = 0, None
        if ckpt_path:
            start_round, wandb_id = self._restore(ckpt_path, dm)
        self._open_loggers(wandb_id, dm)
        metrics: dict[str, float] = self.history[-1] if self.history else {}
        started = time.perf_counter()
        with self._progress(start_round) as (progress, task):
            for r in range(start_round, self.rounds):
                round_start = time.perf_counter()
                client_ids = sample_clients(self.seed, r, dm.num_clients, per_round)
                payloads = self.aggregator.configure_round(r, client_ids)
                uploads, failed, rejected = self._fit_clients(model, dm, r, client_ids, payloads)
                if len(uploads) >= self.min_clients:
                    self.aggregator.aggregate(r, uploads)
                elif self.on_round_failure == "stop":
                    checkpoint = self.run_dir / "last.ckpt"
                    resume = f"; --ckpt_path {checkpoint} resumes" if checkpoint.is_file() else ""
                    raise RunStopped(
                        f"round {r + 1}: only {len(uploads)} of {per_round} clients succeeded "
                        f"(min_clients={self.min_clients}); stopping as on_round_failure='stop'"
                        + resume
                    )
                else:
                    log.warning(
                        "round %d: only %d of %d clients succeeded (min_clients=%d): aggregation skipped",
                        r + 1, len(uploads), per_round, self.min_clients,
                    )  # fmt: skip
                last = r == self.rounds - 1
                if (r + 1) % self.eval_every == 0 or last:
                    metrics = {
                        "round": r + 1,
                        **self._evaluate(model, dm, [u.client_id for u in uploads]),
                    }
                    metrics["train_loss"] = _mean(
                        [u.metrics.get("train_loss", math.nan) for u in uploads]
                    )
                    metrics["clients_failed"] = len(failed)
                    metrics["clients_rejected"] = len(rejected)
                    metrics["round_time_s"] = time.perf_counter() - round_start
                    self._log(metrics)
                if (r + 1) % self.checkpoint_every == 0 or last:
                    self._save_checkpoint(r + 1, dm)
                progress.update(task, advance=1, description=_describe(metrics))
        torch.save(self.aggregator.global_state(), self.run_dir / "global.pt")
        self._close_loggers()
        if self.plots and self.history:
            plot_curves(self.run_dir)
        elapsed = time.perf_counter() - started
        if "test_acc" in metrics:
            self.console.print(
                f"[bold]done[/]: round {metrics['round']}/{self.rounds}, test_acc {metrics['test_acc']:.4f}, "
                f"{elapsed:.1f} s; run directory {self.run_dir}"
            )
        return metrics

    def _fit_clients(
        self,
        model: ClientModule,
        dm: FederatedDataModule,
        r: int,
        client_ids: Sequence[int],
        payloads: dict[int, Payload],
    ) -> tuple[list[Upload], list[int], list[int]]:
        """Fit every sampled client; a client that raises or uploads non-finite values is left out."""
        uploads: list[Upload] = []
        failed: list[int] = []
        rejected: list[int] = []
        cohort = self._fit_cohort(model, dm, r, client_ids, payloads) if self.cohort else None
        remote = (
            self._fit_remote(model, dm, r, client_ids, payloads) if self.backend == "ray" else None
        )
        for cid in client_ids:
            try:
                if cohort is not None:  # stateless objectives only: the state is unchanged
                    upload, new_state = cohort[cid], self.store.get(cid)
                elif remote is not None:
                    if isinstance(remote[cid], BaseException):
                        raise remote[cid]
                    upload, new_state = remote[cid]
                else:
                    upload, new_state = self._fit_client(model, dm, r, cid, payloads[cid])
            except (ConfigurationError, KeyboardInterrupt):
                raise
            except Exception:  # a failed client never loses the run
                log.error(
                    "round %d: client %d failed and is left out:\n%s",
                    r + 1,
                    cid,
                    traceback.format_exc(),
                )
                failed.append(cid)
                continue
            if not _all_finite(upload):
                log.warning(
                    "round %d: client %d uploaded NaN/Inf values and is left out", r + 1, cid
                )
                rejected.append(cid)
                continue
            self.store.put(cid, new_state)
            uploads.append(upload)
        return uploads, failed, rejected

    def _fit_client(
        self, model: ClientModule, dm: FederatedDataModule, r: int, cid: int, payload: Payload
    ) -> tuple[Upload, dict[str, Any]]:
        fit_seed = derive_seed(self.seed, "fit", r, cid)
        seed_fit(fit_seed)
        model.begin_client(cid, payload, self.store.get(cid))
        batches = dm.client_train_dataloader(cid, fit_seed)
        max_epochs, max_steps = (
            (-1 if self.local_steps else self.local_epochs),
            (self.local_steps or -1),
        )
        device = self._root_device()
        if self.direct_fit and direct_fit_refusal(model, self.precision, device) is None:
            num_steps = direct_fit(model, batches, device, self.precision, max_epochs, max_steps)
        else:
            trainer = self._trainer(max_epochs=max_epochs, max_steps=max_steps, limit_val_batches=0)
            trainer.fit(model, train_dataloaders=batches)
            num_steps = trainer.global_step
        weights, extras, new_state = model.end_client()
        upload = Upload(
            client_id=cid,
            weights=weights,
            num_samples=dm.client_num_samples(cid),
            num_steps=num_steps,
            extras=extras,
            model_index=payload.model_index,
            metrics=model.client_metrics(),
        )
        return upload, new_state

    def _fit_cohort(
        self,
        model: ClientModule,
        dm: FederatedDataModule,
        r: int,
        client_ids: Sequence[int],
        payloads: dict[int, Payload],
    ) -> dict[int, Upload]:
        from fedlightning.backends.cohort import check_cohort, fit_cohort

        check_cohort(model, self.precision)
        return fit_cohort(
            model,
            dm,
            self.seed,
            r,
            client_ids,
            payloads,
            self._root_device(),
            self.local_epochs,
            self.local_steps,
        )

    def _fit_remote(
        self,
        model: ClientModule,
        dm: FederatedDataModule,
        r: int,
        client_ids: Sequence[int],
        payloads: dict[int, Payload],
    ) -> dict[int, Any]:
        from fedlightning.backends.ray import RayBackend

        if self._remote is None or self._remote[1:] != (
            model,
            dm,
        ):  # actors hold this model and data
            backend = RayBackend(self, **self.ray_settings)
            backend.start(model, dm)
            self._remote = (backend, model, dm)
        return self._remote[0].fit(r, client_ids, payloads)

    def place_training_data(self, dm: FederatedDataModule) -> None:
        """Client data stays on the fitting device (a GPU) for the whole run when it fits."""
        device = self._root_device()
        if not dm.place_training_data(device):
            log.info("the training data does not fit on %s: batches are copied per step", device)

    def _stop_remote(self) -> None:
        """Give the Ray actors' CPUs/GPUs back to the cluster (a later fit starts new ones)."""
        if self._remote is not None:
            self._remote[0].stop()
            self._remote = None

    def _trainer(self, **kwargs: Any) -> pl.Trainer:
        return lean_trainer(self.accelerator, self.precision, self.devices, **kwargs)

    def _root_device(self) -> torch.device:
        """The device Lightning picks for ``accelerator``/``devices`` (resolved once)."""
        if self._device is None:
            self._device = self._trainer().strategy.root_device
        return self._device

    # -- evaluation -----------------------------------------------------------------------------
    def _evaluate(
        self, model: ClientModule, dm: FederatedDataModule, client_ids: Sequence[int] = ()
    ) -> dict[str, float]:
        """Each deployable model on the global test set (``test_acc``, ``test_loss``; other models
        prefixed by their name), the global model's mean client validation accuracy (``val_acc``),
        and the objective's own metrics over the round's participating ``client_ids``
        (:meth:`ClientModule.evaluate_clients`, e.g. FML's ``personal_acc``)."""
        results: dict[str, float] = {}
        trainer = self._trainer()
        for name, weights in self.aggregator.deployables().items():
            model.load_network_state(weights)
            prefix = "" if name == "global" else f"{name}/"
            for key, value in trainer.test(model, dataloaders=dm.test_dataloader(), verbose=False)[
                0
            ].items():
                results[prefix + key] = float(value)
        model.load_network_state(self.aggregator.global_state())
        x, y, owner = dm.client_val_data()
        if len(y):
            batches = _TripleBatches(x, y, owner, dm.eval_batch_size)
            results.update(
                {
                    k: float(v)
                    for k, v in trainer.validate(model, dataloaders=batches, verbose=False)[
                        0
                    ].items()
                }
            )
        device = trainer.strategy.root_device
        results.update(
            model.evaluate_clients(client_ids, self.store, dm.client_val_dataloader, device)
        )
        return results

    # -- logging --------------------------------------------------------------------------------
    def _open_loggers(self, wandb_id: str | None, dm: FederatedDataModule) -> None:
        self.loggers = [CSVLogger(save_dir=str(self.run_dir), name="", version="")]
        for row in self.history:  # a resumed run rewrites the rows up to its checkpoint
            self.loggers[0].log_metrics(row, step=int(row["round"]))
        if self.wandb:
            from fedlightning.tracking import log_run_description, make_wandb_logger

            logger = make_wandb_logger(self.run_dir, wandb_id, **self.wandb_settings)
            if wandb_id is None:  # a resumed W&B run already has them
                log_run_description(logger, self.run_dir / "config.yaml", dm.partition_table())
            self.loggers.append(logger)
        for logger in self.loggers:
            logger.save()

    def _log(self, metrics: dict[str, float]) -> None:
        self.history.append(metrics)
        for logger in self.loggers:
            logger.log_metrics(metrics, step=int(metrics["round"]))
            logger.save()

    def _close_loggers(self) -> None:
        for logger in self.loggers:
            logger.finalize("success")
            if logger.__class__.__name__ == "WandbLogger":
                logger.experiment.finish()  # flush and close the W&B run (WandbLogger leaves it open)

    def _wandb_id(self) -> str | None:
        for logger in self.loggers:
            if logger.__class__.__name__ == "WandbLogger":
                return logger.version
        return None

    @contextmanager
    def _progress(self, start_round: int):
        progress = Progress(
            TextColumn("[bold]rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=self.console, disable=not self.progress_bar,
        )  # fmt: skip
        with progress:
            task = progress.add_task("", total=self.rounds, completed=start_round)
            yield progress, task

    # -- checkpoints ----------------------------------------------------------------------------
    def _save_checkpoint(self, rounds_done: int, dm: FederatedDataModule) -> None:
        checkpoint = {
            "format": CHECKPOINT_FORMAT,
            "round": rounds_done,
            "seed": self.seed,
            "num_clients": dm.num_clients,
            "partition_hash": dm.partition_hash(),
            "aggregator": self.aggregator.state_dict(),
            "clients": self.store.state_dict(),
            "history": self.history,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "wandb_id": self._wandb_id(),
        }
        atomic_save(checkpoint, self.run_dir / "last.ckpt")
        self.store.commit()

    def _restore(self, ckpt_path: str, dm: FederatedDataModule) -> tuple[int, str | None]:
        path = Path(ckpt_path)
        if not path.is_file():
            raise ConfigurationError(f"ckpt_path={ckpt_path!r} does not exist")
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
            raise ConfigurationError(f"ckpt_path={ckpt_path!r} is not a fedlightning checkpoint")
        if checkpoint["seed"] != self.seed or checkpoint["partition_hash"] != dm.partition_hash():
            raise ConfigurationError(
                f"ckpt_path={ckpt_path!r} was written with seed {checkpoint['seed']} and another data "
                f"partition than this run (seed {self.seed}): resume with the same data and seed"
            )
        self.aggregator.load_state_dict(checkpoint["aggregator"])
        self.store.load_state_dict(checkpoint["clients"])
        self.history = list(checkpoint["history"])
        torch.set_rng_state(checkpoint["rng"]["torch"])
        random.setstate(_as_tuple(checkpoint["rng"]["python"]))
        rounds_done = int(checkpoint["round"])
        if rounds_done >= self.rounds:
            log.warning(
                "checkpoint has %d rounds done, loop.rounds=%d: nothing left to train",
                rounds_done,
                self.rounds,
            )
        return rounds_done, checkpoint.get("wandb_id")

    def _check_pairing(self, model: ClientModule) -> None:
        """Refuse a client objective and aggregator that do not fit each other, or a precision
        the objective cannot train with."""
        model.check_precision(self.precision)
        agg, objective = type(self.aggregator).__name__, type(model).__name__
        missing = model.required_payload_extras - self.aggregator.payload_extras
        if missing:
            raise ConfigurationError(
                f"client objective {objective} needs {sorted(missing)} from the server, which aggregator "
                f"{agg} does not send: pair it with its own aggregator"
            )
        weighting = getattr(self.aggregator, "weighting", None)
        if model.required_weighting is not None and weighting not in (
            None,
            model.required_weighting,
        ):
            raise ConfigurationError(
                f"client objective {objective} needs its uploads averaged with weighting="
                f"{model.required_weighting!r}, but aggregator {agg} has weighting={weighting!r}: "
                f"set loop.aggregator.init_args.weighting: {model.required_weighting}"
            )
        missing = self.aggregator.required_upload_extras - model.upload_extras
        if missing:
            raise ConfigurationError(
                f"aggregator {agg} needs {sorted(missing)} in each upload, which client objective "
                f"{objective} does not produce: pair it with its own client objective"
            )


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file in the same folder, fsync, then rename over ``path``:
    a reader (or a run killed mid-write) sees either the old file or the new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class _TripleBatches(TensorBatches):
    """``(x, y, client_id)`` batches over all clients' validation samples."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, owner: torch.Tensor, batch_size: int
    ) -> None:
        super().__init__(x, y, batch_size)
        self.owner = owner

    def __iter__(self):
        for start in range(0, len(self.y), self.batch_size):
            end = start + self.batch_size
            yield self.x[start:end], self.y[start:end], self.owner[start:end]


def _all_finite(value: Any) -> bool:
    """No NaN/Inf in any floating tensor of an upload's weights or extras (nested dicts/lists too)."""
    if isinstance(value, Upload):
        return _all_finite(value.weights) and _all_finite(value.extras)
    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_all_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def _describe(metrics: dict[str, float]) -> str:
    return f"test_acc {metrics['test_acc']:.4f}" if "test_acc" in metrics else ""


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value
