"""The whole GPU set of issue 31 in one call, inside a budget, its tables in one file.

    python benchmarks/gpu_all.py --out runs/gpu_all.txt               # on a GPU: under 8 minutes
    python benchmarks/gpu_all.py --device cpu --tiny --budget-s 600    # the same parts, tiny, on a CPU

In order, each part in fresh processes (``benchmarks/gpu_fit.py``, ``benchmarks/cohort.py``,
``benchmarks/gpu_check.py``) within its share of ``--budget-s``:

1. the device, torch, and the measured peak matrix rates (fp32 without TF32, bf16);
2. determinism: configs/quickstart.yaml twice per backend (sequential, cohort) with the default
   ``loop.deterministic: true``, ``global.pt`` compared byte for byte, and a run stopped halfway and
   resumed against the straight one, byte for byte (the runs of this part go side by side);
3. the FedCross paper's CNN setup (100 clients, 10 a round, 500 samples, batch 50, 5 epochs):
   sequential, cohort, a per-client loop and a vmapped loop by hand, in 32-true (with the loop's
   paths also without deterministic algorithms: determinism's cost) and bf16-mixed, each path's
   round time over the compute floor (docs/algorithms.md section 9.2);
4. the scaling table: 10, 100 and 1,000 clients a round, sequential and cohort where they fit;
5. ``loop.backend: auto`` on configs/inco_vit.yaml (timm ViTs): its choice (the rule) and reason,
   and the round time of the path it chose against the other;
6. benchmarks/gpu_check.py (FedAvg/FedCross in three precisions, SCAFFOLD refusing 16-mixed);
7. pfl-research's CIFAR-10 benchmark (``benchmarks/yardstick.py``: 1,000 clients of 50 images,
   50 a round, batch 10, its 1.63M-parameter CNN): sequential, cohort and a vmapped round by hand,
   the floor, and the 1,500 rounds projected (against ``--published-minutes`` when given);
8. the issues' targets against what was measured.

On a lent device machine (docs: the ``run`` tool), from the repository root, first here
``make gpu-wheels`` (jsonargparse and its two signature helpers as wheels in ``.whl``, which the
device lacks: with them the runs of part 2 go through the ``fedlightning`` CLI itself; without,
through the Python API from the same YAML), then one call with ``carry: [".whl"]`` and
``timeout_s: 600``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; PYTHONUNBUFFERED=1 python3 benchmarks/gpu_all.py --out $OUT/gpu_all.txt
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from budget import Budget
from gpu_checks import auto_part, determinism_part, environment, targets_part

ROOT = Path(__file__).resolve().parent.parent
#: each part's weight: it gets its weight over the weights of the parts still to run, of the
#: budget left when it starts (a part that finishes early leaves its time to the later ones);
#: about 90, 80, 50, 80, 50, 30 and 70 s of the default 450
WEIGHTS = {"determinism": 90, "fedcross 32-true": 80, "fedcross bf16": 50, "scaling": 80,
           "auto": 50, "gpu_check": 30, "yardstick": 70}  # fmt: skip
#: seconds a benchmark process takes to import torch, Lightning and fedlightning and start CUDA
STARTUP_S = 20.0


def share(budget: Budget, part: str) -> Budget:
    names = list(WEIGHTS)
    later = sum(WEIGHTS[n] for n in names[names.index(part) :])
    return budget.share(WEIGHTS[part] / later)


class Report:
    """Sections of text written to ``path`` as they come (and echoed to stdout)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def add(self, title: str, text: str) -> None:
        block = f"\n=== {title} ===\n{text.rstrip()}\n"
        with self.path.open("a") as handle:
            handle.write(block)
        print(block, flush=True)


def script(name: str, *args: str, budget: Budget) -> str:
    """Run ``benchmarks/<name>`` with ``args`` and ``--budget-s`` (the budget less the process's
    start-up); its output (stopped a minute past the budget)."""
    inner = max(1.0, budget.left() - STARTUP_S)
    timeout = budget.left() + 60.0
    command = [sys.executable, str(ROOT / "benchmarks" / name), *args, "--budget-s", f"{inner:.0f}"]
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=environment(), capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        return f"{name}: stopped after {timeout:.0f} s\n{out or ''}"
    tail = (
        "" if done.returncode == 0 else f"\n{name} exited {done.returncode}:\n{done.stderr[-3000:]}"
    )
    return done.stdout + tail


