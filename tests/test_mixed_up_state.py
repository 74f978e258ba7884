"""Checkpoints and client state cannot be mixed up (issue 43 item 7): a checkpoint whose round or
metrics history was edited is refused (it would resume from a round the run never reached); a
run whose ``client_state`` folder is another run directory's folder, by device and inode (a bind
mount of a finished run's folder, or that folder moved in), is refused before it deletes that
run's state files, whatever its path says; a copied run directory resumes with its own copy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import cli_fails, run_cli
from fedlightning.errors import ConfigurationError
from fedlightning.loop.checkpoint import read_checkpoint

DISK = ("--loop.client_state", "disk")
TWO = (*DISK, "--loop.rounds", "2")


def _fails(cli, capsys, run_dir, *args) -> str:
    return cli_fails(cli, capsys, run_dir, *args, code=2, config="scaffold_tiny.yaml")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-round SCAFFOLD run with its client state on disk."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_cli(run_dir, *TWO, config="scaffold_tiny.yaml")
    return run_dir


@pytest.mark.parametrize("edit", ["round", "history"])
def test_a_checkpoint_whose_round_or_history_was_edited_is_refused(
    cli, capsys, tmp_path, finished, edit
):
    checkpoint = torch.load(finished / "last.ckpt", weights_only=True)
    if edit == "round":
        checkpoint["round"] = 5
    else:
        checkpoint["history"] = checkpoint["history"][:1]
    edited = tmp_path / "edited.ckpt"
    torch.save(checkpoint, edited)
    with pytest.raises(ConfigurationError, match=r"changed after the run wrote it"):
        read_checkpoint(str(edited))
    before = _files(finished)
    line = _fails(cli, capsys, finished, *DISK, "--loop.rounds", "6", "--ckpt_path", str(edited))
    assert line == (
        f"fedlightning: error: ckpt_path={str(edited)!r} is inconsistent: its round "
        f"({checkpoint['round']}) or its metrics history was changed after the run wrote it "
        "(they no longer match their seal), so it would resume from a round the run never "
        "reached; resume from an unedited checkpoint"
    )
    assert _files(finished) == before


def test_a_checkpoint_written_before_the_seal_is_read_as_before(tmp_path, finished):
    checkpoint = torch.load(finished / "last.ckpt", weights_only=True)
    del checkpoint["seal"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    assert read_checkpoint(str(tmp_path / "old.ckpt"))["round"] == 2


def _refusal(run_dir: Path, finished: Path) -> str:
    return (
        f"fedlightning: error: loop.run_dir: the client state folder "
        f"{str(run_dir / 'client_state')!r} is the client state folder of the run in "
        f"{str(finished.resolve())!r} (the same folder, by device and inode, reached from "
        f"{str(run_dir)!r} through a bind mount or moved here), and this run would delete that "
        "run's state files: unmount or move it back, or choose another loop.run_dir"
    )


def test_a_bind_mount_of_a_finished_runs_client_state_is_refused(cli, capsys, tmp_path, finished):
    """The issue's case, where the sandbox lets the test mount (root): a new run, and one told to
    overwrite, whose client_state is a bind mount of the finished run's folder."""
    state = finished / "client_state"
    before = _files(state)
    mount_point = tmp_path / "new" / "client_state"
    mount_point.mkdir(parents=True)
    mounted = subprocess.run(["mount", "--bind", str(state), str(mount_point)],
                             capture_output=True, check=False)  # fmt: skip
    if mounted.returncode:
        pytest.skip(f"mount --bind is not permitted here: {mounted.stderr.decode().strip()}")
    try:
        for extra in ((), ("--loop.overwrite", "true")):
            line = _fails(cli, capsys, tmp_path / "new", *TWO, *extra)
            assert line == _refusal(tmp_path / "new", finished)
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
    assert _files(state) == before and len(before) > 2  # the state files and the lock are kept


def test_a_client_state_folder_moved_into_another_run_directory_is_refused(
    cli, capsys, tmp_path, finished
):
    """The same folder under another run directory without a mount: moved there (same device and
    inode). A path or link check cannot see it; the folder's identity does."""
    source = tmp_path / "source"
    shutil.copytree(finished, source)  # a run of our own to move the folder out of
    cli(source, *DISK, "--loop.rounds", "3", "--ckpt_path", str(source / "last.ckpt"),
        config="scaffold_tiny.yaml")  # fmt: skip
    moved = tmp_path / "new" / "client_state"
    moved.parent.mkdir()
    (source / "client_state").rename(moved)
    before = _files(moved)
    assert _fails(cli, capsys, tmp_path / "new", *TWO) == _refusal(tmp_path / "new", source)
    assert _files(moved) == before


def test_a_copied_run_directory_resumes_with_its_own_copy_of_the_state(cli, tmp_path, finished):
    """A copy is another folder (another inode): it resumes, and equals the original resumed."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    shutil.copytree(finished, original)
    shutil.copytree(finished, copy)
    for run_dir in (original, copy):
        cli(run_dir, *DISK, "--loop.rounds", "3", "--ckpt_path", str(run_dir / "last.ckpt"),
            config="scaffold_tiny.yaml")  # fmt: skip
    assert (copy / "global.pt").read_bytes() == (original / "global.pt").read_bytes()
