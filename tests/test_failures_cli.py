"""Faults through the CLI. Failed and poisoned clients: left out, counted, named in the log, their
client state untouched, and the run goes on; a run that cannot go on stops with a clear message.
Signals (SIGINT, SIGTERM) wherever they land: one line, exit 130 / 143, a checkpoint that
resumes bitwise (real processes signalled from outside: tests/test_signals.py)."""

import logging
import os
import signal

import pytest
import torch

from fedlightning.backends.cohort import CohortBackend
from fedlightning.backends.sequential import SequentialBackend
from test_signals import check_stopped, resume_equals_straight
from user_clients import SignalMidFit


def test_crashing_and_nan_clients_never_sink_a_run(cli, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="fedlightning")
    args = (
        "--model.class_path",
        "user_clients.CrashAndNaNClients",
        "--loop.clients_per_round",
        "8",
    )
    rows = cli(tmp_path, *args, "--loop.rounds", "3", config="scaffold_tiny.yaml")
    assert [int(r["round"]) for r in rows] == [1, 2, 3]
    assert all(int(float(r["clients_failed"])) == 1 for r in rows)
    assert all(int(float(r["clients_rejected"])) == 1 for r in rows)
    assert float(rows[-1]["test_acc"]) > 0.5  # the six healthy clients still train the model
    log = caplog.text
    assert "client(s) 0 failed and are left out" in log and "simulated crash of client 0" in log
    assert "client(s) 1 uploaded NaN/Inf values and are left out" in log
    states = torch.load(tmp_path / "last.ckpt", weights_only=True)["clients"]["states"]
    # the failed and the rejected client keep the state they had before (none: zeros at start)
    assert "c_i" not in states.get(0, {}) and "c_i" not in states.get(1, {})
    assert all("c_i" in states[cid] for cid in range(2, 8))
    global_state = torch.load(tmp_path / "global.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in global_state.values())


def test_a_round_below_min_clients_stops_with_a_clear_message(cli, tmp_path, capsys):
    args = (
        "--model.class_path",
        "user_clients.CrashAndNaNClients",
        "--loop.clients_per_round",
        "8",
    )
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path, *args, "--loop.min_clients", "7", "--loop.on_round_failure", "stop",
            config="scaffold_tiny.yaml")  # fmt: skip
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "round 1: only 6 of 8 clients succeeded (min_clients=7)" in err
    assert "Traceback" not in err


# -- signals: where they land, what the run says (issue 26 item 3) --------------------------------
def _at_round(backend):
    """A real signal to this process as ``backend``'s third round starts."""

    def inject(monkeypatch, name):
        real_run = backend.run

        def run(self, r, jobs):
            if r == 2:
                os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
            return real_run(self, r, jobs)

        monkeypatch.setattr(backend, "run", run)

    return inject


def _mid_fit(monkeypatch, name):
    """A real signal from inside the 10th client fit (round 3 of 4 fits a round), a Trainer fit."""
    monkeypatch.setenv("FEDLIGHTNING_TEST_SIGNAL", f"{name}:10")
    monkeypatch.setattr(SignalMidFit, "fits", 0)


SIGNAL_FAULTS = {
    "SIGTERM-sequential": (["--loop.backend", "SequentialBackend"], _at_round(SequentialBackend), "TERM"),
    "SIGINT-cohort": (["--loop.backend", "CohortBackend"], _at_round(CohortBackend), "INT"),
    "SIGINT-trainer-fit": (["--model", "user_clients.TrainerFitSignalled"], _mid_fit, "INT"),
    "SIGTERM-fit_with-trainer": (["--model", "user_clients.TrainerFitSignalled", "--loop.fit_with", "trainer"], _mid_fit, "TERM"),
    "SIGTERM-manual-optimization": (["--model", "user_clients.ManualOptimizationSignalled"], _mid_fit, "TERM"),
}  # fmt: skip


@pytest.mark.parametrize("fault", SIGNAL_FAULTS)
def test_a_signal_stops_at_the_checkpoint_and_the_resume_is_bitwise(
    cli, tmp_path, capsys, monkeypatch, fault
):
    """Lightning's Trainer turned Ctrl-C into exit status 1 with nothing said, SIGTERM killed the
    process: now one line naming round 2's checkpoint and the resume command, exit 130 / 143,
    and resuming from it ends bitwise equal to an uninterrupted run."""
    args, inject, name = SIGNAL_FAULTS[fault]
    inject(monkeypatch, name)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        cli(run_dir, *args, "--loop.rounds", "5")
    assert exit_info.value.code == {"INT": 130, "TERM": 143}[name]
    assert check_stopped(capsys.readouterr().err, name, run_dir) == 2
    monkeypatch.undo()
    resume_equals_straight(cli, run_dir, tmp_path / "straight", *args, rounds=4)
