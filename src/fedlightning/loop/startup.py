"""The start-up sequence of a :class:`~fedlightning.loop.core.FederatedLoop` run, in order.

1. :func:`check_arguments`: the loop's options, when it is constructed (a bad value is a
   ConfigurationError naming the option before anything is read, trained or written).
2. :func:`prepare_run`, first in ``FederatedLoop.fit``: set up the data module, check that model,
   aggregator, precision, accelerator, backend and data fit together, resolve the run's device
   and precision once (:class:`~fedlightning.compute.Compute`), read ``ckpt_path``, check the
   run directory, let the backend settle what needs the data (``auto``'s measured choice, or the
   resumed checkpoint's), compute the run's identity (:mod:`fedlightning.loop.identity`), set up the
   aggregator from the model's initial weights, build the scoring model (its networks copied
   before any fit, :mod:`fedlightning.loop.scoring_model`) and, when resuming, :func:`restore` the
   checkpoint's server and client state. Nothing is written yet. Returns the
   :class:`~fedlightning.loop.run_state.RunState` the rounds consume.
   A resume whose checkpoint already has ``loop.rounds`` rounds done stops here: it writes
   nothing, so the run's ``config.yaml`` and results stay as they were.
3. :func:`open_run`, inside the locked run directory: restore the RNG states of a resume, remove
   stale temporaries, take the client state folder and remove its stale files, write
   ``config.yaml``, ``partition.csv`` and ``partition.png``, open the loggers.

These functions read the loop's options and call its components (aggregator, backend, store,
reporter); they assign none of the loop's attributes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fedlightning.attacks.base import Attack
from fedlightning.backends.base import Backend
from fedlightning.clients.base import ClientModule
from fedlightning.compute import PRECISIONS, Compute
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.data.validation import validate_datamodule
from fedlightning.determinism import check_deterministic
from fedlightning.errors import ConfigurationError, require
from fedlightning.fit import trainer_reason
from fedlightning.loop.byzantine import prepare_attack
from fedlightning.loop.checkpoint import read_checkpoint, remove_stale_temporaries, restore_rng
from fedlightning.loop.checks import check_accelerator, check_seed
from fedlightning.loop.failures import fit_float_dtype
from fedlightning.loop.identity import compare_identity, run_identity
from fedlightning.loop.initial_states import independent_states
from fedlightning.loop.pairing import check_pairing
from fedlightning.loop.plugin_hooks import check_hooks
from fedlightning.loop.run_state import RunState
from fedlightning.loop.rundir import check_run_dir, resumes_in, write_marked
from fedlightning.loop.sampling import SAMPLINGS, check_sampling, clients_per_round, sampling_rate
from fedlightning.loop.scoring_model import ScoringModel
from fedlightning.loop.server_device import ServerDevice
from fedlightning.privacy.checks import check_privacy
from fedlightning.privacy.dp_sgd import DPSGD
from fedlightning.run_config import config_yaml, resolved_config
from fedlightning.tracking import check_wandb_folders
from fedlightning.training import quiet_lightning

if TYPE_CHECKING:
    from fedlightning.loop.core import FederatedLoop

log = logging.getLogger("fedlightning")


def check_arguments(
    *,
    rounds: int,
    clients_per_round: int | float,
    local_epochs: int,
    local_steps: int | None,
    backend: Any,
    precision: str,
    devices: int,
    seed: int,
    eval_every: int,
    val_clients: int | str,
    run_dir: str | None,
    checkpoint_every: int,
    min_clients: int,
    on_round_failure: str,
    client_state: str,
    fit_with: str,
    gradient_clip_val: float | None,
    gradient_clip_algorithm: str,
    num_threads: int | None,
    log_every: int,
    max_skipped_fraction: float,
    target_acc: float | None,
    attack: Any,
    client_sampling: str,
    dp_sgd: Any,
    deterministic: Any,
    **_: Any,
) -> None:
    """Check the FederatedLoop's arguments (the others are checked where they are used)."""
    check_seed(seed)
    check_deterministic(deterministic)
    require(
        client_sampling in SAMPLINGS,
        "loop.client_sampling", client_sampling, f"one of {', '.join(SAMPLINGS)}",
    )  # fmt: skip
    require(
        dp_sgd is None or isinstance(dp_sgd, DPSGD),
        "loop.dp_sgd", dp_sgd, "null or a fedlightning.privacy.DPSGD",
    )  # fmt: skip
    require(
        run_dir is None or bool(str(run_dir).strip()),
        "loop.run_dir", run_dir, "a directory path (an empty one would write into the current folder)",
    )  # fmt: skip
    require(log_every >= 1, "loop.log_every", log_every, "an integer >= 1")
    require(
        0 <= max_skipped_fraction <= 1,
        "loop.max_skipped_fraction", max_skipped_fraction, "a number in [0, 1]",
    )  # fmt: skip
    require(rounds >= 1, "loop.rounds", rounds, "an integer >= 1")
    require(
        clients_per_round > 0 and (isinstance(clients_per_round, int) or clients_per_round <= 1),
        "loop.clients_per_round", clients_per_round, "an integer >= 1 or a fraction in (0, 1]",
    )  # fmt: skip
    require(local_epochs >= 1, "loop.local_epochs", local_epochs, "an integer >= 1")
    require(
        local_steps is None or local_steps >= 1,
        "loop.local_steps", local_steps, "null or an integer >= 1",
    )  # fmt: skip
    require(precision in PRECISIONS, "loop.precision", precision, f"one of {', '.join(PRECISIONS)}")
    require(devices == 1, "loop.devices", devices, "1 (each client fit uses one device)")
    require(eval_every >= 1, "loop.eval_every", eval_every, "an integer >= 1")
    require(
        val_clients == "all" or (type(val_clients) is int and val_clients >= 1),
        "loop.val_clients", val_clients, "'all' or an integer >= 1",
    )  # fmt: skip
    require(checkpoint_every >= 1, "loop.checkpoint_every", checkpoint_every, "an integer >= 1")
    require(min_clients >= 1, "loop.min_clients", min_clients, "an integer >= 1")
    require(
        on_round_failure in ("skip", "stop"),
        "loop.on_round_failure", on_round_failure, "'skip' or 'stop'",
    )  # fmt: skip
    require(
        client_state in ("memory", "disk"),
        "loop.client_state",
        client_state,
        "'memory' or 'disk'",
    )
    require(fit_with in ("auto", "trainer"), "loop.fit_with", fit_with, "'auto' or 'trainer'")
    require(
        gradient_clip_val is None or gradient_clip_val > 0,
        "loop.gradient_clip_val", gradient_clip_val, "null or a number > 0",
    )  # fmt: skip
    require(
        gradient_clip_algorithm in ("norm", "value"),
        "loop.gradient_clip_algorithm", gradient_clip_algorithm, "'norm' or 'value'",
    )  # fmt: skip
    require(
        num_threads is None or num_threads >= 1,
        "loop.num_threads", num_threads, "null or an integer >= 1",
    )  # fmt: skip
    require(
        target_acc is None or 0.0 < target_acc <= 1.0,
        "loop.target_acc", target_acc, "null or an accuracy in (0, 1]",
    )  # fmt: skip
    require(
        backend is None or isinstance(backend, Backend),
        "loop.backend", backend, "a Backend (AutoBackend, SequentialBackend, CohortBackend, RayBackend)",
    )  # fmt: skip
    require(
        attack is None or isinstance(attack, Attack),
        "loop.attack", attack, "null or an Attack (fedlightning.attacks: LabelFlip, SignFlip, ...)",
    )  # fmt: skip


