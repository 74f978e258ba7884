"""Start-up cost: the quickstart through ``fedlightning fit`` against the same work written by hand
(``benchmarks/handwritten_quickstart.py``: PyTorch and scikit-learn only, the same model to the
last bit), each a fresh process, measured interleaved in the same run.

The two processes run alternately (fedlightning, hand-written, fedlightning, ...): the first pair
warms the file cache and is dropped, then ``--repeats`` pairs are timed; each column prints the
median and, in parentheses, the range over the repeats, and the ratio row the median (range) of the
per-pair ratios, so a load change hits both sides of a pair alike. ``whole s`` is the process's
wall time (interpreter start, imports, data, set-up, rounds, writing results, exit); ``rounds s``
the time inside the rounds (fedlightning: the sum of ``round_time_s`` in ``metrics.csv``: each
round's fits, aggregation and evaluation; its per-round logging and checkpoint snapshot fall in
``outside``; by hand: its own clock around the rounds); ``outside s`` = whole - rounds, the cost a
user pays for the front door. fedlightning runs as a user runs the quickstart (plots and
checkpoints on, progress bar off). The caption gives the largest difference between the two final
models (0: the same work).

Imports only one side needs are not charged to the other: the hand-written program triggers
torch.optim's one-time import of ``torch._dynamo`` (seconds) before its round clock, as
fedlightning's process loads it with Lightning's imports before its rounds (so ``rounds s``
compares rounds; ``whole s`` includes it on both sides). The lines after the table give the wall
time of processes that only import each side's modules, and the modules ``fedlightning fit``
loads before it parses (:data:`FEDLIGHTNING_IMPORTS`) that the hand-written loop never needs, by
package, with their import time (self time of ``python -X importtime``, which inflates it).

The second table is the front door (issue 34): the CPU time (user + system, of the process and
its children) of ``fedlightning --version``, ``--help``, ``list``, a bare ``fit`` and the
refusals that need no class (an unknown subcommand, a missing config), each against
``python -c "import torch"`` measured interleaved with them; their budget is 1.3x that (they
import neither torch nor Lightning). ``fit --help`` and a misplaced class name are shown for
comparison: they need the classes' signatures, so Lightning.

    python benchmarks/startup.py                       # the quickstart (30 rounds), 3 repeats
    python benchmarks/startup.py --rounds 5 --repeats 1
    python benchmarks/startup.py --front-door-only --repeats 5
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
#: what the hand-written loop imports, and torch.optim's lazy import of torch._dynamo
HAND_IMPORTS = (
    "import torch, sklearn.datasets, sklearn.model_selection; "
    "torch.optim.SGD([torch.zeros(1, requires_grad=True)]).zero_grad()"
)
#: what ``fedlightning fit`` imports before it parses: the command, Lightning's CLI and every class
#: a config can name
FEDLIGHTNING_IMPORTS = "import fedlightning.cli.fit as fit; fit.import_named_classes()"
#: the front door's commands: label -> (arguments, whether its budget is 1.3x importing torch)
FRONT_DOOR = {
    "--version": (["--version"], True),
    "--help": (["--help"], True),
    "list": (["list"], True),
    "fit (bare)": (["fit"], True),
    "unknown subcommand": (["fitt"], True),
    "missing config": (["fit", "-c", "configs/quickstart.yml"], True),
    "fit --help": (["fit", "--help"], False),
    "misplaced class": (
        ["fit", "-c", "configs/quickstart.yaml", "--loop.aggregator", "FedProx"],
        False,
    ),
}
BUDGET = 1.3


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    whole = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return whole, done.stdout


def run_fedlightning(rounds: int, env: dict[str, str]) -> tuple[float, float, list[torch.Tensor]]:
    """``(whole s, rounds s, final model)`` of one ``fedlightning fit`` process."""
    with tempfile.TemporaryDirectory() as run_dir:
        whole, _ = timed(
            [
                sys.executable, "-m", "fedlightning.cli", "fit", "-c", "configs/quickstart.yaml",
                "--loop.rounds", str(rounds), "--loop.run_dir", run_dir,
                "--loop.progress_bar", "false",
            ],
            env,
        )  # fmt: skip
        with open(Path(run_dir) / "metrics.csv") as handle:
            rounds_s = sum(float(row["round_time_s"]) for row in csv.DictReader(handle))
        model = list(torch.load(Path(run_dir) / "global.pt", weights_only=True).values())
    return whole, rounds_s, model


def run_by_hand(rounds: int, env: dict[str, str]) -> tuple[float, float, list[torch.Tensor]]:
    """``(whole s, rounds s, final model)`` of one hand-written process."""
    script = str(ROOT / "benchmarks" / "handwritten_quickstart.py")
    with tempfile.TemporaryDirectory() as out:
        model_path = str(Path(out) / "model.pt")
        whole, stdout = timed(
            [sys.executable, script, "--rounds", str(rounds), "--out", model_path], env
        )
        model = list(torch.load(model_path, weights_only=True).values())
    return whole, json.loads(stdout.strip().splitlines()[-1])["rounds_s"], model


def import_time(env: dict[str, str], code: str) -> float:
    """Wall time of a fresh process that only runs ``code`` (its imports)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True)
    return time.perf_counter() - start


