"""The start-up sequence of a :class:`~fedlightning.loop.core.FederatedLoop` run, in order.

1. ``FederatedLoop.__init__``: the loop's options, each put in its group and checked there
   (:mod:`fedlightning.loop.options`; a bad value is a ConfigurationError naming the option
   before anything is read, trained or written), and the configured round components
   (:func:`fedlightning.loop.components.configured_components`).
2. :func:`prepare_run`, first in ``FederatedLoop.fit``: set up the data module, build the run's
   round components (:mod:`fedlightning.loop.components`, docs/algorithms.md section 6.2), check
   that model, aggregator, components, precision, accelerator, backend and data fit together
   (:func:`check_run`: each component's ``setup`` reads the run and may refuse it), resolve the
   run's device and precision once (:class:`~fedlightning.compute.Compute`), read ``ckpt_path``,
   check the run directory, let the backend settle what needs the data (``auto``'s measured
   choice, or the resumed checkpoint's), compute the run's identity
   (:mod:`fedlightning.loop.identity`), set up the aggregator from the model's initial weights
   (:func:`setup_server`), build the scoring model (its networks copied before any fit,
   :mod:`fedlightning.loop.scoring_model`) and, when resuming, :func:`restore` the checkpoint's
   server, client and component state. Nothing is written yet. Returns the
   :class:`~fedlightning.loop.run_state.RunState` the rounds consume. A resume whose checkpoint
   already has ``loop.rounds`` rounds done is decided here (``RunState.nothing_to_train``): it
   writes nothing, so the run's ``config.yaml`` and results stay as they were.
3. :func:`open_run`, inside the locked run directory: restore the RNG states of a resume, remove
   stale temporaries, take the client state folder and remove its stale files, write
   ``config.yaml``, ``partition.csv`` and ``partition.png``, open the loggers.

These functions read the loop's options and parts as
:class:`~fedlightning.loop.options.RunParts` and call its parts (aggregator, backend, store,
reporter, components); they know nothing of the loop's class and assign none of its attributes.
"""

from __future__ import annotations

import logging
from typing import Any

from fedlightning.clients.base import ClientModule
from fedlightning.compute import Compute
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.data.validation import validate_datamodule
from fedlightning.errors import ConfigurationError
from fedlightning.fit import trainer_reason
from fedlightning.loop.batch_checks import check_batches
from fedlightning.loop.checkpoint import read_checkpoint, remove_stale_temporaries, restore_rng
from fedlightning.loop.checks import check_accelerator
from fedlightning.loop.components import (
    ALWAYS_ON,
    RunContext,
    closing_components,
    run_components,
    setup_components,
)
from fedlightning.loop.failures import fit_float_dtype
from fedlightning.loop.headline import ScoredModels
from fedlightning.loop.identity import compare_identity, run_identity
from fedlightning.loop.initial_states import independent_states
from fedlightning.loop.options import RunParts
from fedlightning.loop.pairing import check_pairing
from fedlightning.loop.personal_options import resolve_personal
from fedlightning.loop.plugin_hooks import check_hooks
from fedlightning.loop.run_state import RunState
from fedlightning.loop.rundir import check_run_dir, resumes_in, write_marked
from fedlightning.loop.sampling import check_sampling, clients_per_round, sampling_rate
from fedlightning.loop.scoring_model import ScoringModel
from fedlightning.loop.server_device import ServerDevice
from fedlightning.privacy.checks import check_privacy
from fedlightning.protocol import FitConfig
from fedlightning.round_components import RoundComponent, load_component_states
from fedlightning.run_config import config_yaml, resolved_config
from fedlightning.tracking import check_wandb_folders
from fedlightning.training import quiet_lightning

log = logging.getLogger("fedlightning")


