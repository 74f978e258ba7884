"""A run's resolved configuration as plain data, and the ``config.yaml`` that records it.

The configuration of a run is three groups, laid out as the CLI parses them: ``loop`` (the
FederatedLoop's arguments), ``model`` (``class_path`` and ``init_args`` of the client objective)
and ``data`` (the FederatedDataModule's arguments); every nested object (the aggregator, InCo's
inner aggregator, the backend, loggers) is ``{class_path, init_args}`` and every default is filled
in. It has two sources, which :func:`resolved_config` normalises to the same structure, so that a
run started from the CLI resumes from Python and the reverse when the options are the same:

- the CLI: the config jsonargparse resolved, with its links applied (``data.seed``, the model's
  ``num_classes``/``in_channels``/``image_size``) and ``run_dir`` filled in, as ``--print_config``
  shows it (:meth:`fedlightning.cli.fit.FederatedCLI.resolved_config`, handed to the loop as
  ``loop.config_text``);
- the Python API (``FederatedLoop.fit`` without the CLI): the constructor arguments actually
  passed, as recorded at construction: the loop's (:mod:`fedlightning.recorded_args`), the
  objective's and the data
  module's Lightning ``hparams`` (which include arguments forwarded through ``**kwargs``), and the
  aggregator's and backend's arguments recorded by :mod:`fedlightning.recorded_args` (``**kwargs``
  followed up the class hierarchy). Attributes are never read.

Normalising makes class paths the class's public path (``fedlightning.server.FedAvg``: its
package's re-export where there is one, else ``module.QualName``), tuples lists, and the loop's
``aggregator``/``backend`` left ``null`` the objects the loop made for them (``FedAvg()``,
``AutoBackend()``) with their arguments.

:func:`config_yaml` is the text of the run directory's ``config.yaml``, which
:func:`fedlightning.loop.rundir.write_marked` marks as fedlightning's.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import torch
import yaml

from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.recorded_args import recorded_init_args

GROUPS = ("loop", "model", "data")


def public_class_path(kind: type) -> str:
    """``package.Name`` when ``kind``'s package re-exports it (``fedlightning.server.FedAvg``),
    else ``module.QualName``."""
    module = kind.__module__
    parts = module.split(".")
    if len(parts) > 2:  # a module inside a subpackage: the subpackage's re-export
        package = sys.modules.get(".".join(parts[:2]))
        if package is not None and getattr(package, kind.__name__, None) is kind:
            module = ".".join(parts[:2])
    return f"{module}.{kind.__qualname__}"


def canonical_class_path(path: str) -> str:
    """The public class path of the class ``path`` names (as given when it cannot be imported)."""
    module, _, name = path.rpartition(".")
    try:
        kind = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return path
    return public_class_path(kind) if isinstance(kind, type) else path


def plain(value: Any) -> Any:
    """``value`` as plain YAML data: an object that recorded its constructor arguments becomes
    ``{class_path, init_args}``, any other object ``{class_path}``; tuples become lists."""
    if value is None:
        return None
    if isinstance(value, Enum):
        return plain(value.value)
    for kind in (bool, str, int, float):  # subclasses too (numpy's float64 is a float)
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, type):
        return public_class_path(value)
    if inspect.isroutine(value):  # a function given as an option
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, torch.dtype | torch.device):
        return str(value)
    if hasattr(value, "tolist") and getattr(value, "ndim", None) == 0:
        return value.tolist()  # a 0-d tensor or a numpy scalar
    description: dict[str, Any] = {"class_path": public_class_path(type(value))}
    recorded = recorded_init_args(value)
    if recorded is not None:
        description["init_args"] = plain(recorded)
    return description


def normalise(value: Any) -> Any:
    """Plain data with every ``class_path`` made canonical (:func:`canonical_class_path`)."""
    if isinstance(value, dict):
        out = {str(k): normalise(v) for k, v in value.items()}
        if isinstance(out.get("class_path"), str):
            out["class_path"] = canonical_class_path(out["class_path"])
            out.setdefault("init_args", {})  # jsonargparse leaves it out for a class without any
        return out
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    return value


def python_config(loop_args: dict[str, Any], model: Any, datamodule: Any) -> dict[str, Any]:
    """The ``loop``/``model``/``data`` groups of a run started from Python (see the module
    docstring; ``loop_args``: the loop's constructor arguments); a data module of a subclass is
    ``{class_path, init_args}``."""
    data: Any = _hparams(datamodule)
    if type(datamodule) is not FederatedDataModule:  # the CLI's data group is this class's
        data = {"class_path": public_class_path(type(datamodule)), "init_args": data}
    return {
        "loop": plain(loop_args),
        "model": {"class_path": public_class_path(type(model)), "init_args": _hparams(model)},
        "data": data,
    }


def _hparams(module: Any) -> dict[str, Any]:
    """A Lightning module's saved hyperparameters (LightningCLI's own ``_class_path`` and
    ``_instantiator`` entries left out)."""
    hparams = dict(getattr(module, "hparams", {}) or {})
    return plain({k: v for k, v in hparams.items() if not str(k).startswith("_")})


def resolved_config(parts: Any, model: Any, datamodule: Any) -> dict[str, Any]:
    """The run's configuration, normalised (module docstring): the CLI's ``config_text`` when
    the CLI started the run, else :func:`python_config` of the loop's arguments (``parts``: the
    loop's :class:`~fedlightning.loop.options.RunParts`)."""
    if parts.config_text is not None:
        parsed = yaml.safe_load(parts.config_text) or {}
        config = {group: parsed.get(group) for group in GROUPS}
    else:
        config = python_config(parts.loop_args, model, datamodule)
    config = normalise(config)
    loop_group = config["loop"]
    for name in ("aggregator", "backend"):  # null: the default the loop made
        if loop_group.get(name) is None:
            loop_group[name] = normalise(plain(getattr(parts, name)))
    loop_group["run_dir"] = str(parts.options.run_dir)
    return config


def config_yaml(parts: Any, model: Any, datamodule: Any) -> tuple[str, str]:
    """``(text, what wrote it)`` of ``run_dir/config.yaml``: the CLI's resolved config as it
    parsed it, or a Python-API run's :func:`resolved_config`."""
    if parts.config_text is not None:
        return parts.config_text, "fit: the resolved config of this run"
    text = yaml.safe_dump(resolved_config(parts, model, datamodule), sort_keys=False)
    return text, "FederatedLoop.fit, Python API: the config of this run"
