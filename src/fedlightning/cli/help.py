"""The front page of the ``fedlightning`` command: its subcommands, ``--version``, the usage that a
bare ``fedlightning fit`` prints, ``fedlightning list`` (:mod:`fedlightning.cli.catalog`), and a
help formatter that shows docstrings as plain terminal text.

Docstrings are written in reStructuredText (``code``, :func:`name`, :mod:`~a.b`); in a terminal
the markup is noise, so :class:`PlainHelpFormatter` strips it from every description and option
help (the docstrings themselves stay as they are, for the API docs).
"""

from __future__ import annotations

import codecs
import re
import sys
import unicodedata
from collections.abc import Sequence

from jsonargparse import DefaultHelpFormatter

from fedlightning.cli.catalog import KINDS, kind_named
from fedlightning.errors import ConfigurationError, did_you_mean

SUBCOMMANDS: dict[str, str] = {
    "fit": "federated training: rounds of client fits and aggregation, from a YAML config",
    "cofed": "CoFED's one-shot pipeline: pseudo labels on a public set, no rounds",
    "plot": "overlay a metric of run directories; --group-by NAME: mean +- std over seeds",
    "test": "score a run's saved models (RUN_DIR/models.pt or last.ckpt) on the test set",
    "flower-app": "write a runnable Flower App (flwr run) from a config (the flower extra)",
    "list": "what a config can name: objectives, aggregators, attacks, backends, models, data",
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


#: how output spells, for a terminal whose encoding lacks them (``PYTHONIOENCODING=ascii``), the
#: characters fedlightning and its libraries print; others lose their accents, or become "?"
ASCII_SPELLINGS = {
    "±": "+-", "×": "x", "≤": "<=", "≥": ">=", "≈": "~", "→": "->", "←": "<-", "—": "--",
    "–": "-", "…": "...", "μ": "mu", "µ": "mu", "σ": "sigma", "ε": "eps", "δ": "delta",
    "·": ".", "•": "*", "‖": "||", "√": "sqrt", "∞": "inf", "²": "^2", "‘": "'", "’": "'",
    "“": '"', "”": '"',
}  # fmt: skip
#: the name of the codecs error handler that writes :data:`ASCII_SPELLINGS`
ASCII_HANDLER = "fedlightning-ascii"


def _ascii_spelling(error: UnicodeError) -> tuple[str, int]:
    """A codecs error handler: the characters ``error`` could not encode, spelled in ASCII."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    spelled = []
    for char in error.object[error.start : error.end]:
        plain_char = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode()
        spelled.append(ASCII_SPELLINGS.get(char) or plain_char or "?")
    return "".join(spelled), error.end


def readable_output() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` write what their encoding cannot (``±`` on an
    ASCII terminal) in ASCII spellings instead of raising UnicodeEncodeError, which would crash
    the command after its work (``--seeds``' summary) or in ``--help``. UTF-8 streams are left
    as they are."""
    codecs.register_error(ASCII_HANDLER, _ascii_spelling)
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "ascii"
        try:
            unicode = codecs.lookup(encoding).name.startswith("utf")
        except LookupError:
            unicode = False
        if hasattr(stream, "reconfigure") and not unicode:
            stream.reconfigure(errors=ASCII_HANDLER)


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


#: the options ``fedlightning fit`` takes besides its parser's (:mod:`fedlightning.cli.runs`), the
#: end of ``fedlightning fit --help``
FIT_EPILOG = (
    "fedlightning fit also takes --fast_dev_run (a smoke test: one round, 2 batches per client, "
    "nothing kept) and --seeds S [S ...] (a run per seed into RUN_DIR/seed_S, then mean ± std); "
    "fedlightning list names every objective, aggregator, attack, backend, model and data set."
)


def print_fit_usage(file=None) -> None:
    """What a bare ``fedlightning fit`` prints (to stderr; the command exits with status 2)."""
    file = file or sys.stderr
    print(
        "usage: fedlightning fit -c CONFIG [--GROUP.OPTION VALUE ...] [--fast_dev_run] "
        "[--seeds S [S ...]]\n"
        "fedlightning fit: a config is needed; the ready ones are under configs/, e.g.\n"
        "  fedlightning fit -c configs/quickstart.yaml\n"
        "  fedlightning fit -c configs/quickstart.yaml --print_config   # the config as it will run\n"
        "  fedlightning fit -c configs/quickstart.yaml --fast_dev_run   # does it run? nothing kept\n"
        "  fedlightning fit -c configs/quickstart.yaml --seeds 0 1 2    # a run per seed, mean ± std\n"
        "  fedlightning fit --help                                      # every option",
        file=file,
    )


def print_catalog(titles: Sequence[str], file=None) -> None:
    """``fedlightning list [KIND ...]``: each kind's short names (those the command line and
    configs accept) with one line each; all kinds when ``titles`` is empty."""
    unknown = [title for title in titles if kind_named(title) is None]
    if unknown:
        titles = [kind.title for kind in KINDS]
        raise ConfigurationError(
            f"fedlightning list {unknown[0]}: no such kind{did_you_mean(unknown[0], titles)} "
            f"(all: {', '.join(titles)})"
        )
    file = file or sys.stdout
    kinds = [kind_named(title) for title in titles] or list(KINDS)
    width = max(len(name) for kind in kinds for name in kind.entries)
    blocks = []
    for kind in kinds:
        lines = [f"{kind.title} ({kind.option} NAME):"]
        lines += [f"  {name:<{width}}  {line}" for name, line in kind.entries.items()]
        blocks.append("\n".join(lines))
    print("\n\n".join(blocks), file=file)
