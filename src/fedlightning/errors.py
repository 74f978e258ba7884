"""Errors the library raises for bad user input."""


class ConfigurationError(ValueError):
    """A user-facing option has a value the library cannot run with.

    The message names the option, the bad value and what is allowed. The CLI prints it without a
    traceback and exits with status 2, before any training starts.
    """


def require(ok: bool, option: str, value: object, allowed: str) -> None:
    """Raise ``ConfigurationError("<option>=<value> is not allowed: expected <allowed>")`` unless ``ok``."""
    if not ok:
        raise ConfigurationError(f"{option}={value!r} is not allowed: expected {allowed}")


class RunStopped(RuntimeError):
    """A run stopped on purpose before its last round (``loop.on_round_failure: stop``).

    The CLI prints the message without a traceback and exits with status 1; the last checkpoint
    written before the stop resumes the run.
    """
