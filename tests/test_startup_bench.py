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
