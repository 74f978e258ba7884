"""What goes wrong at the command line, said in one line instead of a traceback.

- :func:`check_subcommand`: an unknown subcommand names the closest ones.
- :func:`check_config_files`: a ``-c/--config`` file that does not exist names the closest
  config files; one that is not UTF-8 text (or cannot be read) is refused naming the file and
  where the bad byte is, and one that gives a key twice naming the key and both lines, before
  anything is parsed; so is a group's file (``--loop FILE``) or a nested option's YAML file.
- :func:`configuration_error`: the ConfigurationError behind an error (jsonargparse wraps those
  raised while instantiating); a parse error is one already (:mod:`fedlightning.cli.fit`,
  :mod:`fedlightning.cli.names`).
- :func:`one_line_error`: a class named by ``class_path`` (an objective, an aggregator, a logger,
  a backend) whose constructor raised names the class, the exception and where it was raised; a
  Lightning logger whose optional package is missing names the package and how to install it; a
  path with a name longer than the file system allows names the path.
- :func:`stop_report`: the lines and exit status of a run stopped by SIGINT or SIGTERM
  (:mod:`fedlightning.signals`): the round reached and the command that resumes it.
"""

from __future__ import annotations

import errno
import shlex
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from fedlightning.cli.help import SUBCOMMANDS
from fedlightning.config_checks import check_yaml_keys
from fedlightning.errors import ConfigurationError, RunInterrupted, closest, did_you_mean
from fedlightning.loop.rundir import NAME_MAX
from fedlightning.signals import exit_status, signal_number, stopped_by

#: a missing package named in an error -> how to install it (fedlightning's own extras first)
EXTRAS = {
    "tensorboard": "pip install 'fedlightning[tensorboard]' (make install has it)",
    "tensorboardX": "pip install 'fedlightning[tensorboard]' (make install has it)",
    "ray": "pip install 'fedlightning[ray]' (make install has it)",
    "datasets": "pip install 'fedlightning[hf]' (make install has it)",
    "flwr": "pip install 'fedlightning[flower]' (make install has it)",
}


def check_subcommand(argv: Sequence[str]) -> None:
    """Refuse a first word that is no subcommand, naming the closest ones."""
    if argv[0] not in SUBCOMMANDS:
        raise ConfigurationError(
            f"{argv[0]!r} is not a subcommand{did_you_mean(argv[0], list(SUBCOMMANDS))} "
            f"(all: {', '.join(SUBCOMMANDS)}; fedlightning --help)"
        )


