"""Failed and poisoned clients through the CLI: left out, counted, named in the log, their client
state untouched, and the run goes on; a run that cannot go on stops with a clear message."""

import logging

import pytest
import torch


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
