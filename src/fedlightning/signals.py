"""SIGINT and SIGTERM end a run the same way wherever they land.

Python turns SIGINT (Ctrl-C) into ``KeyboardInterrupt`` and lets SIGTERM (what ``kill``, SLURM and
Kubernetes send first) kill the process with no cleanup and no message. Two libraries make this
worse: Lightning's Trainer catches ``KeyboardInterrupt`` and calls ``sys.exit(1)``
(``lightning.pytorch.trainer.call._call_and_handle_interrupt``), so Ctrl-C during a Trainer fit
(``loop.fit_with: trainer``, manual-optimization objectives, CoFED's participants) lost the round
and the resume hint; and ``ray.init`` replaces the SIGTERM handler with ``sys.exit(15)``.

So while a run runs, both signals raise :class:`StopSignal`: a ``BaseException`` that is not a
``KeyboardInterrupt``, which Lightning's Trainer re-raises after tearing itself down and which
client-failure handling (``except Exception``) never mistakes for a failed client. The loop turns
it into :class:`~fedlightning.errors.RunInterrupted` naming the round its checkpoint holds, and
the CLI exits with ``128 + signal number`` (130 for SIGINT, 143 for SIGTERM), the shell's
convention. A second signal while the first unwinds is ignored, so cleanup (closing loggers,
stopping Ray) finishes; SIGKILL still ends the process at once, and the checkpoint, written
atomically, is intact either way. A signal once every file of the run is complete
(:func:`finished`, just before its closing ``done:`` line) is ignored: the command exits 0;
unless the command has more runs to do (``fit --seeds``, :func:`more_work`), which it then stops.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

#: the signals that stop a run (and the order of their names in messages)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignal(BaseException):  # noqa: N818 (a signal, not an error)
    """SIGINT or SIGTERM arrived while a run ran (see the module docstring)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def signal_number(stop: BaseException) -> int:
    """The signal behind ``stop``: its ``signum``, or SIGINT for a plain ``KeyboardInterrupt``."""
    return int(getattr(stop, "signum", signal.SIGINT))


def stopped_by(signum: int) -> str:
    """How messages say a run ended: ``interrupted`` (SIGINT), ``terminated (SIGTERM)``."""
    return (
        "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
    )


def exit_status(signum: int) -> int:
    """The shell's exit status for a process ended by ``signum``: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum)


_stopping = {"active": False, "depth": 0, "finished": False, "pending": 0}


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    if _stopping["finished"]:  # the run is complete: kept for more_work, if more comes
        _stopping["pending"] = int(signum)
        return
    if _stopping["active"]:  # the first signal is unwinding the run
        return
    _stopping["active"] = True
    raise StopSignal(signum)


def finished() -> None:
    """The command's work is complete (every file written, only its closing line to print): from
    now on SIGINT and SIGTERM are ignored, so a signal in the last moments of a finished run (its
    teardown, the interpreter's exit) neither turns its exit status 0 into 130/143 nor kills the
    process without a line."""
    _stopping["active"] = _stopping["finished"] = True


def more_work() -> None:
    """A run that was :func:`finished` is one of several in this command (``fit --seeds``): from
    now on SIGINT and SIGTERM stop the command again, and one that arrived while the run was
    finishing is raised now (:class:`StopSignal`), so no signal is lost between the runs."""
    pending = _stopping["pending"]
    _stopping.update(active=False, finished=False, pending=0)
    if pending:
        _stopping["active"] = True
        raise StopSignal(pending)


@contextmanager
def stop_on_signals(ignore_once_finished: bool = False) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`StopSignal` in the main thread; the
    previous handlers are restored afterwards. Blocks may nest (the CLI's around the loop's).
    Outside the main thread (where Python cannot install handlers) the block runs unchanged.

    ``ignore_once_finished`` (the outermost block of a command's own process): if the work
    inside was :func:`finished`, both signals stay ignored after the block, until the process
    exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stop)
    _stopping["depth"] += 1
    try:
        yield
    finally:
        _stopping["depth"] -= 1
        done = False
        if _stopping["depth"] == 0:
            done = _stopping["finished"]
            _stopping.update(active=False, finished=False, pending=0)
        for signum, handler in previous.items():
            if done and ignore_once_finished:
                handler = signal.SIG_IGN
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """Restore the SIGTERM handler after the block: ``ray.init`` installs one that calls
    ``sys.exit(15)``, which would bypass :func:`stop_on_signals` (and its message)."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)
