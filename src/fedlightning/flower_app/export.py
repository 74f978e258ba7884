"""``fedlightning flower-app``: write a runnable Flower App from a fedlightning config.

The app directory holds ``pyproject.toml`` (the Flower App: components and run config), the
config (``fedlightning.yaml``) and small modules: ``fedlightning_app/server_app.py`` runs the
whole :class:`~fedlightning.loop.FederatedLoop` inside the ServerApp with the
:class:`~fedlightning.backends.flower.FlowerBackend` on the Grid Flower gives it, and
``fedlightning_app/client_app.py`` is the fedlightning ClientApp (a copy of
:mod:`fedlightning.flower_app.warm_client`: each SuperNode fits in a warm worker process), beside
the lean module it imports (:func:`write_lean_modules`). Run it
with ``flwr run <dir> <superlink-connection>`` against a SuperLink whose SuperNodes serve the clients (node config ``partition-id``/
``num-partitions`` or ``client-ids``; ``data-root`` for the node's data). Every machine needs
``pip install 'fedlightning[flower]'``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "fedlightning run as a Flower App"
license = "Apache-2.0"
dependencies = {dependencies}

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedlightning"

[tool.flwr.app.components]
serverapp = "{serverapp}"
clientapp = "{clientapp}"

[tool.flwr.app.config]
{config}
"""

SERVER_APP = '''\
"""ServerApp: the fedlightning loop on this run's Grid (written by `fedlightning flower-app`)."""

from fedlightning.flower_app import server

app = server.app
'''


#: the modules of :mod:`fedlightning.flower_app` that import only the standard library, ``flwr``
#: and each other: the apps fedlightning writes carry them as top-level ``fedlightning_<name>``
#: modules, so that their ClientApp and relay processes never import the fedlightning package
#: (whose import loads Lightning: seconds for every message)
LEAN_MODULES = ("envelope", "warm_client", "transport", "secure_grid", "relay")
PACKAGE_IMPORT = "from fedlightning.flower_app.{name} import"


def lean_source(name: str) -> str:
    """The source of lean module ``name`` with its imports of the other lean modules made
    top-level (``from fedlightning_envelope import ...``); any other fedlightning import is a
    bug of that module (a ``RuntimeError``)."""
    source = (Path(__file__).parent / f"{name}.py").read_text()
    for other in LEAN_MODULES:
        source = source.replace(
            PACKAGE_IMPORT.format(name=other), f"from fedlightning_{other} import"
        )
    leftover = [
        line.strip()
        for line in source.splitlines()
        if line.strip().startswith(("from fedlightning.", "import fedlightning"))
    ]
    if leftover:
        raise RuntimeError(f"flower_app/{name}.py must import only lean modules: {leftover}")
    return source


def write_lean_modules(directory: Path, names: tuple[str, ...] = LEAN_MODULES) -> None:
    """Write lean modules ``names`` into the app ``directory`` as ``fedlightning_<name>.py``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / f"fedlightning_{name}.py").write_text(lean_source(name))


def write_pyproject(
    directory: Path,
    name: str,
    serverapp: str,
    clientapp: str,
    config: dict[str, str | int | float | bool],
    dependencies: tuple[str, ...] = (),
) -> Path:
    """Write a Flower App ``pyproject.toml`` with these components, run config and dependencies
    (what a SuperLink/SuperNode allowing runtime dependency installation would install)."""
    directory.mkdir(parents=True, exist_ok=True)
    import tomli_w  # a dependency of flwr

    lines = tomli_w.dumps(config, multiline_strings=True)
    path = directory / "pyproject.toml"
    path.write_text(
        PYPROJECT.format(
            name=name,
            serverapp=serverapp,
            clientapp=clientapp,
            config=lines,
            dependencies=json.dumps(list(dependencies)),
        )
    )
    return path


def write_app(
    config: Path, out: Path, run_dir: str = "runs/flower", name: str = "fedlightning-app"
) -> Path:
    """Write the Flower App for ``config`` into ``out`` (see the module docstring); return ``out``."""
    from fedlightning.errors import ConfigurationError

    if not config.is_file():
        raise ConfigurationError(f"flower-app --config: {str(config)!r} is not a file")
    package = out / "fedlightning_app"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""A fedlightning run as a Flower App."""\n')
    (package / "server_app.py").write_text(SERVER_APP)
    (package / "client_app.py").write_text(lean_source("warm_client"))
    write_lean_modules(out, ("envelope",))
    (out / "fedlightning.yaml").write_text(config.read_text())
    write_pyproject(
        out,
        name,
        "fedlightning_app.server_app:app",
        "fedlightning_app.client_app:app",
        {"fedlightning-config": (out / "fedlightning.yaml").read_text(), "run-dir": run_dir},
        ("fedlightning[flower]",),
    )
    return out


def main(args: list[str] | None = None) -> None:
    """``fedlightning flower-app --config CONFIG --out DIR [--run-dir DIR]``."""
    parser = argparse.ArgumentParser(
        prog="fedlightning flower-app",
        description="Write a Flower App from a fedlightning config",
        allow_abbrev=False,  # one spelling per option (fedlightning.config_checks)
    )
    parser.add_argument(
        "-c", "--config", required=True, type=Path, help="a fedlightning config (YAML)"
    )
    parser.add_argument("--out", required=True, type=Path, help="directory to write the app to")
    parser.add_argument(
        "--run-dir", default="runs/flower", help="the run directory on the SuperLink's machine"
    )
    parser.add_argument("--name", default="fedlightning-app", help="the app's project name")
    ns = parser.parse_args(args)
    out = write_app(ns.config, ns.out, ns.run_dir, ns.name)
    print(f"wrote a Flower App to {out}: flwr run {out} <superlink-connection>")