def imported_self_times(env: dict[str, str], code: str) -> dict[str, float]:
    """``{module: self import seconds}`` of a fresh process running ``code``
    (``python -X importtime``)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    times = {}
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s+(\S+)", line)
        if match:
            times[match.group(2)] = int(match.group(1)) / 1e6
    return times


def only_fedlightning_needs(env: dict[str, str], top: int = 8) -> list[str]:
    """The packages :data:`FEDLIGHTNING_IMPORTS` loads that the hand-written loop never imports,
    by their summed self import time (``torch`` split one level further: ``torch.onnx``...)."""
    hand = imported_self_times(env, HAND_IMPORTS)
    ours = imported_self_times(env, FEDLIGHTNING_IMPORTS)
    packages: dict[str, float] = defaultdict(float)
    for module, seconds in ours.items():
        if module not in hand:
            parts = module.split(".")
            packages[".".join(parts[:2] if parts[0] == "torch" else parts[:1])] += seconds
    ranked = sorted(packages.items(), key=lambda item: -item[1])
    total = sum(packages.values())
    head = ", ".join(f"{name} {seconds:.2f}" for name, seconds in ranked[:top])
    return [
        f"modules only fedlightning's process imports: {total:.2f} s of import self time "
        f"(-X importtime); the largest: {head}"
    ]


def cpu_time(command: list[str], env: dict[str, str]) -> float:
    """User + system CPU seconds of ``command`` run to its end (exit status not checked: the
    refusals exit 2)."""
    before = os.times()
    subprocess.run(command, env=env, cwd=ROOT, capture_output=True, check=False)
    after = os.times()
    return (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )


def front_door(repeats: int, threads: int) -> Table:
    """The front-door table (module docstring): ``import torch`` and each command, interleaved,
    ``repeats`` times after one untimed round."""
    env = _environment(threads)
    torch_import = [sys.executable, "-c", "import torch"]
    times: dict[str, list[float]] = {"python -c 'import torch'": []}
    times.update({label: [] for label in FRONT_DOOR})
    for index in range(repeats + 1):
        measured = {"python -c 'import torch'": cpu_time(torch_import, env)}
        for label, (args, _) in FRONT_DOOR.items():
            command = [sys.executable, "-m", "fedlightning.cli", *args]
            measured[label] = cpu_time(command, env)
        if index > 0:  # the first round warms the file cache
            for label, seconds in measured.items():
                times[label].append(seconds)
    torch_s = times.pop("python -c 'import torch'")
    table = Table(
        title=f"front door: CPU s (user + system), median (range) of {repeats}, interleaved; "
        f"budget {BUDGET}x importing torch",
        caption="budget -: the command parses classes (Lightning's imports are its work)",
    )
    for column in ("command", "CPU s", "x import torch", "budget"):
        table.add_column(column, justify="right")
    table.add_row("python -c 'import torch'", spread(torch_s), "1.00", "")
    for label, seconds in times.items():
        ratios = [a / b for a, b in zip(seconds, torch_s, strict=True)]
        within = FRONT_DOOR[label][1]
        verdict = ("ok" if statistics.median(ratios) <= BUDGET else "OVER") if within else "-"
        table.add_row(f"fedlightning {label}", spread(seconds), spread(ratios), verdict)
    return table


def _environment(threads: int) -> dict[str, str]:
    """This process's environment with ``threads`` OMP threads and this checkout's sources first."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    src = str(ROOT / "src")
    env["PYTHONPATH"] = (
        src + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else src
    )
    return env


