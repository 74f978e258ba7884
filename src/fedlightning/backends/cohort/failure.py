"""An objective that raises inside the cohort (docs/algorithms.md section 1, "Objectives a backend
cannot run"): the cohort trains its clients in one call, so one client's exception is every
client's, and no client can be left out on its own as a sequential fit leaves it. The run stops
with one line naming the objective, the exception, where the objective's code raised it, the
clients and round, and the fix; ``auto`` instead goes on sequentially
(:class:`~fedlightning.backends.auto.AutoBackend`)."""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from fedlightning.errors import ConfigurationError, PluginError, RunStopped, StorageError

#: the library's and torch's own code: a frame there is not where the objective raised
_LIBRARY_ROOTS = tuple(str(Path(m.__file__).parent) for m in (torch,)) + (
    str(Path(__file__).parents[1]),
)
#: errors that already say what happened (a refusal, a stop, storage) or that the chunking
#: handles (out of memory): not a client's failure
_PASSED_ON = (ConfigurationError, PluginError, RunStopped, StorageError, torch.OutOfMemoryError)


class CohortFitError(PluginError):
    """A client objective raised while the cohort trained its clients together."""


def raised_where(error: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``error``'s traceback outside the
    library and torch (the plug-in's own code), or ``""`` when every frame is theirs."""
    frames = traceback.extract_tb(error.__traceback__)
    outside = [f for f in frames if not f.filename.startswith(_LIBRARY_ROOTS)]
    if not outside:
        return ""
    frame = outside[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


@contextmanager
def cohort_failures(
    objective: object, round_index: int, client_ids: Sequence[int]
) -> Iterator[None]:
    """Turn an exception raised while the cohort trains ``client_ids`` in round ``round_index``
    (0-based) into a one-line :class:`CohortFitError`; refusals, stops and out-of-memory pass."""
    try:
        yield
    except _PASSED_ON:
        raise
    except Exception as error:
        text = str(error).strip().splitlines()
        what = f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__
        where = raised_where(error)
        clients = ", ".join(str(c) for c in client_ids)
        raise CohortFitError(
            f"{what} (raised{' at ' + where if where else ''}) while loop.backend=CohortBackend "
            f"trained model={type(objective).__name__}'s clients {clients} of round "
            f"{round_index + 1} together, so it fails them all: fix the objective, or use "
            "loop.backend=fedlightning.backends.SequentialBackend (or AutoBackend, which goes on "
            "sequentially), where a client whose fit raises is left out on its own"
        ) from error