def prepare_run(
    parts: RunParts, model: ClientModule, datamodule: FederatedDataModule, ckpt_path: str | None,
) -> RunState:  # fmt: skip
    """Every check and set-up before the run directory is written to; returns what the rounds
    need (:class:`~fedlightning.loop.run_state.RunState`)."""
    o = parts.options
    datamodule.setup("fit")
    per_round = clients_per_round(o.clients_per_round, datamodule.num_clients, o.min_clients)
    components = run_components(parts.components)
    context, fit_config, compute = check_run(parts, model, datamodule, per_round, components)
    personal = resolve_personal(parts.personal, model, datamodule)
    scoring = ScoringModel.for_run(model, compute)  # its networks copied before any fit
    checkpoint = read_checkpoint(ckpt_path) if ckpt_path else None
    # resuming continues the results beside its checkpoint; a checkpoint from elsewhere must
    # not take over a directory holding another run's results (unless overwrite)
    resuming = bool(ckpt_path) and resumes_in(ckpt_path, o.run_dir)
    # the advice names the API the run came from: the CLI hands the loop its config text
    python = parts.config_text is None
    check_run_dir(o.run_dir, "run_dir" if python else "loop.run_dir", resuming, o.overwrite,
                  python=python)  # fmt: skip
    parts.store.check()  # a client state folder of its own: no link, no other live run's
    if parts.reporter.wandb:
        check_wandb_folders()  # W&B's own folders, outside the run directory
    stored = checkpoint.get("identity") if checkpoint is not None else None
    recorded = stored.get("backend_results") if isinstance(stored, dict) else None
    parts.backend.decide(model, datamodule, fit_config, compute, per_round, recorded)
    initial = initial_state(model, parts.fit_config.precision)
    identity = run_identity(
        resolved_config(parts, model, datamodule), initial, datamodule, o.seed, parts.store.mode,
        parts.backend, parts.aggregator.declared_states(), parts.components,
    )  # fmt: skip
    server = ServerDevice(compute.device)
    setup_server(parts, model, datamodule, initial, server, per_round)
    run = RunState(
        clients_per_round=per_round, sampling_rate=context.sampling_rate, compute=compute,
        server=server, identity=identity, checkpoint=None, resumes_in_place=resuming,
        first_round=0, last_checkpoint=None, fit_config=fit_config, scoring=scoring,
        components=components, context=context, personal=personal,
    )  # fmt: skip
    components += closing_components(parts, run, components)  # the writer last: it saves theirs
    if checkpoint is not None and ckpt_path is not None:
        restore(parts, run, ckpt_path, checkpoint)
    return run


def initial_state(model: ClientModule, precision: str) -> dict[str, Any]:
    """The server model before the first round, on the CPU, in the dtype the fits train it in
    (64-true: float64 from the start), so that the server state keeps its declared layout across
    rounds (docs/algorithms.md section 2.6)."""
    dtype = fit_float_dtype(precision)
    return {
        k: v.detach().to("cpu", dtype if dtype and v.is_floating_point() else None, copy=True)
        for k, v in model.network.state_dict().items()
    }


def check_run(
    parts: RunParts, model: ClientModule, datamodule: FederatedDataModule, per_round: int,
    components: list[RoundComponent],
) -> tuple[RunContext, FitConfig, Compute]:  # fmt: skip
    """Check that model, aggregator, round components (the attack among them), precision,
    accelerator, sampling, privacy, backend and data fit together; returns what the components
    read of the run, the fit config (as they left it: the label-flipping clients) and the
    resolved compute."""
    o, aggregator, precision = parts.options, parts.aggregator, parts.fit_config.precision
    check_hooks(model, aggregator, *components, parts.backend)
    check_pairing(model, aggregator, precision)
    context = RunContext(
        options=o, fit_config=parts.fit_config, aggregator=aggregator, backend=parts.backend,
        store=parts.store, summary=parts.summary, num_clients=datamodule.num_clients,
        clients_per_round=per_round,
        sampling_rate=sampling_rate(o.clients_per_round, datamodule.num_clients),
        batch_size=datamodule.batch_size,
    )  # fmt: skip
    fit_config = setup_components(components, context)
    classes = getattr(model, "num_classes", None)
    if classes is not None and classes < datamodule.num_classes:
        raise ConfigurationError(
            f"model num_classes={classes} but the {datamodule.dataset!r} labels run up to "
            f"{datamodule.num_classes - 1}: use num_classes >= {datamodule.num_classes}"
        )
    check_accelerator(parts.fit_config.accelerator)
    with quiet_lightning():  # no AMP banner (a 16-mixed run on a CPU still warns, once)
        compute = Compute.resolve(parts.fit_config.accelerator, precision)
    check_sampling(o.client_sampling, aggregator)
    check_privacy(
        aggregator, model, parts.fit_config, trainer_reason(model, precision),
        o.client_sampling, context.sampling_rate, o.rounds, o.min_clients, datamodule,
    )  # fmt: skip
    parts.backend.check(model, fit_config, compute)
    parts.backend.check_aggregator(aggregator)
    validate_datamodule(datamodule)
    check_batches(model, datamodule, fit_config)  # BatchNorm and a batch of one sample
    model.prepare_clients(datamodule)
    return context, fit_config, compute


