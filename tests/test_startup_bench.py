"""benchmarks/startup.py runs as the README shows it (one short repeat) and prints its table."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.slow  # three fresh processes with Lightning's imports
def test_startup_benchmark_prints_ratios():
    done = subprocess.run(
        [sys.executable, "benchmarks/startup.py", "--rounds", "1", "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ratio = re.search(r"ratio\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)", done.stdout)
    assert ratio, done.stdout
    assert all(float(value) > 0 for value in ratio.groups())
    assert "only imports fedlightning.cli" in done.stdout


@pytest.mark.slow  # the in-process cases, then two fresh processes
def test_overhead_benchmark_prints_whole_process_and_rounds_only_columns():
    done = subprocess.run(
        [sys.executable, "benchmarks/overhead.py", "--case", "tiny", "--rounds", "1",
         "--repeats", "1", "--threads", "1", "--process-rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FederatedLoop vs hand-written PyTorch" in done.stdout
    header = re.search(r"┃\s*whole s\s*┃\s*rounds s\s*┃\s*outside s\s*┃", done.stdout)
    assert header, done.stdout
    ratio = re.search(r"ratio\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)", done.stdout)
    assert ratio and all(float(value) > 0 for value in ratio.groups()), done.stdout
