"""Run directories never lose data: a second run on a directory in use is refused at once naming
the holder's pid, two runs started together never both write, a lock left by a killed run is
stale, earlier results are replaced only when asked, and CoFED's runs follow the same rules."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import overridden
from fedlightning.cli import main

CONF = Path(__file__).parent / "conf"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}


def _command(run_dir: Path, *args: str, config: str = "tiny.yaml") -> list[str]:
    return [sys.executable, "-m", "fedlightning.cli", "fit", "--config", str(CONF / config),
            "--loop.run_dir", str(run_dir), *args]  # fmt: skip


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "the run ended before writing " + path.name
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def test_a_run_in_use_is_refused_at_once_and_a_killed_runs_lock_is_stale(cli, tmp_path, capsys):
    run_dir = tmp_path / "shared"
    first = subprocess.Popen(_command(run_dir, "--loop.rounds", "400"), env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_for(run_dir / "last.ckpt", first)
        for extra in ([], ["--loop.overwrite", "true"]):
            started = time.monotonic()
            with pytest.raises(SystemExit) as exit_info:
                cli(run_dir, "--loop.rounds", "2", *extra)
            assert exit_info.value.code == 2
            assert time.monotonic() - started < 30  # refused at once, no waiting on the lock
            err = capsys.readouterr().err
            assert f"is in use by another run (pid {first.pid})" in err, err
        assert first.poll() is None  # the first run goes on undisturbed
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # its lock died with it: a resume is accepted and continues its metrics
    checkpoint = torch.load(run_dir / "last.ckpt", weights_only=True)
    done = checkpoint["round"]
    rows = cli(run_dir, "--loop.rounds", str(done + 2), "--ckpt_path", str(run_dir / "last.ckpt"))
    assert [int(r["round"]) for r in rows] == list(range(1, done + 3))


@pytest.mark.slow  # two processes importing torch and Lightning side by side: about 60 s here
def test_two_runs_started_together_never_both_write(tmp_path):
    run_dir = tmp_path / "race"
    processes = [
        subprocess.Popen(_command(run_dir, "--loop.rounds", "3", "--loop.client_state", "disk",
                                  config="scaffold_tiny.yaml"),
                         env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outcomes = [(p.wait(timeout=300), p.stderr.read()) for p in processes]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2], outcomes
    refused = next(err for code, err in outcomes if code == 2)
    assert (
        "is in use by another run (pid" in refused
        or "already holds another run's results" in refused
    )
    assert "Traceback" not in refused
    rows = _rows(run_dir)
    assert [int(r["round"]) for r in rows] == [1, 2, 3]  # one run's rows, not interleaved
    assert all(int(float(r["clients_failed"])) == 0 for r in rows)  # no state file deleted under it


def test_overwrite_replaces_an_earlier_run_and_only_when_asked(cli, tmp_path, capsys):
    run_dir = tmp_path / "run"
    cli(run_dir, "--loop.rounds", "3", "--loop.client_state", "disk", config="scaffold_tiny.yaml")
    before = (run_dir / "global.pt").read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        cli(run_dir, "--loop.rounds", "2", config="scaffold_tiny.yaml")
    assert exit_info.value.code == 2
    assert "already holds another run's results" in capsys.readouterr().err
    assert (run_dir / "global.pt").read_bytes() == before and len(_rows(run_dir)) == 3
    rows = cli(
        run_dir, "--loop.rounds", "2", "--loop.overwrite", "true", config="scaffold_tiny.yaml"
    )
    assert [int(r["round"]) for r in rows] == [1, 2]
    assert not (run_dir / "client_state").exists()  # the old run's state files went with it
    assert torch.load(run_dir / "last.ckpt", weights_only=True)["round"] == 2


def test_a_refused_resume_leaves_config_and_partition_untouched(cli, tmp_path, capsys):
    run_dir = tmp_path / "run"
    cli(run_dir, "--loop.rounds", "2")
    files = (
        "config.yaml",
        "partition.csv",
        "partition.png",
        "metrics.csv",
        "last.ckpt",
        "global.pt",
    )
    before = {name: (run_dir / name).read_bytes() for name in files}
    with pytest.raises(SystemExit) as exit_info:
        cli(
            run_dir,
            "--loop.rounds",
            "4",
            "--loop.seed",
            "7",
            "--ckpt_path",
            str(run_dir / "last.ckpt"),
        )
    assert exit_info.value.code == 2
    assert "seed is 0 in the checkpoint but 7 in this run" in capsys.readouterr().err
    assert {name: (run_dir / name).read_bytes() for name in files} == before


def test_cofed_refuses_an_earlier_runs_directory_unless_told(tmp_path, capsys):
    run_dir = tmp_path / "cofed"

    def cofed(*extra):
        sys.argv = ["fedlightning"]
        main(
            [
                "cofed",
                "--config",
                str(CONF / "cofed_tabular_tiny.yaml"),
                *overridden(["--run_dir", str(run_dir), *extra]),
            ]
        )

    cofed()
    summary = (run_dir / "summary.json").read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        cofed("--seed", "3")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (
        "run_dir=" in err
        and "already holds another run's results" in err
        and "--overwrite true" in err
        and "--ckpt_path" not in err  # a one-shot CoFED run has no checkpoint to resume
    )
    assert (run_dir / "summary.json").read_bytes() == summary
    cofed("--seed", "3", "--overwrite", "true")
    assert "seed: 3" in (run_dir / "config.yaml").read_text()
    with pytest.raises(SystemExit) as exit_info:
        cofed("--run_dir", "")
    assert exit_info.value.code == 2
    assert "run_dir='' is not allowed" in capsys.readouterr().err
