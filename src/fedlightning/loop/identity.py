"""What a run is, and what a resume may change: the identity a checkpoint stores.

The identity (:func:`run_identity`) is the run's resolved configuration
(:func:`fedlightning.run_config.resolved_config`: the ``loop``, ``model`` and ``data`` groups with
every class path and constructor argument, nested objects, ``**kwargs`` and defaults included, the
same structure from the CLI and from Python) plus facts derived from the objects:

- ``architecture``: the server model's keys, shapes and dtypes (a hash);
- ``dataset``, ``num_clients``, ``partition_hash``: the partition the data module made (data
  changed on disk shows here);
- ``seed`` and ``client_state``: the loop's, as resolved;
- ``server_state``: the aggregator's declared states and how each starts
  (:meth:`~fedlightning.server.server_state.ServerState.declared_states`: a plug-in whose code now
  declares other state cannot continue the checkpoint);
- ``components``: the run's configured round components (``loop.components`` with the
  shorthands ``loop.attack`` and ``loop.target_acc``: the adversary, the target tracker, the
  user's, in order), each ``{class_path, init_args}``
  (:func:`~fedlightning.loop.components.identity.component_identity`); the always-on built-ins
  have no options of their own and are left out;
- ``backend_results``: whose numerics the backend's fits follow: ``sequential`` for
  SequentialBackend, RayBackend and AutoBackend where it runs sequential fits; ``cohort`` for
  CohortBackend (its vmapped fits follow another floating-point trajectory, e.g. with BatchNorm)
  and AutoBackend where it runs the cohort; ``flower`` for FlowerBackend; any other backend its
  class path. Each checkpoint records the path of the rounds before it (an AutoBackend that fell
  back to sequential fits mid-run: ``sequential``, :mod:`fedlightning.loop.components.run_path`),
  and a resumed AutoBackend takes that path (docs/algorithms.md section 9.3);
- ``library_version``: a different one only warns.

A resume (:func:`compare_identity`) may change only the options that cannot change the result,
:data:`RESUME_MAY_CHANGE`:

- ``loop.rounds`` (extending a run), ``loop.eval_every``, ``loop.val_clients`` and
  ``loop.personal`` (which clients an evaluation scores and how: metrics only),
  ``loop.checkpoint_every``;
- reporting: ``loop.loggers``, ``loop.wandb`` and ``loop.wandb_*``, ``loop.plots``,
  ``loop.progress_bar``, ``loop.log_every``, ``loop.max_skipped_fraction``;
- a round component's options that it lists in ``resume_may_change`` (the target tracker's
  ``target``, so ``loop.target_acc``): every other change of the components (one added, removed,
  moved, or with another option) is refused in one line naming it, since its state would
  restart, end or diverge mid-run
  (:func:`~fedlightning.loop.components.identity.component_difference`). A checkpoint written
  before the components were part of the identity has them derived from its config's shorthands;
- where the run lives: ``loop.run_dir``, ``loop.overwrite``;
- ``loop.backend`` (with its options) where ``backend_results`` stays the same (e.g.
  SequentialBackend to RayBackend, not to or from CohortBackend);
- ``loop.deterministic`` between ``true`` and ``warn``: both run the same deterministic kernels
  wherever one exists, and differ only where an op has none, which stops a ``true`` run. It is not
  result-neutral otherwise: ``false`` lets torch, cuDNN and cuBLAS pick other (nondeterministic)
  kernels on a GPU, so a resume to or from ``false`` is refused (docs/algorithms.md section 9.1).
  A checkpoint written before the option existed ran as ``false``.
- an option added after a checkpoint was written (:data:`ADDED_LATER`), where this run keeps the
  value that does what the checkpoint's run did (``data.min_batch_size: 1``).

Any other difference (the optimizer and its lr, epochs, steps, batch size, precision, clients per
round, data options, aggregator options, seed, threads, oneDNN, gradient clipping, ...) is refused
before anything is written, with one line naming the option path (``model.init_args.lr``), both
values and how to start a new run instead.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from fedlightning.backends import Backend
from fedlightning.errors import ConfigurationError
from fedlightning.loop.components.identity import (
    component_difference,
    component_identity,
    components_of,
)
from fedlightning.loop.components.run_path import backend_results
from fedlightning.loop.config_diff import NOT_SET, differences, short

log = logging.getLogger("fedlightning")

#: options (config paths, with everything under them) a resume may change: none changes the result
RESUME_MAY_CHANGE = (
    "loop.rounds",
    "loop.eval_every",
    "loop.val_clients",
    "loop.personal",
    "loop.checkpoint_every",
    "loop.loggers",
    "loop.wandb",
    "loop.wandb_project",
    "loop.wandb_group",
    "loop.wandb_tags",
    "loop.wandb_name",
    "loop.plots",
    "loop.progress_bar",
    "loop.log_every",
    "loop.max_skipped_fraction",
    "loop.run_dir",
    "loop.overwrite",
)
#: the config options that configure round components: compared as ``components``
#: (:mod:`fedlightning.loop.components.identity`), whichever spelling gave them
COMPONENT_OPTIONS = ("loop.components", "loop.attack", "loop.target_acc")
#: the backend option: it may change where ``backend_results`` stays the same
BACKEND = "loop.backend"
#: ``loop.deterministic``: it may change between these values (the same kernels wherever a run
#: with either goes on); a checkpoint without it ran as ``false``
DETERMINISTIC, SAME_KERNELS = "loop.deterministic", (True, "warn")
#: options added to the config after runs were checkpointed without them, each with the value
#: that does what those runs did: a checkpoint that lacks one resumes at that value
ADDED_LATER = {"data.min_batch_size": 1}
#: derived facts compared on resume, in order, with what to do on a mismatch
DERIVED = {
    "dataset": "resume with the same --data.dataset",
    "num_clients": "resume with the same --data.num_clients",
    "seed": "resume with the same --loop.seed",
    "partition_hash": "resume with the same data options and the same data on disk",
    "architecture": "resume with the same model.network/networks and network_kwargs",
    "client_state": "resume with the same --loop.client_state",
    "server_state": "resume with the aggregator code that wrote the checkpoint (its state)",
    "backend_results": "resume with a --loop.backend whose fits give the checkpoint's results",
}
NEW_RUN = (
    "or replace this run (no --ckpt_path, --loop.overwrite true), "
    "or start a new run in another --loop.run_dir"
)


def architecture(state: dict[str, torch.Tensor]) -> str:
    """``"<n> tensors, <p> parameters, sha256 <12 hex>"`` of the server model's keys and shapes."""
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(f"{key}:{tuple(state[key].shape)}:{state[key].dtype};".encode())
    params = sum(v.numel() for v in state.values())
    return f"{len(state)} tensors, {params:,} parameters, sha256 {digest.hexdigest()[:12]}"


