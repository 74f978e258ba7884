"""Errors the library raises: bad user input, stopped runs, storage failures, lost workers."""

import difflib
import errno
import inspect
import signal
from collections.abc import Sequence
from pathlib import Path


class ConfigurationError(ValueError):
    """A user-facing option has a value the library cannot run with.

    The message names the option, the bad value and what is allowed. The CLI prints it without a
    traceback and exits with status 2, before any training starts.
    """


def require(ok: bool, option: str, value: object, allowed: str) -> None:
    """Raise ``ConfigurationError("<option>=<value> is not allowed: expected <allowed>")`` unless ``ok``."""
    if not ok:
        raise ConfigurationError(f"{option}={value!r} is not allowed: expected {allowed}")


def closest(name: str, choices: Sequence[str], n: int = 3) -> list[str]:
    """The ``n`` choices closest to ``name``, case ignored: the one it spells in other case
    (``fedavg``: ``FedAvg``), then those it begins, then by difflib's ratio (at least 0.6)."""
    lowered = {choice.lower(): choice for choice in choices}
    key = name.lower()
    near = [key] if key in lowered else []
    near += [c for c in lowered if c.startswith(key) and c != key]
    near += difflib.get_close_matches(key, list(lowered), n, 0.6)
    return [lowered[c] for c in dict.fromkeys(near)][:n]


def did_you_mean(name: str, choices: Sequence[str]) -> str:
    """``"; the closest: a, b"`` (nothing when no choice is close)."""
    near = closest(name, choices)
    return f"; the closest: {', '.join(near)}" if near else ""


def what_it_is(value: object) -> str:
    """What ``value`` is, in words, for a message that refuses it where a subclass of some base
    is expected: ``a class derived from object``, ``a function``, ``a module``, ``an instance of
    CoordinateMax (a class derived from object)``."""
    if isinstance(value, type):
        bases = ", ".join(f"{b.__module__}.{b.__qualname__}".removeprefix("builtins.")
                          for b in value.__bases__)  # fmt: skip
        return f"a class derived from {bases}"
    if inspect.ismodule(value):
        return "a module"
    if inspect.isroutine(value):
        return "a function"
    if type(value) is object:
        return "a plain object"
    return f"an instance of {type(value).__qualname__} ({what_it_is(type(value))})"


def unknown_name(what: str, name: str, choices: Sequence[str]) -> ConfigurationError:
    """``unknown <what> '<name>': choose one of <choices>; the closest: ...``."""
    return ConfigurationError(
        f"unknown {what} {name!r}: choose one of {', '.join(choices)}{did_you_mean(name, choices)}"
    )


class RunStopped(RuntimeError):
    """A run stopped on purpose before its last round (``loop.on_round_failure: stop``).

    The CLI prints the message without a traceback and exits with status 1; the last checkpoint
    written before the stop resumes the run.
    """


class StorageError(RuntimeError):
    """The run could not read or write its own files (a full disk, a read-only or vanished run
    directory, a client-state file deleted under it). A framework error, never a client failure:
    the CLI prints the message (which names the path) and exits with status 1."""


class PluginError(RuntimeError):
    """A plug-in (an aggregator's ``server_update`` or ``state_dict``, an objective's state) broke
    its contract mid-run: the message names the plug-in, the key, what came and what was
    expected. The run stops after its last good checkpoint; the CLI prints the message without a
    traceback and exits with status 1. Python callers get this exception."""


def storage_error(error: OSError, path: str | Path, doing: str, note: str = "") -> StorageError:
    """A one-line :class:`StorageError` for an OSError met while ``doing`` in ``path``."""
    reason = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
    }.get(error.errno or -1, error.strerror or str(error))
    where = f" ({error.filename})" if error.filename else ""
    return StorageError(f"could not {doing} in {str(path)!r}: {reason}{where}{note}")


class RunInterrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM during a run (:mod:`fedlightning.signals`). The message says
    after which round it stopped and which checkpoint resumes it; the CLI prints it and exits with
    status ``128 + signum`` (130 for SIGINT, 143 for SIGTERM). ``checkpoint`` is the path that
    resumes the run, or None; ``rounds`` the rounds it holds."""

    def __init__(
        self,
        message: str,
        signum: int = signal.SIGINT,
        checkpoint: str | None = None,
        rounds: int | None = None,
    ) -> None:
        super().__init__(message)
        self.signum = int(signum)
        self.checkpoint = checkpoint
        self.rounds = rounds


class WorkerLost(RuntimeError):
    """The worker that ran (or was to run) a client fit died or was unavailable (an actor killed
    by the OS, a node lost). The client failed, but this is no evidence of a bug in the objective:
    the failure policy never stops a run for it. Raised by the backends and the Flower transport,
    read by the loop's failure policy, so it lives here, below all three."""