def summaries(text: str) -> list[dict]:
    return [json.loads(line[8:]) for line in text.splitlines() if line.startswith("SUMMARY ")]


def header(device: str) -> str:
    from overhead import matmul_rate

    lines = [
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, python {sys.version.split()[0]}"
    ]
    target = torch.device(device)
    if device == "cuda":
        lines.append(f"device: {torch.cuda.get_device_name()}")
    size = 8192 if device == "cuda" else 1024
    for dtype in (torch.float32, torch.bfloat16):
        rate = matmul_rate(target, dtype, size)
        lines.append(f"peak {dtype}: {rate / 1e9:.1f} GFLOP/s ({size}^3 product, measured)")
    return "\n".join(lines)


def cohort_args(device: str, tiny: bool) -> list[str]:
    if tiny:
        return ["--accelerator", device, "--quick", "--no-flower", "--threads", "1",
                "--rounds", "2", "--repeats", "1", "--warmup", "0"]  # fmt: skip
    return ["--accelerator", device, "--no-flower", "--rounds", "3", "--repeats", "2"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default="cuda" if torch.cuda.is_available() else "cpu")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=450.0)
    parser.add_argument(
        "--published-minutes", type=float, default=None,
        help="pfl-research's published minutes for its CIFAR-10 benchmark (benchmarks/yardstick.py)",
    )  # fmt: skip
    parser.add_argument("--out", default=str(ROOT / "runs" / "gpu_all.txt"))
    parser.add_argument(
        "--tiny", action="store_true", help="tiny sizes (a CPU check of the script)"
    )
    args = parser.parse_args(argv)
    budget, report, started = Budget(args.budget_s), Report(Path(args.out)), time.perf_counter()
    report.add("device", header(args.device))
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        part = share(budget, "determinism")
        text, determinism = determinism_part(Path(tmp), accelerator, args.tiny, part)
    report.add("determinism", text)
    workload = ["--workload", "quickstart" if args.tiny else "fedcross", "--tables", "paths"]
    found = []
    for precision, extra in (("32-true", ["--determinism"]), ("bf16", [])):
        text = script("cohort.py", *cohort_args(args.device, args.tiny), *workload, *extra,
                      "--precision", "bf16-mixed" if precision == "bf16" else precision,
                      budget=share(budget, f"fedcross {precision}"))  # fmt: skip
        found += summaries(text)
        report.add(f"FedCross CNN paths, {precision}", text)
    scale = ["--scale-clients", "2", "4", "--scale-widths", "8"] if args.tiny else []
    text = script("cohort.py", *cohort_args(args.device, args.tiny), "--tables", "scaling",
                  "--rounds", "2", *scale, budget=share(budget, "scaling"))  # fmt: skip
    found += summaries(text)
    report.add("scaling", text)
    with tempfile.TemporaryDirectory() as tmp:
        auto_text, auto = auto_part(Path(tmp), accelerator, args.tiny, share(budget, "auto"))
    report.add("auto on configs/inco_vit.yaml", auto_text)
    check = ["--rounds", "1"] if args.tiny else []
    report.add("gpu_check", script("gpu_check.py", "--accelerator", args.device, *check,
                                   budget=share(budget, "gpu_check")))  # fmt: skip
    yard = ["--tiny", "--threads", "1", "--repeats", "0"] if args.tiny else []
    if args.published_minutes:
        yard += ["--published-minutes", str(args.published_minutes)]
    text = script("yardstick.py", "--accelerator", args.device, *yard,
                  budget=share(budget, "yardstick"))  # fmt: skip
    found += summaries(text)
    report.add("pfl-research's CIFAR-10 benchmark", text)
    report.add("targets", targets_part(found, auto, determinism, args.device))
    report.add("done", f"{time.perf_counter() - started:.0f} s of a {args.budget_s:.0f} s budget")


if __name__ == "__main__":
    main()
