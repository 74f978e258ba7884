"""benchmarks/scale.py measures what its table says, at 100 and 1,000 clients (in this process:
the fast test), and runs as a user runs it (a fresh process per configuration: slow)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale  # noqa: E402 (benchmarks/ is not a package)


def spec(clients: int, algorithm: str, client_state: str, tmp_path: Path) -> dict:
    return dict(
        clients=clients, backend="sequential", per_round=10, algorithm=algorithm,
        client_state=client_state, rounds=1, samples_per_client=3, tmp=str(tmp_path),
    )  # fmt: skip


def test_scale_rows_are_measured_and_the_table_has_its_columns(tmp_path):
    runs = (100, "fedavg", "memory"), (100, "scaffold", "disk"), (1000, "scaffold", "disk")
    rows = [scale.run_one(spec(n, algorithm, mode, tmp_path)) for n, algorithm, mode in runs]
    for row in rows:
        assert 0 < row["startup_s"] < 120 and 0 < row["round_s"] < 60 and row["eval_round_s"] > 0
        assert 0 < row["startup_cpu_s"] and 0 < row["round_cpu_s"]
        # 3 samples per client and the 500 of the test set: 1x4x4 float32 inputs, int64 labels
        samples = row["clients"] * 3 + 500
        assert row["data_mb"] == pytest.approx(samples * (16 * 4 + 8) / 2**20)
        assert row["peak_rss_mb"] > row["data_mb"]
    fedavg_100, disk_100, disk_1000 = rows
    # every SCAFFOLD client holds a c_i, one file each (1,000 files of about the same size)
    assert disk_1000["state_mb"] == pytest.approx(10 * disk_100["state_mb"], rel=0.05)
    assert fedavg_100["state_mb"] == 0
    # the checkpoint names a version of the client_state folder, not its files
    assert abs(disk_1000["ckpt_kb"] - disk_100["ckpt_kb"]) < 0.5
    console = Console(record=True, width=400)
    console.print(scale.table(rows))
    text = console.export_text()
    for column in scale.COLUMNS:
        assert column in text
    cells = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in text.splitlines()
        if re.match(r"\s*│\s*[\d,]+ │", line)
    ]
    assert [row[:5] for row in cells] == [
        [f"{n:,}", "sequential", "10", algorithm, mode] for n, algorithm, mode in runs
    ]
    # the smallest N of a configuration is its own reference: "vs N=min" 1.00, RSS - data +0
    header = scale.COLUMNS.index
    for column in ("vs N=min", "CPU vs N=min"):
        assert [row[header(column)] for row in cells[:2]] == ["1.00", "1.00"]
    assert [row[header("RSS - data vs N=min")] for row in cells[:2]] == ["+0", "+0"]
    assert float(cells[2][header("vs N=min")]) == pytest.approx(
        disk_1000["round_s"] / disk_100["round_s"], abs=0.01
    )
    assert float(cells[2][header("CPU vs N=min")]) == pytest.approx(
        disk_1000["round_cpu_s"] / disk_100["round_cpu_s"], abs=0.01
    )


@pytest.mark.slow  # a fresh process per configuration, each importing torch and Lightning
def test_scale_benchmark_runs_from_the_command_line(tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/scale.py", "--clients", "100", "1000", "--per-round", "10",
         "--algorithms", "scaffold", "--client-state", "disk", "--rounds", "1",
         "--tmp", str(tmp_path), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FederatedLoop against the total number of clients" in done.stdout
    rows = json.loads(out.read_text())
    assert [row["clients"] for row in rows] == [100, 1000]
    assert all(row["round_s"] > 0 and row["state_mb"] > 0 for row in rows)
