"""``config.yaml`` for runs started from Python (``FederatedLoop.fit`` without the CLI).

The CLI writes the config it parsed; a Python-API run has no parsed config, so this module
describes the objects it was given in the CLI's layout (``loop``, ``model``, ``data``): the loop's
constructor arguments, the model's and the data module's saved hyperparameters, and each nested
object (aggregator, backend, loggers) as ``class_path`` plus the constructor arguments it keeps as
attributes of the same name. The file documents the run; it is not guaranteed to re-create objects
whose constructor arguments are not kept.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


def class_path(obj: Any) -> str:
    kind = type(obj)
    module = kind.__module__
    public = module.split(".")[0] + "." + module.split(".")[1] if module.count(".") > 1 else module
    # the public path when the package re-exports the class (fedlightning.server.FedAvg)
    try:
        package = __import__(public, fromlist=[kind.__name__])
        if getattr(package, kind.__name__, None) is kind:
            module = public
    except ImportError:
        pass
    return f"{module}.{kind.__qualname__}"


def describe(value: Any) -> Any:
    """``value`` as plain YAML data: objects become ``{class_path, init_args}``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): describe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [describe(v) for v in value]
    if hasattr(value, "tolist") and getattr(value, "ndim", 1) == 0:
        return value.tolist()  # a 0-d tensor or numpy scalar
    init_args = {}
    try:
        parameters = inspect.signature(type(value).__init__).parameters
    except (TypeError, ValueError):
        parameters = {}
    for name, parameter in parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if hasattr(value, name):
            attribute = getattr(value, name)
            if not callable(attribute) or isinstance(attribute, type):
                init_args[name] = describe(attribute)
    description: dict[str, Any] = {"class_path": class_path(value)}
    if init_args:
        description["init_args"] = init_args
    return description


def run_description(loop: Any, model: Any, datamodule: Any) -> dict[str, dict[str, Any]]:
    """The ``loop``/``model``/``data`` groups of a run started from Python: the loop's
    constructor arguments (``loop.init_args``) with the aggregator, backend and run directory it
    resolved its defaults to."""
    resolved = {"aggregator": loop.aggregator, "backend": loop.backend, "run_dir": loop.run_dir}
    loop_args = {**loop.init_args, **resolved}
    hparams = dict(getattr(model, "hparams", {}) or {})
    return {
        "loop": {k: describe(v) for k, v in loop_args.items()},
        "model": {"class_path": class_path(model), "init_args": describe(hparams)},
        "data": describe(dict(getattr(datamodule, "hparams", {}) or {})),
    }


def write_run_config(path: Path, loop: Any, model: Any, datamodule: Any) -> Path:
    """Write :func:`run_description` as YAML to ``path`` (``run_dir/config.yaml``)."""
    text = "# written by FederatedLoop.fit (Python API): the run's loop, model and data settings\n"
    text += yaml.safe_dump(run_description(loop, model, datamodule), sort_keys=False)
    path.write_text(text)
    return path
