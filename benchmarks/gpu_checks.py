"""The parts of ``benchmarks/gpu_all.py`` that run whole ``fedlightning fit`` processes: the
byte-for-byte determinism and resume checks, ``loop.backend: auto`` on the ViT config, and the
issue's targets read from everything measured."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from budget import Budget

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("SequentialBackend", "CohortBackend")


def environment() -> dict[str, str]:
    """The subprocesses' environment: the sources and benchmarks first, unbuffered output."""
    paths = [str(ROOT / "src"), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            "PYTHONUNBUFFERED": "1"}  # fmt: skip


def _start(run_dir: Path, config: str, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_fit.py"), config, str(run_dir), *options],
        cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait(processes: dict[str, subprocess.Popen], budget: Budget) -> dict[str, str]:
    """Each process's stderr (``FAILED ...`` for one that failed or overran the budget)."""
    out = {}
    for name, process in processes.items():
        try:
            _, err = process.communicate(timeout=max(10.0, budget.left() + 30.0))
        except subprocess.TimeoutExpired:
            process.kill()
            out[name] = "FAILED: over the budget"
            continue
        out[name] = (
            err if process.returncode == 0 else f"FAILED ({process.returncode}): {err[-1500:]}"
        )
    return out


def _same(a: Path, b: Path) -> str:
    if not (a / "global.pt").is_file() or not (b / "global.pt").is_file():
        return "no global.pt"
    if (a / "global.pt").read_bytes() == (b / "global.pt").read_bytes():
        return "identical"
    x, y = (torch.load(p / "global.pt", map_location="cpu") for p in (a, b))
    gap = max(float((x[k].double() - y[k].double()).abs().max()) for k in x)
    return f"DIFFER (max |a - b| {gap:.1e})"


def _last(run_dir: Path, column: str) -> str:
    try:
        with (run_dir / "metrics.csv").open() as handle:
            return list(csv.DictReader(handle))[-1][column]
    except (OSError, IndexError, KeyError):
        return "-"


def determinism_part(tmp: Path, accelerator: str, tiny: bool, budget: Budget) -> tuple[str, dict]:
    """configs/quickstart.yaml twice per backend and stopped halfway then resumed: the
    ``global.pt`` bytes compared."""
    rounds, half = (2, 1) if tiny else (4, 2)
    common = ("--loop.accelerator", accelerator)
    if tiny:
        common += ("--loop.clients_per_round", "3", "--loop.local_epochs", "1")
    runs = {}
    for backend in BACKENDS:
        for name, n in (("a", rounds), ("b", rounds), ("half", half)):
            runs[f"{backend}/{name}"] = _start(
                tmp / backend / name, "configs/quickstart.yaml", *common, "--loop.backend",
                backend, "--loop.rounds", str(n),
            )  # fmt: skip
    failures = {k: v for k, v in _wait(runs, budget).items() if v.startswith("FAILED")}
    resumed = {
        backend: _start(
            tmp / backend / "half",
            "configs/quickstart.yaml",
            *common,
            "--loop.backend",
            backend,
            "--loop.rounds",
            str(rounds),
            "--ckpt_path",
            str(tmp / backend / "half" / "last.ckpt"),
        )  # fmt: skip
        for backend in BACKENDS
    }
    failures.update({k: v for k, v in _wait(resumed, budget).items() if v.startswith("FAILED")})
    lines = [f"configs/quickstart.yaml, {rounds} rounds on {accelerator}, loop.deterministic true",
             f"{'backend':<18} {'two runs':<28} {'resumed at ' + str(half) + ' vs straight':<30} test_acc"]  # fmt: skip
    verdicts = {}
    for backend in BACKENDS:
        root = tmp / backend
        twice, resume = _same(root / "a", root / "b"), _same(root / "a", root / "half")
        verdicts[backend] = (twice, resume)
        lines.append(f"{backend:<18} {twice:<28} {resume:<30} {_last(root / 'a', 'test_acc')}")
    lines += [f"{name}: {text}" for name, text in failures.items()]
    return "\n".join(lines), verdicts


AUTO_LINE = re.compile(r"backend: auto chose (\w+) \((.*)\)")


def auto_part(tmp: Path, accelerator: str, tiny: bool, budget: Budget) -> tuple[str, dict]:
    """configs/inco_vit.yaml with ``loop.backend: auto`` for two rounds, then with the path it did
    not choose: the choice, its reason and both round-2 times."""
    options = ["--loop.accelerator", accelerator, "--loop.rounds", "2"]
    if tiny:
        options += ["--loop.clients_per_round", "2", "--loop.local_epochs", "1"]
    err = _wait({"auto": _start(tmp / "auto", "configs/inco_vit.yaml", *options)}, budget)["auto"]
    match = AUTO_LINE.search(err)
    if match is None:
        return f"auto run: {err[-1500:]}", {}
    chosen, reason = match.groups()
    other = BACKENDS[0] if chosen == BACKENDS[1] else BACKENDS[1]
    done = _wait({"other": _start(tmp / "other", "configs/inco_vit.yaml", *options,
                                  "--loop.backend", other)}, budget)["other"]  # fmt: skip
    times = {
        chosen: _last(tmp / "auto", "round_time_s"),
        other: _last(tmp / "other", "round_time_s"),
    }
    lines = [f"auto chose {chosen} ({reason})",
             f"round 2: {chosen} {times[chosen]} s (auto's run), {other} {times[other]} s"]  # fmt: skip
    if done.startswith("FAILED"):
        lines.append(f"{other}: {done}")
    return "\n".join(lines), {"chosen": chosen, "times": times}


def _fmt(value: float | None, unit: str = "") -> str:
    return "not measured" if value is None else f"{value:.3g}{unit}"


def targets_part(found: list[dict], auto: dict, determinism: dict, device: str) -> str:
    """Issue 31's targets against the measurements (judged only on a GPU)."""
    paths = {s["precision"]: s for s in found if "precision" in s and "s_per_round" in s}
    yard = next((s for s in found if s.get("workload") == "pfl_cifar10"), None)
    yard_cohort = yard["s_per_round"].get("cohort") if yard else None
    published = yard.get("published_s_per_round") if yard else None
    fp32, bf16 = paths.get("32-true"), paths.get("bf16-mixed")
    cohort = fp32["s_per_round"].get("cohort") if fp32 else None
    speed = fp32["s_per_round"]["sequential"] / cohort if cohort else None
    floor = cohort / fp32["floor_s"] if cohort else None
    faster = cohort / bf16["s_per_round"]["cohort"] if cohort and bf16 else None
    rows = next((s["scaling"] for s in found if "scaling" in s), [])
    hundred = next(
        (r for r in rows if r["clients"] == 100 and {"sequential", "cohort"} <= set(r)), None
    )
    scaled = hundred["sequential"] / hundred["cohort"] if hundred else None
    times = auto.get("times", {})
    try:
        chosen = float(times[auto["chosen"]])
        slower = max(float(v) for k, v in times.items() if k != auto["chosen"]) < chosen / 1.05
    except (KeyError, ValueError):
        slower = None
    checks = [
        ("fedcross cohort s/round (32-true) <= 0.1", _fmt(cohort, " s"), cohort is not None and cohort <= 0.1),
        ("cohort vs sequential >= 9x", _fmt(speed, "x"), speed is not None and speed >= 9),
        ("cohort round / floor <= 2", _fmt(floor), floor is not None and floor <= 2),
        ("bf16-mixed cohort >= 1.3x faster than 32-true", _fmt(faster, "x"), faster is not None and faster >= 1.3),
        ("cohort >= 20x sequential at 100 clients/round", _fmt(scaled, "x"), scaled is not None and scaled >= 20),
        ("auto's path not slower on inco_vit (5%)", str(auto.get("chosen", "-")), slower is False),
        ("pfl-research CIFAR-10 cohort s/round < its published time",
         f"{_fmt(yard_cohort, ' s')} vs {_fmt(published, ' s')}",
         yard_cohort is not None and published is not None and yard_cohort < published),
        ("two runs byte-identical, resume == straight", str(determinism),
         all(v == ("identical", "identical") for v in determinism.values()) and bool(determinism)),
    ]  # fmt: skip
    judged = device == "cuda"
    lines = [] if judged else ["(targets are for an H100/H200: on the CPU shown, not judged)"]
    for name, value, ok in checks:
        verdict = ("PASS" if ok else "MISS") if judged or name.startswith("two") else "-"
        lines.append(f"{verdict:<5} {name}: {value}")
    return "\n".join(lines)
