"""SIGINT and SIGTERM are handled the same wherever they land (issue 26 item 3): a Fabric fit, a
Lightning Trainer fit (``loop.fit_with: trainer``, an overridden training step, manual
optimization), the cohort backend, Ray, ``fedlightning cofed``. The run prints one line naming the
round its checkpoint holds and ``--ckpt_path``, then the command that resumes it, exits 130
(SIGINT) or 143 (SIGTERM), leaves that checkpoint intact, and the resumed run ends bitwise equal
to an uninterrupted one. Real signals throughout: sent by the process to itself from inside a fit
(deterministic: the fault table of tests/test_failures_cli.py), or by the test to a real
``fedlightning`` subprocess at a random moment (slow, here)."""

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

from fedlightning.loop.rundir import check_run_dir

ROOT = Path(__file__).parents[1]
CONF = Path(__file__).parent / "conf" / "tiny.yaml"
STOPPED = re.compile(
    r"^fedlightning: (interrupted|terminated \(SIGTERM\)) after round (\d+); "
    r"resume with --ckpt_path (\S+)\nfedlightning: to resume: fedlightning fit .* --ckpt_path \3$",
    re.M,
)
STATUS = {"INT": 130, "TERM": 143}
WORD = {"INT": "interrupted", "TERM": "terminated (SIGTERM)"}


def check_stopped(err: str, name: str, run_dir: Path) -> int:
    """The stop line is there, names ``name``'s verb and ``run_dir``'s checkpoint, and that
    checkpoint loads and holds the round the line names; returns that round."""
    match = STOPPED.search(err)
    assert match, err[-3000:]
    assert match[1] == WORD[name] and match[3] == str(run_dir / "last.ckpt")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    rounds = int(match[2])
    assert torch.load(match[3], weights_only=True)["round"] == rounds  # intact, never torn
    return rounds


def resume_equals_straight(cli, run_dir: Path, straight: Path, *args: str, rounds: int) -> None:
    cli(run_dir, *args, "--loop.rounds", str(rounds), "--ckpt_path", str(run_dir / "last.ckpt"))
    cli(straight, *args, "--loop.rounds", str(rounds))
    assert (run_dir / "global.pt").read_bytes() == (straight / "global.pt").read_bytes()


def test_a_signal_during_start_up_says_nothing_was_written(cli, tmp_path, capsys, monkeypatch):
    from fedlightning.loop import core

    def prepare_run(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not stop start-up")

    monkeypatch.setattr(core, "prepare_run", prepare_run)
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "run")
    assert exit_info.value.code == 143
    err = capsys.readouterr().err
    assert "fedlightning: terminated (SIGTERM) during start-up: nothing was written" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["closing line", "after fit"])
def test_a_signal_once_the_run_is_complete_changes_nothing(
    cli, tmp_path, capsys, monkeypatch, where
):
    """Every file written, the closing line due or printed: SIGTERM there (the last moments of a
    finished run) is ignored, the command returns (exit 0) and the files are complete. Before,
    it exited -15 with no line, or 143 saying "nothing was written"."""
    from fedlightning.loop import core
    from fedlightning.loop.reporting import Reporter

    target = (Reporter, "done") if where == "closing line" else (core.FederatedLoop, "fit")
    real = getattr(*target)

    def then_terminated(*args, **kwargs):
        if where == "closing line":
            os.kill(os.getpid(), signal.SIGTERM)
        result = real(*args, **kwargs)
        if where == "after fit":
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(*target, then_terminated)
    rows = cli(tmp_path / "run", "--loop.rounds", "2")  # returns: no SystemExit
    err = capsys.readouterr().err
    assert "done: round 2/2" in err and "terminated" not in err
    assert [int(r["round"]) for r in rows] == [1, 2]
    assert torch.load(tmp_path / "run" / "last.ckpt", weights_only=True)["round"] == 2
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # only a process's own exit


