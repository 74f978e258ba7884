"""One ``fedlightning fit`` of a config in a fresh process, for ``benchmarks/gpu_all.py``.

    python benchmarks/gpu_fit.py CONFIG RUN_DIR [--loop.KEY VALUE ...] [--ckpt_path PATH]

With jsonargparse installed (the ``fedlightning`` CLI's parser; carried as wheels to a lent GPU
machine, see benchmarks/gpu_all.py) this is the CLI itself. Without it, the same run is built from
the YAML through the Python API as the CLI builds it (``loop.seed`` seeds the initial model and
the partition, the model's sizes come from the data module), and the options given override the
config's ``loop`` entries; ``--loop.backend`` takes a class name of ``fedlightning.backends``.
Either way the run's files land in RUN_DIR, and stderr carries its console lines (``backend: auto
chose ...``).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import yaml


def _object(spec: Any) -> Any:
    """An object from ``{class_path, init_args}`` (nested ones too); other values as they are."""
    if not isinstance(spec, dict) or "class_path" not in spec:
        return spec
    module, name = spec["class_path"].rsplit(".", 1)
    kwargs = {k: _object(v) for k, v in (spec.get("init_args") or {}).items()}
    return getattr(importlib.import_module(module), name)(**kwargs)


def _python_api(config: str, run_dir: str, options: list[str]) -> None:
    from lightning.fabric.utilities.seed import seed_everything

    from fedlightning import FederatedDataModule, FederatedLoop

    spec = yaml.safe_load(Path(config).read_text())
    loop_args, ckpt_path = dict(spec.get("loop", {})), None
    for key, value in zip(options[::2], options[1::2], strict=True):
        if key == "--ckpt_path":
            ckpt_path = value
        else:
            loop_args[key.removeprefix("--loop.")] = yaml.safe_load(value)
    seed = loop_args.get("seed", 0)
    seed_everything(seed, verbose=False)
    dm = FederatedDataModule(**{**spec.get("data", {}), "seed": seed})
    model_spec = spec["model"]
    sizes = {k: getattr(dm, k) for k in ("num_classes", "in_channels", "image_size")}
    model = _object({**model_spec, "init_args": {**model_spec.get("init_args", {}), **sizes}})
    for key, module in (
        ("aggregator", "fedlightning.server"),
        ("backend", "fedlightning.backends"),
    ):
        value = loop_args.get(key)
        if isinstance(value, str):  # a class name, as the CLI takes it
            value = {"class_path": value if "." in value else f"{module}.{value}"}
        if value is not None:
            loop_args[key] = _object(value)
    loop = FederatedLoop(**{**loop_args, "run_dir": run_dir})
    loop.fit(model, datamodule=dm, ckpt_path=ckpt_path)


def main(argv: list[str]) -> None:
    config, run_dir, *options = argv
    quiet = ["--loop.plots", "false", "--loop.progress_bar", "false"]
    try:
        import jsonargparse  # noqa: F401 (the CLI's parser)
    except ImportError:
        _python_api(config, run_dir, [*quiet, *options])
        return
    from fedlightning.cli import main as cli

    cli(["fit", "--config", config, "--loop.run_dir", run_dir, *quiet, *options])


if __name__ == "__main__":
    main(sys.argv[1:])
