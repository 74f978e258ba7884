"""``benchmarks/yardstick.py``, pfl-research's CIFAR-10 benchmark (issue 44 item 1), at a reduced
size on the CPU: its network is pfl-research's ``simple_cnn`` (1,626,442 parameters), every path
trains the same federation (without dropout the cohort and the vmapped round by hand end at the
sequential model to float rounding, 1e-4 after 4 rounds at lr 0.1), and the table prints each path's round time, the floor and
the 1,500 rounds projected against a published time."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from yardstick import PflCNN, parse  # noqa: E402


def test_the_network_is_pfl_researchs_simple_cnn():
    net = PflCNN()
    assert sum(p.numel() for p in net.parameters()) == 1_626_442
    shapes = [tuple(p.shape) for p in net.parameters()]
    assert shapes == [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 12544), (128,),
                      (10, 128), (10,)]  # fmt: skip
    assert [m.p for m in net if m.__class__.__name__ == "Dropout"] == [0.25, 0.5]


def test_the_full_size_is_the_benchmarks_and_bad_sizes_are_refused():
    args = parse([])
    assert (args.clients, args.samples, args.per_round, args.batch, args.epochs) == (
        1000, 50, 50, 10, 1,
    )  # fmt: skip
    assert (args.test, args.eval_every) == (10000, 10)
    with pytest.raises(SystemExit):
        parse(["--tiny", "--rounds", "3"])  # not a multiple of --eval-every


@pytest.mark.slow  # three paths in a fresh process: about 25 CPU-s
def test_every_path_trains_the_same_federation_and_the_table_projects_the_benchmark():
    done = subprocess.run(
        [sys.executable, "benchmarks/yardstick.py", "--tiny", "--threads", "1", "--dropout", "0",
         "--repeats", "0", "--published-minutes", "10"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("│")
    }
    assert set(rows) == {"sequential", "cohort", "vmap by hand"}
    for name, cells in rows.items():
        assert float(cells[-1]) <= 1e-4, (name, cells[-1])  # max |w - w_seq|: rounding only
        assert cells[4].endswith(" min") and cells[5].endswith("x")
    (summary,) = [json.loads(x[8:]) for x in done.stdout.splitlines() if x.startswith("SUMMARY ")]
    assert summary["published_s_per_round"] == pytest.approx(10 * 60 / 1500)
    assert summary["floor_s"] > 0 and set(summary["s_per_round"]) == set(rows)
    assert "1500 rounds" in done.stdout and "floor" in done.stdout
