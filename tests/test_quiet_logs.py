"""No third-party noise a user cannot act on, and the closing line stays one line."""

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from fedlightning.loop.reporting import Reporter

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
