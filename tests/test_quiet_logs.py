"""No third-party noise a user cannot act on (no third-party warning from ``--fast_dev_run`` or
``--seeds``: issue 38 item 3), and the closing line stays one line."""

import logging
import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from fedlightning.loop.reporting import Reporter
from stderr_noise import third_party_warnings
from test_readme_commands import COMMANDS as README_COMMANDS

ROOT = Path(__file__).parents[1]


def test_done_line_does_not_wrap_off_a_terminal(tmp_path, capsys):
    run_dir = tmp_path / ("a_rather_long_run_directory_name_" * 3)
    reporter = Reporter(run_dir, progress_bar=False, plots=False)
    reporter.console = Console(stderr=True, force_terminal=False, width=80)
    reporter.done({"round": 30, "test_acc": 0.9333}, 30, 11.7)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("done: round 30/30") and str(run_dir) in lines[0]


def test_fp16_on_cpu_is_reported_once(cli, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli(
            tmp_path / "r", "--loop.rounds", "1", "--loop.precision", "16-mixed",
            "--loop.accelerator", "cpu", "--loop.fit_with", "trainer", "--loop.plots", "false",
        )  # fmt: skip
    fp16 = [w for w in caught if "AMP with fp16 is not supported on CPU" in str(w.message)]
    assert len(fp16) == 1, [str(w.message) for w in fp16]


def test_import_loads_no_optional_heavyweights():
    code = (
        "import sys, fedlightning, fedlightning.cli\n"
        "heavy = {'timm', 'tqdm.auto', 'sklearn', 'wandb', 'ray', 'datasets', 'flwr_datasets'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.stdout.strip() == "[]"  # timm pulled tqdm.auto: TqdmWarning in every notebook


@pytest.mark.slow  # starts a W&B offline run
def test_wandb_offline_has_no_anonymous_warning(tmp_path, capfd, caplog, monkeypatch):
    from fedlightning.tracking import make_wandb_logger

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with caplog.at_level(logging.WARNING, logger="fedlightning"):
        logger = make_wandb_logger(tmp_path, None, "quiet")
        logger.log_metrics({"test_acc": 0.5}, step=1)
        logger.experiment.finish()
    # Our sync hint is a log record (stderr or pytest's log capture, whichever holds the
    # handler); W&B's own "anonymous" warning would be printed to stderr or logged.
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("fedlightning")]
    assert any("wandb sync" in message for message in ours)
    assert "anonymous" not in capfd.readouterr().err + caplog.text


@pytest.mark.slow  # starts Ray
def test_ray_start_is_quiet(cli, tmp_path, capfd):
    cli(
        tmp_path / "r", "--loop.rounds", "1", "--loop.plots", "false",
        "--loop.backend", "RayBackend", "--loop.backend.num_workers", "1",
    )  # fmt: skip
    err = capfd.readouterr().err
    assert "core_worker.cc" not in err and "Token authentication is enabled" not in err


def _fedlightning(args: list[str], tmp_path) -> str:
    """The stderr of ``fedlightning ARGS`` run as a user runs it (a process of its own, the
    warnings filters Python starts with), from the repository root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "fedlightning.cli", *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_fast_dev_run_prints_no_third_party_warning(tmp_path):
    (command,) = [c for c in README_COMMANDS if "--fast_dev_run" in c]  # as the README has it
    err = _fedlightning(shlex.split(command)[1:], tmp_path)
    assert "round 1/1" in err and third_party_warnings(err) == [], err


def test_seeds_print_no_third_party_warning(tmp_path):
    """The README's ``--seeds 0 1 2`` command at one round, into a temporary run directory (it
    was LightningCLI's warning about ``args`` and ``sys.argv``, once per seed and once more)."""
    (command,) = [c for c in README_COMMANDS if "--seeds 0 1 2 --loop.run_dir runs/seeds" in c]
    words = shlex.split(command)[1:]
    words[words.index("--loop.rounds") + 1] = "1"
    words[words.index("--loop.run_dir") + 1] = str(tmp_path / "seeds")
    err = _fedlightning(words, tmp_path)
    assert err.count("done: round 1/1") == 3 and third_party_warnings(err) == [], err
    assert (tmp_path / "seeds" / "seeds.png").is_file()