def prepare_run(
    loop: FederatedLoop,
    model: ClientModule,
    datamodule: FederatedDataModule,
    ckpt_path: str | None,
) -> RunState:
    """Every check and set-up before the run directory is written to; returns what the rounds
    need (:class:`~fedlightning.loop.run_state.RunState`)."""
    check_hooks(model, loop.aggregator, loop.attack, loop.backend)
    check_pairing(model, loop.aggregator, loop.precision)
    datamodule.setup("fit")
    per_round = clients_per_round(loop.clients_per_round, datamodule.num_clients, loop.min_clients)
    adversary, fit_config = prepare_attack(
        loop.attack, loop.aggregator, loop.backend, loop.fit_config, datamodule.num_clients,
        per_round, loop.client_sampling, loop.seed,
    )  # fmt: skip
    classes = getattr(model, "num_classes", None)
    if classes is not None and classes < datamodule.num_classes:
        raise ConfigurationError(
            f"model num_classes={classes} but the {datamodule.dataset!r} labels run up to "
            f"{datamodule.num_classes - 1}: use num_classes >= {datamodule.num_classes}"
        )
    check_accelerator(loop.fit_config.accelerator)
    with quiet_lightning():  # no AMP banner (a 16-mixed run on a CPU still warns, once)
        compute = Compute.resolve(loop.fit_config.accelerator, loop.precision)
    check_sampling(loop.client_sampling, loop.aggregator)
    rate = sampling_rate(loop.clients_per_round, datamodule.num_clients)
    check_privacy(
        loop.aggregator, model, loop.fit_config, trainer_reason(model, loop.precision),
        loop.client_sampling, rate, loop.rounds, loop.min_clients, datamodule,
    )  # fmt: skip
    loop.backend.check(model, fit_config, compute)
    loop.backend.check_aggregator(loop.aggregator)
    validate_datamodule(datamodule)
    model.prepare_clients(datamodule)
    scoring = ScoringModel.for_run(model, compute)  # its networks copied before any fit
    checkpoint = read_checkpoint(ckpt_path) if ckpt_path else None
    # resuming continues the results beside its checkpoint; a checkpoint from elsewhere must
    # not take over a directory holding another run's results (unless overwrite)
    resuming = bool(ckpt_path) and resumes_in(ckpt_path, loop.run_dir)
    # the advice names the API the run came from: the CLI hands the loop its config text
    python = loop.config_text is None
    option = "run_dir" if python else "loop.run_dir"
    check_run_dir(loop.run_dir, option, resuming, loop.overwrite, python=python)
    loop.store.check()  # a client state folder of its own: no link, no other live run's
    if loop.reporter.wandb:
        check_wandb_folders()  # W&B's own folders, outside the run directory
    stored = checkpoint.get("identity") if checkpoint is not None else None
    recorded = stored.get("backend_results") if isinstance(stored, dict) else None
    loop.backend.decide(model, datamodule, fit_config, compute, per_round, recorded)
    # in the dtype the fits train it in (64-true: float64 from the start), so that the server
    # state keeps its declared layout across rounds (docs/algorithms.md section 2.6)
    dtype = fit_float_dtype(loop.precision)
    initial = {
        k: v.detach().to("cpu", dtype if dtype and v.is_floating_point() else None, copy=True)
        for k, v in model.network.state_dict().items()
    }
    identity = run_identity(
        resolved_config(loop, model, datamodule), initial, datamodule, loop.seed, loop.store.mode,
        loop.backend, loop.aggregator.declared_states(),
    )  # fmt: skip
    server = ServerDevice(compute.device)
    loop.aggregator.setup(
        server.place(initial), datamodule.num_clients, loop.seed,
        client_keys=model.client_key_sets(datamodule.num_clients),
        parameters=model.server_parameter_names(),
    )  # fmt: skip
    needed = loop.aggregator.initial_states_needed(per_round)
    if needed:  # e.g. FedCross(independent_init=True): K independently initialised models
        states = independent_states(model, needed, loop.seed)
        loop.aggregator.set_initial_states(server.place(states))
    rounds_done, last_checkpoint = 0, None
    if checkpoint is not None:
        restore(loop, ckpt_path, checkpoint, identity, server)
        rounds_done, last_checkpoint = checkpoint["round"], (checkpoint["round"], ckpt_path)
        # loaded: the run keeps no second copy of the server and client state
        checkpoint = {k: v for k, v in checkpoint.items() if k not in ("aggregator", "clients")}
    return RunState(
        clients_per_round=per_round, sampling_rate=rate, compute=compute, server=server,
        identity=identity, checkpoint=checkpoint, resumes_in_place=resuming,
        first_round=rounds_done, last_checkpoint=last_checkpoint, fit_config=fit_config,
        adversary=adversary, scoring=scoring,
    )  # fmt: skip


