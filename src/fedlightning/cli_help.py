"""The front page of the ``fedlightning`` command: its subcommands, ``--version``, the usage that a
bare ``fedlightning fit`` prints, and a help formatter that shows docstrings as plain terminal text.

Docstrings are written in reStructuredText (``code``, :func:`name`, :mod:`~a.b`); in a terminal
the markup is noise, so :class:`PlainHelpFormatter` strips it from every description and option
help (the docstrings themselves stay as they are, for the API docs).
"""

from __future__ import annotations

import re
import sys

from jsonargparse import DefaultHelpFormatter

SUBCOMMANDS: dict[str, str] = {
    "fit": "federated training: rounds of client fits and aggregation, from a YAML config",
    "cofed": "CoFED's one-shot pipeline: pseudo labels on a public set, no rounds",
    "plot": "overlay a metric of run directories; --group-by NAME: mean +- std over seeds",
    "test": "score a run's saved models (RUN_DIR/models.pt or last.ckpt) on the test set",
    "flower-app": "write a runnable Flower App (flwr run) from a config (the flower extra)",
}

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`<]*?)(?:\s*<[^`>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")
_LINK = re.compile(r"`([^`<]+?)\s*<([^`>]+)>`_+")


def plain(text: str) -> str:
    """``text`` without reStructuredText markup: roles keep their last dotted name (a tilde
    shortens ``~a.b.c`` to ``c`` as Sphinx does; otherwise the full name), literals lose their
    double backticks, and links become ``title (url)``."""

    def role(match: re.Match) -> str:
        name = match.group(1).strip()
        return name.rsplit(".", 1)[-1] if match.group(0).split("`", 1)[1].startswith("~") else name

    text = _ROLE.sub(role, text)
    text = _LINK.sub(r"\1 (\2)", text)
    return _LITERAL.sub(r"\1", text)


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter (types, defaults) with RST markup stripped."""

    def start_section(self, heading: str | None) -> None:
        super().start_section(plain(heading) if heading else heading)

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action) -> str:
        return plain(super()._expand_help(action))


def version() -> str:
    """The installed distribution's version (the package's ``__version__`` from a source tree)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("fedlightning")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree only
        from fedlightning import __version__

        return __version__


def print_overview(file=None) -> None:
    """``fedlightning --help``: one line per subcommand."""
    file = file or sys.stdout
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [
        "usage: fedlightning {" + ",".join(SUBCOMMANDS) + "} -c CONFIG [OPTIONS]",
        "       fedlightning --version",
        "",
        "Federated learning research on PyTorch Lightning.",
        "",
        "subcommands:",
        *(f"  {name:<{width}}  {text}" for name, text in SUBCOMMANDS.items()),
        "",
        "`fedlightning SUBCOMMAND --help` lists a subcommand's options; configs/ holds ready configs:",
        "  fedlightning fit -c configs/quickstart.yaml",
    ]
    print("\n".join(lines), file=file)


def print_fit_usage(file=None) -> None:
    """What a bare ``fedlightning fit`` prints (to stderr; the command exits with status 2)."""
    file = file or sys.stderr
    print(
        "usage: fedlightning fit -c CONFIG [--GROUP.OPTION VALUE ...]\n"
        "fedlightning fit: a config is needed; the ready ones are under configs/, e.g.\n"
        "  fedlightning fit -c configs/quickstart.yaml\n"
        "  fedlightning fit -c configs/quickstart.yaml --print_config   # the config as it will run\n"
        "  fedlightning fit --help                                      # every option",
        file=file,
    )