def spread(values: list[float], digits: int = 2) -> str:
    """``median (min-max)``."""
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def measure(rounds: int, repeats: int, threads: int, warmup: int = 1) -> tuple[Table, list[str]]:
    """Run both sides interleaved (``warmup`` pairs dropped, then ``repeats`` timed pairs); the
    table and the import lines (module docstring)."""
    env = _environment(threads)
    ours: list[tuple[float, float]] = []
    hand: list[tuple[float, float]] = []
    imports: dict[str, list[float]] = {FEDLIGHTNING_IMPORTS: [], HAND_IMPORTS: []}
    diff = 0.0
    for index in range(warmup + repeats):
        whole_f, rounds_f, model_f = run_fedlightning(rounds, env)
        whole_h, rounds_h, model_h = run_by_hand(rounds, env)
        import_f = import_time(env, FEDLIGHTNING_IMPORTS)
        import_h = import_time(env, HAND_IMPORTS)
        if index < warmup:
            continue
        ours.append((whole_f, rounds_f))
        hand.append((whole_h, rounds_h))
        imports[FEDLIGHTNING_IMPORTS].append(import_f)
        imports[HAND_IMPORTS].append(import_h)
        pairs = zip(model_f, model_h, strict=True)
        diff = max(diff, *(float((a.double() - b.double()).abs().max()) for a, b in pairs))
    table = Table(
        title=f"quickstart start-up: {rounds} rounds, {threads} thread(s); interleaved, median "
        f"(range) of {repeats} after {warmup} warm-up pair(s)",
        caption=f"max |w_fedlightning - w_hand| of the final models: {diff:.1e}",
    )
    for column in ("", "whole s", "rounds s", "outside s"):
        table.add_column(column, justify="right")
    for name, runs in (("fedlightning fit", ours), ("hand-written", hand)):
        table.add_row(
            name, spread([w for w, _ in runs]), spread([r for _, r in runs]),
            spread([w - r for w, r in runs]),
        )  # fmt: skip
    table.add_row(
        "ratio",
        spread([a[0] / b[0] for a, b in zip(ours, hand, strict=True)]),
        spread([a[1] / b[1] for a, b in zip(ours, hand, strict=True)]),
        spread([(a[0] - a[1]) / (b[0] - b[1]) for a, b in zip(ours, hand, strict=True)]),
    )
    lines = [
        f"a process that only runs `{code}`: {spread(times)} s" for code, times in imports.items()
    ]
    return table, lines + only_fedlightning_needs(env)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs")
    parser.add_argument("--warmup", type=int, default=1, help="untimed pairs first")
    parser.add_argument("--threads", type=int, default=1, help="OMP/torch threads on both sides")
    parser.add_argument(
        "--front-door-only", action="store_true", help="only the front-door table (no quickstart)"
    )
    args = parser.parse_args()
    console = Console(width=120)
    if not args.front_door_only:
        table, lines = measure(args.rounds, args.repeats, args.threads, args.warmup)
        console.print(table)
        for line in lines:
            print(line)
    console.print(front_door(args.repeats, args.threads))


if __name__ == "__main__":
    main()