def restore(
    loop: FederatedLoop, ckpt_path: str, checkpoint: dict[str, Any], identity: dict[str, Any],
    server: ServerDevice,
) -> None:  # fmt: skip
    """Check ``checkpoint`` belongs to this run (its ``identity``) and load its server and client
    state (the loop restores its own records, the RNG states are restored when the rounds
    start)."""
    compare_identity(ckpt_path, checkpoint["identity"], identity)
    try:
        loop.aggregator.load_state_dict(server.place(checkpoint["aggregator"]))
        loop.store.load_state_dict(checkpoint["clients"])
    except ConfigurationError:
        raise
    except Exception as error:  # noqa: BLE001 (an inconsistent file, not a bug of this run)
        raise ConfigurationError(
            f"ckpt_path={ckpt_path!r} is inconsistent with this run: its state does not load "
            f"({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}); "
            "resume from another checkpoint or start a new run"
        ) from None
    rounds_done = checkpoint["round"]
    if rounds_done >= loop.rounds:  # FederatedLoop.fit then returns without writing anything
        log.warning(
            "nothing to train: %s has %d round(s) done and loop.rounds=%d; %s is left as it was",
            ckpt_path, rounds_done, loop.rounds, loop.run_dir,
        )  # fmt: skip


def open_run(
    loop: FederatedLoop, model: ClientModule, dm: FederatedDataModule, run: RunState
) -> None:
    """Write the run's start files and open its loggers (a resume: restore its RNG states first)."""
    wandb_id = None
    if run.checkpoint is not None:
        restore_rng(run.checkpoint)
        wandb_id = run.checkpoint.get("wandb_id")
    remove_stale_temporaries(loop.run_dir)
    loop.store.open()  # client state files of a run killed before its next checkpoint
    write_marked(loop.run_dir / "config.yaml", *config_yaml(loop, model, dm))
    dm.save_partition(loop.run_dir / "partition.csv")
    loop.reporter.plot_partition(dm)
    loop.reporter.open(loop.history, wandb_id, dm)