def setup_server(
    parts: RunParts, model: ClientModule, datamodule: FederatedDataModule,
    initial: dict[str, Any], server: ServerDevice, per_round: int,
) -> None:  # fmt: skip
    """Set up the aggregator from the model's ``initial`` weights on the server device (and the
    K independently initialised models an aggregator may ask for)."""
    aggregator, seed = parts.aggregator, parts.options.seed
    aggregator.setup(
        server.place(initial), datamodule.num_clients, seed,
        client_keys=model.client_key_sets(datamodule.num_clients),
        parameters=model.server_parameter_names(),
    )  # fmt: skip
    needed = aggregator.initial_states_needed(per_round)
    if needed:  # e.g. FedCross(independent_init=True): K independently initialised models
        states = independent_states(model, needed, seed)
        aggregator.set_initial_states(server.place(states))


def restore(parts: RunParts, run: RunState, ckpt_path: str, checkpoint: dict[str, Any]) -> None:
    """Check ``checkpoint`` belongs to this run (its identity) and load its server, client and
    round component state into them (the loop restores its history, the RNG states are restored
    when the rounds start); ``run`` then starts after the checkpoint's rounds and keeps the
    checkpoint without the state loaded (the run keeps no second copy of it). Decides whether
    there is anything left to train (``run.nothing_to_train``), and says so once."""
    compare_identity(ckpt_path, checkpoint["identity"], run.identity)
    try:
        parts.aggregator.load_state_dict(run.server.place(checkpoint["aggregator"]))
        parts.store.load_state_dict(checkpoint["clients"])
        # "meters": the same states, as checkpoints of format 3 written before round components
        load_component_states(
            run.components, checkpoint.get("components", checkpoint.get("meters", {})),
            always_on=tuple(ALWAYS_ON),
        )  # fmt: skip
    except ConfigurationError:
        raise
    except Exception as error:  # noqa: BLE001 (an inconsistent file, not a bug of this run)
        raise ConfigurationError(
            f"ckpt_path={ckpt_path!r} is inconsistent with this run: its state does not load "
            f"({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}); "
            "resume from another checkpoint or start a new run"
        ) from None
    rounds_done, rounds = checkpoint["round"], parts.options.rounds
    run.first_round, run.last_checkpoint = rounds_done, (rounds_done, ckpt_path)
    run.checkpoint = {k: v for k, v in checkpoint.items() if k not in ("aggregator", "clients")}
    run.nothing_to_train = rounds_done >= rounds
    if run.nothing_to_train:  # FederatedLoop.fit then returns without writing anything
        log.warning(
            "nothing to train: %s has %d round(s) done and loop.rounds=%d; %s is left as it was",
            ckpt_path, rounds_done, rounds, parts.options.run_dir,
        )  # fmt: skip


def open_run(parts: RunParts, model: ClientModule, dm: FederatedDataModule, run: RunState) -> None:
    """Write the run's start files and open its loggers (a resume: restore its RNG states first)."""
    wandb_id = None
    if run.checkpoint is not None:
        restore_rng(run.checkpoint)
        wandb_id = run.checkpoint.get("wandb_id")
    run_dir = parts.options.run_dir
    remove_stale_temporaries(run_dir)
    parts.store.open()  # client state files of a run killed before its next checkpoint
    write_marked(run_dir / "config.yaml", *config_yaml(parts, model, dm))
    dm.save_partition(run_dir / "partition.csv")
    parts.reporter.plot_partition(dm)
    scored = ScoredModels.of(run.scoring, parts.aggregator.deployables)
    parts.reporter.open(parts.history, wandb_id, dm, scored)