def library_version() -> str:
    try:
        return version("fedlightning")
    except PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


def run_identity(
    config: dict[str, Any],
    initial: dict[str, torch.Tensor],
    datamodule: Any,
    seed: int,
    client_state: str,
    backend: Backend,
    server_state: dict[str, str],
    components: Sequence[Any] = (),
) -> dict[str, Any]:
    """The identity of a run (module docstring), as stored in its checkpoints: ``config`` from
    :func:`~fedlightning.run_config.resolved_config`, ``initial`` the server model's state_dict,
    ``server_state`` the aggregator's declared states, ``components`` the configured round
    components."""
    return {
        "components": component_identity(components),
        "config": config,
        "dataset": datamodule.dataset,
        "num_clients": datamodule.num_clients,
        "seed": seed,
        "partition_hash": datamodule.partition_hash(),
        "architecture": architecture(initial),
        "client_state": client_state,
        "server_state": server_state,
        "backend_results": backend_results(backend),
        "library_version": library_version(),
    }


def compare_identity(ckpt_path: str, stored: Any, current: dict[str, Any]) -> None:
    """Raise a one-line :class:`ConfigurationError` when this run (``current``) differs from the
    checkpoint's identity ``stored`` in anything a resume may not change."""
    if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict):
        raise ConfigurationError(
            f"ckpt_path={ckpt_path!r} does not say which run wrote it (no resolved config in its "
            "identity): it is not a checkpoint of this fedlightning; start a new run"
        )
    refused = [
        (path, old, new)
        for path, old, new in differences(stored["config"], current["config"])
        if not may_change(path, stored, current, old, new)
    ]
    if refused:
        path, old, new = refused[0]
        also = f" (and {', '.join(p for p, _, _ in refused[1:4])})" if refused[1:] else ""
        if len(refused) > 4:
            also = also[:-1] + ", ...)"
        todo = f"resume with the same --{path}{also}"
        if _under(path, BACKEND):
            todo = (
                f"resume with a --loop.backend whose fits give the checkpoint's results (it ran "
                f"{stored.get('backend_results')!r} fits, this run {current['backend_results']!r})"
            )
        raise _another_run(ckpt_path, path, old, new, todo)
    for field, todo in DERIVED.items():
        if field not in stored:
            raise ConfigurationError(
                f"ckpt_path={ckpt_path!r} lacks the field {field!r}: it is inconsistent; start a "
                "new run or resume from another checkpoint"
            )
        if stored[field] != current[field]:
            raise _another_run(ckpt_path, field, stored[field], current[field], todo)
    difference = component_difference(components_of(stored), components_of(current))
    if difference is not None:
        raise ConfigurationError(
            f"ckpt_path={ckpt_path!r} was written by another run: {difference}, {NEW_RUN}"
        )
    if stored.get("library_version") != current["library_version"]:
        log.warning(
            "%s was written by fedlightning %s, this is %s: resuming (every compared option matches)",
            ckpt_path, stored.get("library_version"), current["library_version"],
        )  # fmt: skip


def may_change(
    path: str, stored: dict[str, Any], current: dict[str, Any], old: Any = None, new: Any = None
) -> bool:
    """Whether a resume may change the option ``path`` from ``old`` to ``new`` (module
    docstring)."""
    if _under(path, BACKEND):
        return stored.get("backend_results") == current["backend_results"]
    if any(_under(path, option) for option in COMPONENT_OPTIONS):
        return True  # compared as the run's components, whichever spelling gave them
    if path == DETERMINISTIC:
        old = False if old is NOT_SET else old  # written before the option existed
        return old == new or (old in SAME_KERNELS and new in SAME_KERNELS)
    if old is NOT_SET and path in ADDED_LATER:
        return new == ADDED_LATER[path]
    return any(_under(path, option) for option in RESUME_MAY_CHANGE)


def _under(path: str, option: str) -> bool:
    return path == option or path.startswith(option + ".")


def _another_run(ckpt_path: str, name: str, old: Any, new: Any, todo: str) -> ConfigurationError:
    return ConfigurationError(
        f"ckpt_path={ckpt_path!r} was written by another run: {name} is {short(old)} in the "
        f"checkpoint but {short(new)} in this run; {todo}, {NEW_RUN}"
    )
