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
