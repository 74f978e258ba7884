"""Plug-in failures mid-run are one line naming the culprit, never a traceback (issue 33 item
4): a server update that returns a numpy array, an aggregator state no checkpoint can hold. Each
stops after the last good checkpoint (or before any result file) with exit status 1."""

import re

import pytest
import torch


def _fails(cli, capsys, run_dir, *args, code=1, config="tiny.yaml") -> str:
    """Run the CLI, expect exit status ``code`` and no traceback; the last stderr line."""
    with pytest.raises(SystemExit) as exit_info:
        cli(run_dir, *args, config=config)
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_a_server_update_returning_numpy_stops_after_the_last_good_checkpoint(
    cli, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    line = _fails(cli, capsys, run_dir, "--loop.rounds", "3", "--loop.aggregator",
                  "user_clients.WrongServerUpdate", "--loop.aggregator.init_args.how", "numpy",
                  "--loop.aggregator.init_args.from_round", "2")  # fmt: skip
    assert re.fullmatch(
        r"fedlightning: stopped: WrongServerUpdate.server_update \(round 2\) returned "
        r"'(\S+)' as a numpy.ndarray of dtype numpy.float32, shape \(64, 64\), but the server "
        r"state holds a torch.Tensor of dtype torch.float32, shape \(64, 64\), on cpu: return a "
        r"tensor like server_round.mean\['\1'\]",
        line,
    ), line
    assert torch.load(run_dir / "last.ckpt", weights_only=True)["round"] == 1  # the good one
    assert not (run_dir / "global.pt").exists()


def test_an_aggregator_state_no_checkpoint_can_hold_is_named_before_the_first_checkpoint(
    cli, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    line = _fails(cli, capsys, run_dir, "--loop.aggregator", "user_clients.UnpicklableState")
    assert line == (
        "fedlightning: stopped: UnpicklableState.state_dict()['guard'] cannot go into the "
        "checkpoint of round 1: it is a _thread.lock, which cannot be pickled (TypeError: cannot "
        "pickle '_thread.lock' object); an aggregator's state holds tensors, numbers, strings "
        "and dicts, lists or tuples of them"
    )
    assert not (run_dir / "last.ckpt").exists() and not list(run_dir.glob(".last.ckpt.tmp-*"))
