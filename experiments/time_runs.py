"""The runs of ``experiments/time_effects.py``: each run is a config written as YAML and trained by
the ``fedlightning fit`` CLI in its own process (one torch thread, ``nice -n 10``, at most two at
a time), its rows read back from the run directory's ``metrics.csv``; and the client traces that
give the system model (docs/algorithms.md section 6.3) its per-client speeds."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import yaml

#: the trace's bandwidth (bytes/s): large, so a fit's time is its compute (the payload adds ns)
BANDWIDTH = 1.0e12


def write_trace(path: Path, speeds: list[float]) -> Path:
    """A system-model trace (docs/algorithms.md section 6.3): client i computes speeds[i]
    samples/s, with :data:`BANDWIDTH` and no latency."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["client", "speed", "bandwidth", "latency"])
        for client, speed in enumerate(speeds):
            writer.writerow([client, repr(float(speed)), repr(BANDWIDTH), 0.0])
    return path


def straggler_speeds(
    sizes: list[int], fraction: float, epochs: int, batch: int, deadline: float, seed: int
) -> tuple[list[float], dict[int, int]]:
    """Speeds that make ``round(fraction * N)`` devices (drawn once with ``seed``) stragglers.

    Straggler ``k`` gets ``x_k``, uniform in ``1..epochs-1`` (the authors' ``randint(1, E)``), and
    the speed ``v_k = (floor(x_k n_k / B) + 1/2) B / T``: with ``partial_work`` its step budget
    ``floor(T v_k / B)`` is ``floor(x_k n_k / B)`` steps, ``x_k`` epochs' worth of samples, and
    its full fit (``n_k E`` samples) takes ``n_k E / v_k > T``: without partial work it misses
    the deadline and is dropped. Every other device finishes in ``T / 2``. Returns the speeds and
    each straggler's ``x_k``."""
    rng = np.random.default_rng(seed)
    count = round(fraction * len(sizes))
    chosen = sorted(int(k) for k in rng.choice(len(sizes), count, replace=False))
    epochs_done = {k: int(rng.integers(1, epochs)) for k in chosen}
    speeds = []
    for k, n in enumerate(sizes):
        if k in epochs_done:
            steps = math.floor(epochs_done[k] * n / batch)
            speeds.append((steps + 0.5) * batch / deadline)
        else:
            speeds.append(2 * n * epochs / deadline)
    return speeds, epochs_done


def pareto_durations(num_clients: int, scale: float, shape: float, seed: int) -> list[float]:
    """Each client's fit duration ``scale U^(-1/shape)``, ``U ~ U(0, 1]`` (Pareto: at least
    ``scale``, a heavy tail of slow clients), from NumPy's generator seeded by ``seed``."""
    uniform = 1.0 - np.random.default_rng(seed).random(num_clients)
    return [float(d) for d in scale * uniform ** (-1.0 / shape)]


def client_sizes(data: dict[str, Any]) -> list[int]:
    """The training samples of each client of the ``data`` section, through the public
    :class:`~fedlightning.FederatedDataModule`."""
    from fedlightning import FederatedDataModule

    dm = FederatedDataModule(**data)
    dm.setup()
    return [dm.client_num_samples(c) for c in range(dm.num_clients)]


def fit(config: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """Train ``config`` with ``fedlightning fit`` (one torch thread, ``nice -n 10``) into
    ``run_dir``; the rows of its metrics.csv. A run already there is read, not retrained."""
    metrics = run_dir / "metrics.csv"
    if not (run_dir / "done").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.in.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        command = ["nice", "-n", "10", sys.executable, "-c",
                   "from fedlightning.cli import main; main()", "fit", "--config",
                   str(run_dir / "config.in.yaml"), "--loop.run_dir", str(run_dir),
                   "--loop.plots", "false", "--loop.progress_bar", "false"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{run_dir.name} failed:\n{done.stderr[-3000:]}")
        (run_dir / "done").write_text("ok\n")
    with open(metrics) as handle:
        return list(csv.DictReader(handle))


def fit_all(
    jobs: dict[str, tuple[dict[str, Any], Path]], processes: int = 2
) -> dict[str, list[dict[str, str]]]:
    """Every ``name -> (config, run_dir)`` of ``jobs``, ``processes`` at a time."""
    with ThreadPoolExecutor(max_workers=processes) as pool:
        futures = {name: pool.submit(fit, config, d) for name, (config, d) in jobs.items()}
        results = {}
        for name, future in futures.items():
            results[name] = future.result()
            print(f"  done: {name}", flush=True)
        return results


def column(rows: list[dict[str, str]], key: str) -> list[float]:
    """``key`` of every row that has it (evaluated rows), as floats."""
    return [float(r[key]) for r in rows if r.get(key) not in (None, "")]


def evaluated(rows: list[dict[str, str]], x: str) -> tuple[list[float], list[float]]:
    """``(x, test_acc)`` of the evaluated rows."""
    kept = [r for r in rows if r.get("test_acc") not in (None, "")]
    return [float(r[x]) for r in kept], [float(r["test_acc"]) for r in kept]
