"""``benchmarks/gpu_all.py``, the GPU set of issue 31, checked on the CPU: every part runs (tiny,
inside its budget) and writes its table to the one report; the quickstart runs it compares are
byte-identical (twice, and resumed against straight); the targets are judged from the summaries the
benchmarks print; and without jsonargparse (a lent GPU machine lacks it) a run is built from the
YAML through the Python API with the CLI's bytes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from budget import Budget  # noqa: E402
from gpu_checks import targets_part  # noqa: E402

PARTS = (
    "device", "determinism", "FedCross CNN paths, 32-true", "FedCross CNN paths, bf16", "scaling",
    "auto on configs/inco_vit.yaml", "gpu_check", "pfl-research's CIFAR-10 benchmark", "targets",
    "done",
)  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.mark.slow  # fresh fit processes and every benchmark, tiny: up to 25 minutes on 2 shared cores
def test_every_part_runs_tiny_on_the_cpu_and_the_runs_repeat_byte_for_byte(tmp_path):
    out = tmp_path / "gpu_all.txt"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_all.py", "--device", "cpu", "--tiny", "--budget-s", "1500",
         "--out", str(out)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=2700, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    for part in PARTS:
        assert f"=== {part} ===" in report, part
    for backend in ("SequentialBackend", "CohortBackend"):
        line = next(x for x in report.splitlines() if x.startswith(backend))
        assert line.split()[1:3] == ["identical", "identical"], line
    assert "PASS  two runs byte-identical, resume == straight" in report
    assert "auto chose" in report
    assert "SUMMARY" in report  # the paths tables' numbers, read by the targets


@pytest.mark.slow  # two fresh fit processes
def test_without_jsonargparse_a_run_is_built_from_the_yaml_with_the_clis_bytes(tmp_path):
    block = (
        "import sys, importlib.abc, runpy\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'jsonargparse':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    options = ["configs/quickstart.yaml", "--loop.rounds", "1", "--loop.clients_per_round", "2",
               "--loop.local_epochs", "1", "--loop.backend", "CohortBackend"]  # fmt: skip
    for name, prefix in (("cli", []), ("api", ["-c", block])):
        config, *rest = options
        command = [sys.executable, *prefix, "benchmarks/gpu_fit.py", config, str(tmp_path / name)]
        done = subprocess.run(
            [*command, *rest], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "api" / "global.pt").read_bytes() == (
        tmp_path / "cli" / "global.pt"
    ).read_bytes()


def test_the_targets_are_judged_from_the_benchmarks_summaries():
    found = [
        {"precision": "32-true", "floor_s": 0.05, "s_per_round": {"sequential": 0.9, "cohort": 0.08}},
        {"precision": "bf16-mixed", "floor_s": 0.01, "s_per_round": {"sequential": 1.0, "cohort": 0.05}},
        {"scaling": [{"clients": 10, "width": 32, "floor_s": 0.05, "cohort": 0.1},
                     {"clients": 100, "width": 32, "floor_s": 0.5, "sequential": 9.0, "cohort": 0.4}]},
        {"workload": "pfl_cifar10", "floor_s": 0.005, "published_s_per_round": 0.2,
         "s_per_round": {"sequential": 1.5, "cohort": 0.03, "vmap by hand": 0.02}},
    ]  # fmt: skip
    auto = {
        "chosen": "CohortBackend",
        "times": {"CohortBackend": "0.5", "SequentialBackend": "1.6"},
    }
    determinism = {"SequentialBackend": ("identical", "identical"), "CohortBackend": ("identical", "identical")}  # fmt: skip
    lines = targets_part(found, auto, determinism, "cuda").splitlines()
    verdicts = {line[6:].split(":")[0]: line[:4] for line in lines}
    assert verdicts == {
        "fedcross cohort s/round (32-true) <= 0.1": "PASS",  # 0.08 s
        "cohort vs sequential >= 9x": "PASS",  # 11.25x
        "cohort round / floor <= 2": "PASS",  # 1.6
        "bf16-mixed cohort >= 1.3x faster than 32-true": "PASS",  # 1.6x
        "cohort >= 20x sequential at 100 clients/round": "PASS",  # 22.5x
        "auto's path not slower on inco_vit (5%)": "PASS",
        "pfl-research CIFAR-10 cohort s/round < its published time": "PASS",  # 0.03 s
        "two runs byte-identical, resume == straight": "PASS",
    }
    auto["times"]["SequentialBackend"] = "0.4"  # the path auto did not choose was faster
    determinism["CohortBackend"] = ("identical", "DIFFER (max |a - b| 1.2e-07)")
    found[0]["s_per_round"]["cohort"] = 0.2
    found[-1]["published_s_per_round"] = None  # no published time given: not judged a pass
    lines = targets_part(found, auto, determinism, "cuda").splitlines()
    misses = {line[6:].split(":")[0] for line in lines if line.startswith("MISS")}
    assert misses == {
        "fedcross cohort s/round (32-true) <= 0.1", "cohort vs sequential >= 9x",
        "cohort round / floor <= 2", "auto's path not slower on inco_vit (5%)",
        "pfl-research CIFAR-10 cohort s/round < its published time",
        "two runs byte-identical, resume == straight",
    }  # fmt: skip
    assert "shown, not judged" in targets_part(found, auto, determinism, "cpu")


def test_a_budget_shares_what_is_left():
    budget = Budget(100.0)
    part = budget.share(0.25)
    assert 24.0 < part.left() <= 25.0 and part.allows(20.0) and not part.allows(30.0)
    assert Budget(None).allows(1e9) and Budget(None).share(0.5).left() == float("inf")
