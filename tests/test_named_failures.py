"""Plug-in and storage failures mid-run are one line naming the culprit, never a traceback
(issue 33 items 4 and 5): a server update that returns a numpy array, an aggregator state no
checkpoint can hold, the run directory removed under a live run, a full disk while writing client
state, W&B's own folders unwritable. Each stops after the last good checkpoint (or before any
result file) with exit status 1 (2 for what start-up refuses)."""

import errno
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import cli_fails
from fedlightning.errors import ConfigurationError, StorageError
from fedlightning.loop.reporting import Reporter
from fedlightning.tracking import check_wandb_folders, wandb_writes


def test_a_server_update_returning_numpy_stops_after_the_last_good_checkpoint(
    cli, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    line = cli_fails(cli, capsys, run_dir, "--loop.rounds", "3", "--loop.aggregator",
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
    line = cli_fails(cli, capsys, run_dir, "--loop.aggregator", "user_clients.UnpicklableState")
    assert line == (
        "fedlightning: stopped: UnpicklableState.state_dict()['guard'][0] cannot go into the "
        "checkpoint of round 1: it is a _thread.lock, which cannot be pickled (TypeError: cannot "
        "pickle '_thread.lock' object); an aggregator's state holds tensors, numbers, strings "
        "and dicts, lists or tuples of them"
    )
    assert not (run_dir / "last.ckpt").exists() and not list(run_dir.glob(".last.ckpt.tmp-*"))


def test_a_run_directory_removed_under_a_live_run_is_named_as_such(
    cli, tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "run"
    real = Reporter.round_line

    def remove_after_round_1(self, metrics, rounds, last):
        real(self, metrics, rounds, last)
        shutil.rmtree(run_dir)  # another process, between two rounds

    monkeypatch.setattr(Reporter, "round_line", remove_after_round_1)
    line = cli_fails(cli, capsys, run_dir, "--loop.rounds", "3")
    assert line == (
        f"fedlightning: storage error: loop.run_dir={str(run_dir)!r} was removed while the run "
        "was running (by another process): the run's files there are gone; start the run again"
    )
    assert not run_dir.exists()  # nothing recreated it


def test_a_full_disk_while_writing_client_state_says_so_naming_the_folder(
    cli, tmp_path, capsys, monkeypatch
):
    """torch.save's own writer said ``[enforce fail at inline_container.cc] unexpected pos``:
    the state is serialized in memory and written in one plain write, whose ENOSPC is named."""
    run_dir = tmp_path / "run"
    real = Path.write_bytes

    def full(self, data):
        if self.parent.name == "client_state":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    line = cli_fails(cli, capsys, run_dir, "--loop.client_state", "disk", "--loop.rounds", "2",
                  config="scaffold_tiny.yaml")  # fmt: skip
    assert re.fullmatch(
        rf"fedlightning: storage error: could not write client \d+'s state in "
        rf"{re.escape(repr(str(run_dir / 'client_state')))}: no space left on the device "
        rf"\(.*client_state/\d+\.1\.[0-9a-f]{{16}}\.pt\)",
        line,
    ), line
    assert {p.name for p in (run_dir / "client_state").iterdir()} == {
        ".fedlightning.lock",
        ".fedlightning.owner",
    }


def test_unwritable_wandb_folders_are_refused_at_start_up_naming_the_variable(
    cli, tmp_path, capsys, monkeypatch
):
    (tmp_path / "home").write_text("a file where a folder should be\n")
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "home" / "wandb"))
    line = cli_fails(cli, capsys, tmp_path / "run", "--loop.wandb", "true", code=2)
    assert line == (
        f"fedlightning: error: loop.wandb=true, but W&B cannot write "
        f"{str(tmp_path / 'home' / 'wandb' / 'artifacts' / 'staging')!r} "
        f"({str(tmp_path / 'home')!r} is not a directory): set WANDB_DATA_DIR to a writable "
        "directory"
    )
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "home" / "cache"))
    with pytest.raises(ConfigurationError, match="set WANDB_CACHE_DIR to a writable directory"):
        check_wandb_folders()


def test_a_wandb_write_that_fails_later_names_wandbs_folders_not_the_run_directory():
    staging = "Unable to write staging files to /home/u/.local/share/wandb/artifacts/staging."
    with pytest.raises(StorageError) as error, wandb_writes():
        raise PermissionError(staging)
    assert str(error.value) == (
        f"W&B could not write its files: {staging}; W&B's folders move with WANDB_DIR (its run "
        "files), WANDB_DATA_DIR (staging), WANDB_CACHE_DIR (cache), WANDB_CONFIG_DIR (settings)"
    )


def test_a_wandb_staging_write_failing_mid_run_names_wandbs_folder_not_the_run_directory(
    cli, tmp_path, capsys, monkeypatch
):
    """W&B offline with its folders under a HOME it cannot write (the start-up check passes,
    as it does for root): a W&B write in its staging folder that fails outside fedlightning's
    own W&B calls (here the logged metrics of round 2) names that folder and WANDB_DATA_DIR
    (issue 43 item 8). Before: "could not write the run's files in '<run_dir>'"."""
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # W&B's folders default under it
    for variable in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "XDG_DATA_HOME"):
        monkeypatch.delenv(variable, raising=False)
    data = tmp_path / "home" / ".local" / "share" / "wandb"
    real = WandbLogger.log_metrics

    def log_metrics(self, metrics, step=None):
        if step == 2:
            staged = data / "artifacts" / "staging" / "tmp3k2x"
            raise PermissionError(errno.EACCES, "Permission denied", str(staged))
        return real(self, metrics, step)

    monkeypatch.setattr(WandbLogger, "log_metrics", log_metrics)
    line = cli_fails(cli, capsys, tmp_path / "run", "--loop.wandb", "true", "--loop.rounds", "2")
    assert line == (
        f"fedlightning: storage error: W&B could not write {str(data)!r}, its folder outside "
        "the run directory: Permission denied; set WANDB_DATA_DIR to a writable directory"
    )
    import wandb

    # The failed run's W&B run is finished, not left open: its transaction log is on disk and the
    # process's next W&B run starts clean (before, the next run in the process wrote no log).
    assert wandb.run is None
    assert len(list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))) == 1
