"""The benchmarks that compare fedlightning with hand-written loops run as the README shows them
(one short repeat) and print their interleaved tables: medians with their range, and the largest
difference between the final models, which is 0 (both sides do the same work); and the default
path's benchmark (benchmarks/defaults.py: threads and backend, beside busy loops too)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
#: a cell ``median (min-max)``
SPREAD = r"([\d.]+) \(([\d.]+)-([\d.]+)\)"


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _process_table(out: str) -> None:
    """startup.py's table: every column of the ratio row a positive median (range), the same
    final model on both sides, and the import lines."""
    header = re.search(r"┃\s*whole s\s*┃\s*rounds s\s*┃\s*outside s\s*┃", out)
    assert header, out
    ratio = re.search(rf"ratio\s*│\s*{SPREAD}\s*│\s*{SPREAD}\s*│\s*{SPREAD}\s*│", out)
    assert ratio and all(float(value) > 0 for value in ratio.groups()), out
    assert "max |w_fedlightning - w_hand| of the final models: 0.0e+00" in out, out
    assert "only runs `import fedlightning.cli.fit as fit; fit.import_named_classes()`" in out
    assert re.search(r"modules only fedlightning's process imports: [\d.]+ s", out), out


@pytest.mark.slow  # six fresh processes with Lightning's imports
def test_startup_benchmark_prints_interleaved_ratios_of_the_same_work():
    _process_table(
        _run("benchmarks/startup.py", "--rounds", "1", "--repeats", "1", "--warmup", "0")
    )


@pytest.mark.slow  # the in-process tiny case, then two fresh processes
def test_overhead_benchmark_prints_rounds_whole_process_and_the_same_weights():
    out = _run(
        "benchmarks/overhead.py", "--case", "tiny", "--rounds", "3", "--repeats", "1",
        "--warmup", "0", "--threads", "1", "--process-rounds", "1",
    )  # fmt: skip
    assert "FederatedLoop vs hand-written PyTorch" in out
    row = re.search(rf"tiny\s*│\s*3\s*│\s*{SPREAD}\s*│\s*{SPREAD}\s*│\s*{SPREAD}\s*│", out)
    assert row and all(float(value) > 0 for value in row.groups()), out
    assert re.search(r"tiny\s*│.*│\s*0\.0e\+00\s*│", out), out  # the loop's weights, bit for bit
    _process_table(out)


@pytest.mark.slow  # four paths, two of them through the loop
def test_cohort_benchmark_prints_interleaved_paths_and_the_hand_loop_matches_sequential():
    out = _run(
        "benchmarks/cohort.py", "--quick", "--threads", "1", "--repeats", "1", "--warmup", "0",
        "--workload", "quickstart", "--tables", "paths", "--no-flower",
    )  # fmt: skip
    for path in ("sequential", "cohort", "by hand", "vmap by hand"):
        assert re.search(rf"{path}\s*│\s*{SPREAD}\s*│", out), out
    assert re.search(r"│\s*by hand\s*│.*│\s*0\.0e\+00\s*│", out), out  # the same arithmetic


@pytest.mark.slow  # six short runs, two of them beside a busy loop
def test_defaults_benchmark_prints_both_tables_and_the_same_bits_under_load():
    out = _run(
        "benchmarks/defaults.py", "--configs", "quickstart", "--rounds", "1", "--repeats", "1",
        "--warmup", "0", "--many", "2", "--load", "1", "--loop.clients_per_round", "2",
    )  # fmt: skip
    rows = re.findall(
        rf"quickstart\s*│\s*(as it is|\+1 busy loops)\s*│[^│]*│\s*{SPREAD}\s*│\s*{SPREAD}\s*│\s*{SPREAD}",
        out,
    )  # fmt: skip
    assert [row[0] for row in rows] == ["as it is", "+1 busy loops"], out
    assert all(float(value) > 0 for row in rows for value in row[1:]), out
    assert "1 thread, load: same" in out, out  # one thread: the same bytes beside a busy loop
    row = re.search(rf"quickstart\s*│\s*{SPREAD}\s*│\s*{SPREAD}\s*│\s*{SPREAD}\s*│", out)
    assert row and all(float(value) > 0 for value in row.groups()), out  # the backend table