def check_config_files(argv: Sequence[str]) -> None:
    """Refuse a ``-c FILE`` / ``--config FILE`` / ``--config=FILE`` that does not exist (naming
    the YAML files with the closest names in its folder), is not readable UTF-8 text (the
    parsers would fail with a UnicodeDecodeError traceback), or whose YAML gives a key twice in
    one mapping (:func:`fedlightning.config_checks.check_yaml_keys`)."""
    for flag, path in config_arguments(argv):
        file = Path(path)
        try:
            if not file.exists():
                raise ConfigurationError(f"{flag} {path!r} does not exist{_near_files(file)}")
            if not file.is_file():
                continue  # a folder: the parser says what it takes
            data = file.read_bytes()
        except OSError as error:
            reason = os_reason(error, path)
            raise ConfigurationError(f"{flag} {path!r} cannot be read: {reason}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data[: error.start].count(b"\n") + 1
            column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
            raise ConfigurationError(
                f"{flag} {path!r} is not UTF-8 text: byte 0x{data[error.start]:02x} at line "
                f"{line}, column {column} cannot be decoded; save the file as UTF-8"
            ) from None
        check_yaml_keys(text, f"{flag} {path!r}")


def _near_files(file: Path) -> str:
    """``"; the closest: ..."`` among the YAML files of ``file``'s folder."""
    folder = file.parent
    if not folder.is_dir():
        return f" (nor does its folder {str(folder)!r})"
    near = closest(file.name, sorted(p.name for p in folder.glob("*.y*ml")))
    return f"; the closest: {', '.join(str(folder / name) for name in near)}" if near else ""


#: the command's groups, each of which takes a file of its own options (``--loop FILE``)
GROUPS = ("--loop", "--model", "--data")
#: the names of the files a nested option reads (``--loop.aggregator agg.yaml``)
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def config_arguments(argv: Sequence[str]) -> list[tuple[str, str]]:
    """``(option, path)`` of each ``-c/--config`` file, and of each existing file given as an
    option's value that the parser reads as options: a group's (``--loop FILE``) or a YAML/JSON
    file of a nested option (``--loop.aggregator agg.yaml``)."""
    found = []
    for i, word in enumerate(argv):
        flag, _, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if not value and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
        if flag in ("-c", "--config") and value:
            found.append((flag, value))
        elif flag.startswith("--") and value and _is_file(value):
            if flag in GROUPS or value.lower().endswith(CONFIG_SUFFIXES):
                found.append((flag, value))
    return found


def _is_file(value: str) -> bool:
    """Whether ``value`` names an existing file (a name too long for one is no file: its
    option's own check names it)."""
    try:
        return Path(value).is_file()
    except (OSError, ValueError):
        return False


def os_reason(error: OSError, path: str | None = None) -> str:
    """An OSError in words; for a name too long, which component is too long."""
    path = str(error.filename) if error.filename is not None else path
    if error.errno == errno.ENAMETOOLONG and path is not None:
        longest = max(Path(path).parts, key=lambda part: len(part.encode()), default="")
        size = len(longest.encode())
        if size > NAME_MAX:
            return (
                f"the name {longest[:40]!r}... is {size} bytes long, more than the "
                f"{NAME_MAX} bytes a file name may have; choose a shorter name"
            )
        return f"the path is {len(path.encode())} bytes long, too long for the file system"
    return error.strerror or str(error)


def configuration_error(error: BaseException | None) -> ConfigurationError | None:
    """The ConfigurationError behind ``error`` (jsonargparse wraps errors raised while
    instantiating), or None."""
    for link in _chain(error) if error is not None else []:
        if isinstance(link, ConfigurationError):
            return link
    return None


def one_line_error(error: BaseException) -> str | None:
    """A one-line message for the errors of the module docstring, or None (not one of them)."""
    chain = _chain(error)
    for link in chain:
        if isinstance(link, OSError) and link.errno == errno.ENAMETOOLONG:
            return f"{str(link.filename)[:80]!r}...: {os_reason(link)}"
    root = chain[-1]
    cls = _constructed_class(root.__traceback__)
    if cls is None:
        return None
    name = f"{cls.__module__}.{cls.__qualname__}"
    text = " ".join(str(root).split())
    if isinstance(root, ImportError):  # Lightning's loggers raise ModuleNotFoundError
        return f"{name} needs {_install_hint(text)}"
    where = _raised_at(root.__traceback__)
    return f"{name}(...) raised {type(root).__name__}: {text}{where}"


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and its causes, outermost first."""
    chain, seen = [], set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _constructed_class(trace: TracebackType | None) -> type | None:
    """The class whose ``__init__`` jsonargparse called when ``trace`` was raised: the first
    ``__init__`` frame after a jsonargparse frame, by the type of its ``self``."""
    after_parser = False
    while trace is not None:
        frame = trace.tb_frame
        if frame.f_globals.get("__name__", "").startswith("jsonargparse"):
            after_parser = True
        elif after_parser and frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            return type(frame.f_locals["self"])
        trace = trace.tb_next
    return None


def _raised_at(trace: TracebackType | None) -> str:
    last = None
    while trace is not None:
        last, trace = trace, trace.tb_next
    if last is None:
        return ""
    return f" (at {Path(last.tb_frame.f_code.co_filename).name}:{last.tb_lineno})"


def _install_hint(text: str) -> str:
    """``what, which is not installed: how`` from Lightning's ModuleNotFoundError text."""
    for package, hint in EXTRAS.items():
        if f"'{package}" in text or f"`{package}`" in text:
            return f"{package}, which is not installed: {hint}"
    if "Requirement '" in text:
        requirement = text.split("Requirement '", 1)[1].split("'", 1)[0]
        return f"{requirement}, which is not installed: pip install '{requirement}'"
    return f"a package that is not installed ({text})"


def stop_report(stop: BaseException, argv: Sequence[str]) -> tuple[list[str], int]:
    """The lines to print for a run stopped by a signal, and the exit status (128 + signum)."""
    signum = signal_number(stop)
    if isinstance(stop, RunInterrupted):
        lines = str(stop).splitlines()  # a --seeds sweep's: its resume commands
        if stop.checkpoint and argv[:1] == ["fit"]:
            lines.append(f"to resume: {resume_command(argv, stop.checkpoint)}")
    elif argv[:1] in (["fit"], ["cofed"]):  # before the run held its directory
        lines = [f"{stopped_by(signum)} during start-up: nothing was written"]
    else:
        lines = [stopped_by(signum)]
    return lines, exit_status(signum)


def resume_command(argv: Sequence[str], checkpoint: str) -> str:
    """``fedlightning`` with ``argv`` (without a ``--ckpt_path``) and ``--ckpt_path checkpoint``."""
    kept = without_option(argv, "--ckpt_path")
    return shlex.join(["fedlightning", *kept, "--ckpt_path", checkpoint])


def without_option(argv: Sequence[str], option: str) -> list[str]:
    """``argv`` without ``option VALUE`` and ``option=VALUE``."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == option:
            skip = True
        elif not word.startswith(f"{option}="):
            kept.append(word)
    return kept
