"""Ctrl-C never loses a run: it prints ``interrupted after round N; resume with --ckpt_path ...``,
exits 130, leaves that checkpoint intact, and the resumed run ends bitwise equal to an
uninterrupted one; the same with SIGINT and SIGKILL at random moments in a real process."""

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedlightning.backends.sequential import SequentialBackend

CONF = Path(__file__).parent / "conf" / "tiny.yaml"
INTERRUPTED = re.compile(
    r"fedlightning: interrupted after round (\d+); resume with --ckpt_path (\S+)$", re.M
)


def _interrupt_at(monkeypatch, round_index: int) -> None:
    real_run = SequentialBackend.run

    def run(self, r, jobs):
        if r == round_index:
            raise KeyboardInterrupt
        return real_run(self, r, jobs)

    monkeypatch.setattr(SequentialBackend, "run", run)


@pytest.mark.parametrize(("at", "every", "resumes_from"), [(2, 1, 2), (4, 3, 3)])
def test_ctrl_c_exits_130_naming_the_checkpoint_that_resumes_bitwise(
    cli, tmp_path, capsys, monkeypatch, at, every, resumes_from
):
    run_dir = tmp_path / "run"
    _interrupt_at(monkeypatch, at)
    with pytest.raises(SystemExit) as exit_info:
        cli(run_dir, "--loop.rounds", "6", "--loop.checkpoint_every", str(every))
    monkeypatch.undo()
    assert exit_info.value.code == 130
    err = capsys.readouterr().err
    match = INTERRUPTED.search(err)
    assert match and int(match[1]) == resumes_from and match[2] == str(run_dir / "last.ckpt"), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert torch.load(match[2], weights_only=True)["round"] == resumes_from
    rows = cli(run_dir, "--loop.rounds", "6", "--ckpt_path", match[2])
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    cli(tmp_path / "straight", "--loop.rounds", "6")
    assert (run_dir / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()


def test_ctrl_c_before_the_first_checkpoint_says_so_and_a_new_start_is_accepted(
    cli, tmp_path, capsys, monkeypatch
):
    _interrupt_at(monkeypatch, 0)
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "run")
    monkeypatch.undo()
    assert exit_info.value.code == 130
    assert (
        "interrupted before the first checkpoint was written: nothing to resume"
        in capsys.readouterr().err
    )
    assert len(cli(tmp_path / "run")) == 4  # no results were left, so the directory is free


def _start(run_dir: Path, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "fedlightning.cli", "fit", "--config", str(CONF),
               "--loop.rounds", "400", "--loop.run_dir", str(run_dir), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _rounds_in(checkpoint: Path) -> int:
    try:
        return torch.load(checkpoint, weights_only=True)["round"]
    except Exception:  # being replaced right now, or not there yet
        return 0


@pytest.mark.slow  # several real processes interrupted at random moments: about a minute
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigint_and_sigkill_at_random_moments_always_resume_bitwise(cli, tmp_path, seed):
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    checkpoint = run_dir / "last.ckpt"
    seen = 0
    for attempt in range(3):
        process = _start(run_dir, *(["--ckpt_path", str(checkpoint)] if attempt else []))
        deadline = time.monotonic() + 120
        while _rounds_in(checkpoint) <= seen and time.monotonic() < deadline:
            assert process.poll() is None
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.5))
        kind = signal.SIGINT if (seed + attempt) % 2 == 0 else signal.SIGKILL
        process.send_signal(kind)
        _, err = process.communicate(timeout=60)
        state = torch.load(checkpoint, weights_only=True)  # never torn
        if kind == signal.SIGINT:
            assert process.returncode == 130, err[-2000:]
            match = INTERRUPTED.search(err)
            assert match and int(match[1]) == state["round"] and match[2] == str(checkpoint)
        else:
            assert process.returncode == -signal.SIGKILL
        assert state["round"] >= seen
        seen = state["round"]
    final = seen + 2
    cli(run_dir, "--loop.rounds", str(final), "--ckpt_path", str(checkpoint))
    cli(tmp_path / "straight", "--loop.rounds", str(final))
    assert (run_dir / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()