# -- real fedlightning processes, signalled from outside at random moments ------------------------
def _start(*args: str, group: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("FEDLIGHTNING_TEST_SIGNAL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "fedlightning.cli", *args], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=group,
    )  # fmt: skip


def _wait_for_checkpoint(process: subprocess.Popen, checkpoint: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        try:
            if torch.load(checkpoint, weights_only=True)["round"] >= 1:
                return
        except Exception:  # not there yet, or being replaced right now
            pass
        time.sleep(0.05)
    raise AssertionError("no checkpoint was written in time")


def _signal(process: subprocess.Popen, name: str, group: bool) -> str:
    signum = getattr(signal, f"SIG{name}")
    if group:  # a terminal's Ctrl-C, or SLURM's scancel: every process of the group
        os.killpg(process.pid, signum)
    else:  # Kubernetes, `kill PID`: the main process only
        process.send_signal(signum)
    _, err = process.communicate(timeout=180)
    assert process.returncode == STATUS[name], err[-3000:]
    return err


@pytest.mark.slow  # real processes with Lightning's imports, then a resume and a straight run
@pytest.mark.parametrize(
    ("args", "name", "group"),
    [
        ((), "TERM", False),
        (("--loop.fit_with", "trainer"), "INT", True),
        (("--model", "user_clients.ManualOptimization"), "TERM", True),
        (("--loop.backend", "CohortBackend"), "TERM", False),
    ],
    ids=["sequential-TERM", "trainer-INT-group", "manual-TERM-group", "cohort-TERM"],
)
def test_a_signalled_process_stops_cleanly_and_resumes_bitwise(cli, tmp_path, args, name, group):
    run_dir = tmp_path / "run"
    process = _start("fit", "--config", str(CONF), "--loop.rounds", "400",
                     "--loop.run_dir", str(run_dir), *args, group=group)  # fmt: skip
    _wait_for_checkpoint(process, run_dir / "last.ckpt")
    time.sleep(random.Random(" ".join(args)).uniform(0.0, 0.6))
    rounds = check_stopped(_signal(process, name, group), name, run_dir)
    resume_equals_straight(cli, run_dir, tmp_path / "straight", *args, rounds=rounds + 2)


@pytest.mark.slow  # Ray's start-up, then a resume on Ray and a straight sequential run
@pytest.mark.parametrize(("name", "group"), [("TERM", False), ("INT", True)])
def test_a_signalled_ray_run_stops_cleanly_and_resumes(cli, tmp_path, name, group, local_ray):
    """``ray.init`` installs a SIGTERM handler that calls sys.exit(15): the run's own handler is
    put back. Ctrl-C at a terminal reaches Ray's processes too (the whole process group). The
    signalled run starts a Ray instance of its own; the resume, in this process, joins the
    test process's shared one."""
    run_dir = tmp_path / "run"
    ray_args = ("--loop.backend", "RayBackend", "--loop.backend.num_workers", "2")
    process = _start("fit", "--config", str(CONF), "--loop.rounds", "400",
                     "--loop.run_dir", str(run_dir), *ray_args, group=group)  # fmt: skip
    _wait_for_checkpoint(process, run_dir / "last.ckpt")
    time.sleep(0.3)
    rounds = check_stopped(_signal(process, name, group), name, run_dir)
    # Ray equals the sequential backend byte for byte (test_ray_threads.py): resume on Ray
    cli(run_dir, *ray_args, "--loop.rounds", str(rounds + 1), "--ckpt_path",
        str(run_dir / "last.ckpt"))  # fmt: skip
    cli(tmp_path / "straight", "--loop.rounds", str(rounds + 1))
    assert (run_dir / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()


@pytest.mark.slow  # CoFED's participants train on Trainers: a real process for a few seconds
@pytest.mark.parametrize(("name", "group"), [("INT", True), ("TERM", False)])
def test_a_signalled_cofed_run_names_its_stage_and_can_start_again(tmp_path, name, group):
    run_dir = tmp_path / "cofed"
    process = _start("cofed", "--config", str(ROOT / "configs" / "cofed.yaml"),
                     "--run_dir", str(run_dir), "--progress_bar", "false", group=group)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (run_dir / "config.yaml").exists() and time.monotonic() < deadline:
        assert process.poll() is None
        time.sleep(0.05)
    time.sleep(3.0)  # inside the participants' local training (Trainer fits)
    err = _signal(process, name, group)
    assert re.search(
        rf"^fedlightning: {re.escape(WORD[name])} during local training of participant \d+/10; "
        r"a CoFED run is one shot with no checkpoint to resume: run the same command again$",
        err, re.M,
    ), err[-3000:]  # fmt: skip
    assert "Traceback" not in err
    check_run_dir(run_dir, option="run_dir")  # the same command again is accepted


@pytest.mark.slow  # a real process: the signal may land in its teardown or the interpreter's exit
def test_sigterm_right_after_the_done_line_exits_0(tmp_path):
    run_dir = tmp_path / "run"
    process = _start("fit", "--config", str(CONF), "--loop.rounds", "2", "--loop.progress_bar",
                     "false", "--loop.run_dir", str(run_dir))  # fmt: skip
    lines = []
    for line in process.stderr:
        lines.append(line)
        if line.startswith("done: "):
            process.send_signal(signal.SIGTERM)
            break
    err = "".join(lines) + process.communicate(timeout=120)[1]
    assert process.returncode == 0, err[-3000:]
    assert "terminated" not in err and "Traceback" not in err
    assert torch.load(run_dir / "last.ckpt", weights_only=True)["round"] == 2
    assert (run_dir / "global.pt").is_file()
