"""Two published effects of time in federated learning, on the virtual clock (docs/algorithms.md
sections 6.3, 6.4 and 6.6).

(a) FedProx's straggler experiment (Li et al., MLSys 2020, arXiv:1812.06127, section 5.2,
Figure 1): synthetic(1, 1) (``data.dataset: fedprox_synthetic``, natural partition), 30 devices,
10 a round, 20 local epochs, SGD lr 0.01, batch 10, multinomial logistic regression; 0%, 50% and
90% of the devices are stragglers (a system-model trace, ``time_runs.straggler_speeds``: a
straggler's speed lets it do a uniformly drawn 1..19 epochs' worth of its samples by the
deadline). Methods: FedAvg dropping the stragglers (``SystemModel(deadline)``: their uploads
arrive late), FedProx mu = 0 and mu = 1 with their partial work (``partial_work: true``), and
at 0% FedAvg without a system model (which FedAvg dropping stragglers must equal there).

(b) FedBuff's claim (Nguyen et al., AISTATS 2022, arXiv:2106.06639): with heavy-tailed client
durations (Pareto, tail index 1.5: each client's fit takes ``D_i >= 1`` virtual s), FedBuff
reaches a target accuracy in less virtual time than synchronous FedAvg (waiting for every
client, or dropping those that miss a deadline of 2 s) and than FedAsync. configs/fedbuff.yaml's
digits federation and recipe; every method trains as many client fits (300), 3 seeds.

    python experiments/time_effects.py            # both tables and figures (about 2 CPU-hours: 200 rounds)
    python experiments/time_effects.py --quick    # a smoke test: 2 rounds, 1 seed (its output says so)

Writes ``table.md``, ``stragglers.png`` (the global model's test loss and accuracy against rounds, one
panel per straggler share, as the paper's Figure 1) and ``fedbuff.png`` (test accuracy against
virtual time, every seed) under ``--out`` (runs/experiments/time_effects). Runs already in
``--out`` are read, not retrained.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from tables import smoke_test_line  # noqa: E402
from time_runs import (  # noqa: E402
    client_sizes,
    column,
    evaluated,
    fit_all,
    pareto_durations,
    straggler_speeds,
    write_trace,
)

STRAGGLER_ROUNDS, FRACTIONS, EPOCHS, BATCH, DEADLINE = 200, (0.0, 0.5, 0.9), 20, 10, 1.0
SYNTHETIC = {"dataset": "fedprox_synthetic", "partition": "natural", "num_clients": 30,
             "batch_size": BATCH, "val_fraction": 0.0, "seed": 0}  # fmt: skip
FEDBUFF_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "fedbuff.yaml"
ASYNC_DEADLINE, TARGET = 2.0, 0.9
#: experiment (a)'s methods -> their --methods name
STRAGGLER_METHODS = {"FedAvg (drops stragglers)": "fedavg", "FedProx mu=0": "fedprox0",
                     "FedProx mu=1": "fedprox1", "FedAvg (no system model)": "plain"}  # fmt: skip


def system(trace: Path, deadline: float | None = None, partial: bool = False) -> dict:
    init: dict[str, Any] = {"trace": str(trace)}
    if deadline is not None:
        init |= {"deadline": deadline, "partial_work": partial}
    return {"class_path": "fedlightning.system.SystemModel", "init_args": init}


def straggler_config(rounds: int, epochs: int, mu: float | None, sys_model: dict | None) -> dict:
    model = {"network": "mlp", "network_kwargs": {"hidden": []}, "optimizer": "sgd", "lr": 0.01}
    loop: dict[str, Any] = {"rounds": rounds, "clients_per_round": 10, "local_epochs": epochs,
                            "seed": 0, "eval_every": 1, "checkpoint_every": rounds,
                            "aggregator": {"class_path": "fedlightning.server.FedAvg",
                                           "init_args": {"weighting": "samples"}}}  # fmt: skip
    if sys_model is not None:
        loop["components"] = [sys_model]
    objective = "ClientModule" if mu is None else "FedProx"
    init = model if mu is None else {"mu": mu, **model}
    return {"loop": loop, "model": {"class_path": f"fedlightning.clients.{objective}",
                                    "init_args": init}, "data": dict(SYNTHETIC)}  # fmt: skip


def straggler_jobs(
    rounds: int, epochs: int, out: Path, fractions: list[float], methods_wanted: list[str]
) -> dict[str, tuple[dict, Path]]:
    """name -> (config, run dir) of experiment (a): the ``methods`` (keys of
    :data:`STRAGGLER_METHODS`) at the straggler ``fractions``."""
    sizes = client_sizes(SYNTHETIC)
    jobs = {}
    for fraction in fractions:
        speeds, _ = straggler_speeds(sizes, fraction, epochs, BATCH, DEADLINE, seed=0)
        trace = write_trace(out / f"stragglers_{fraction:.0%}.csv", speeds)
        methods = {"FedAvg (drops stragglers)": (None, system(trace, DEADLINE)),
                   "FedProx mu=0": (0.0, system(trace, DEADLINE, partial=True)),
                   "FedProx mu=1": (1.0, system(trace, DEADLINE, partial=True))}  # fmt: skip
        if fraction == 0.0:  # no straggler: FedProx mu=0 is FedAvg; FedAvg without a clock
            methods["FedAvg (no system model)"] = (None, None)
            del methods["FedProx mu=0"]
        for method, (mu, sys_model) in methods.items():
            if STRAGGLER_METHODS[method] not in methods_wanted:
                continue
            name = f"{method} @ {fraction:.0%}"
            slug = f"a{rounds}x{epochs}-{method.split()[0]}-{mu}-{sys_model is None}-{fraction:.0%}"
            jobs[name] = (straggler_config(rounds, epochs, mu, sys_model), out / slug)
    return jobs


def fedbuff_jobs(seeds: list[int], fits: int, out: Path) -> dict[str, tuple[dict, Path]]:
    """name -> (config, run dir) of experiment (b): ``fits`` client fits per method."""
    import yaml

    base = yaml.safe_load(FEDBUFF_CONFIG.read_text())
    buff = base["loop"]["components"][0]["init_args"]
    jobs = {}
    for seed in seeds:
        data = {**base["data"], "seed": seed}
        sizes = client_sizes(data)
        durations = pareto_durations(len(sizes), 1.0, 1.5, seed)
        epochs = base["loop"]["local_epochs"]
        trace = write_trace(out / f"pareto_{seed}.csv",
                            [n * epochs / d for n, d in zip(sizes, durations, strict=True)])  # fmt: skip
        sync = {"rounds": fits // 10, "clients_per_round": 10, "eval_every": 1}
        methods = {
            "FedBuff (K=5, 10 in flight)": ({"rounds": fits // 5, "eval_every": 1},
                                            {**buff, "system": system(trace)}),
            "FedAsync (10 in flight)": ({"rounds": fits, "eval_every": 5},
                                        {"alpha": 0.6, "staleness": "polynomial", "a": 0.5,
                                         "concurrency": 10, "system": system(trace)}),
            "FedAvg (waits for all)": (sync, system(trace)),
            f"FedAvg (deadline {ASYNC_DEADLINE:g} s)": (sync, system(trace, ASYNC_DEADLINE)),
        }  # fmt: skip
        for method, (loop, component) in methods.items():
            config = copy.deepcopy(base)
            config["data"] = data
            config["loop"] |= {**loop, "seed": seed, "checkpoint_every": loop["rounds"]}
            if method.startswith("FedBuff"):
                config["loop"]["components"] = [{"class_path": "fedlightning.asynchronous."
                                                 "FedBuff", "init_args": component}]  # fmt: skip
            elif method.startswith("FedAsync"):
                config["loop"]["components"] = [{"class_path": "fedlightning.asynchronous."
                                                 "FedAsync", "init_args": component}]  # fmt: skip
            else:
                config["loop"]["components"] = [component]
            jobs[f"{method} | seed {seed}"] = (config, out / f"b{fits}-{method.split()[0]}-"
                                               f"{'deadline' in method}-{seed}")  # fmt: skip
    return jobs


def first_time_at(rows: list[dict[str, str]], target: float) -> float | None:
    """The virtual time of the first evaluated row whose test_acc reaches ``target``."""
    times, accs = evaluated(rows, "virtual_time")
    return next((t for t, a in zip(times, accs, strict=True) if a >= target), None)


def straggler_table(results: dict[str, list[dict[str, str]]]) -> str:
    """One row per (method, straggler share): the last round's and the last 10 rounds' test
    accuracy, the global model's last test loss, the rounds whose every
    upload came late (the model did not move) and the uploads aggregated per round."""
    lines = ["| method | stragglers | test_acc last | test_acc mean of last 10 rounds | "
             "test_loss last | rounds with no upload | uploads aggregated per round |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, rows in results.items():
        method, fraction = name.split(" @ ")
        acc = column(rows, "test_acc")
        loss = column(rows, "test_loss")
        late = column(rows, "clients_late") or [0.0] * len(rows)
        lines.append(
            f"| {method} | {fraction} | {100 * acc[-1]:.2f} | "
            f"{100 * statistics.fmean(acc[-10:]):.2f} | {loss[-1]:.4f} | "
            f"{sum(n == 10 for n in late)} | {10 - statistics.fmean(late):.1f} |"
        )
    return "\n".join(lines)


def fedbuff_table(results: dict[str, list[dict[str, str]]], target: float) -> str:
    by_method: dict[str, list[list[dict[str, str]]]] = {}
    for name, rows in results.items():
        by_method.setdefault(name.split(" | ")[0], []).append(rows)
    lines = [f"| method | virtual s to test_acc {target:.0%} (per seed) | mean | test_acc at "
             "the end | virtual s at the end |", "|---|---|---|---|---|"]  # fmt: skip
    for method, runs in by_method.items():
        times = [first_time_at(rows, target) for rows in runs]
        cells = ", ".join("not reached" if t is None else f"{t:.1f}" for t in times)
        reached = [t for t in times if t is not None]
        mean = f"{statistics.fmean(reached):.1f}" if len(reached) == len(times) else "-"
        final = statistics.fmean(column(rows, "test_acc")[-1] for rows in runs)
        end = statistics.fmean(column(rows, "virtual_time")[-1] for rows in runs)
        lines.append(f"| {method} | {cells} | {mean} | {100 * final:.2f} | {end:.1f} |")
    return "\n".join(lines)


def straggler_figure(results: dict[str, list[dict[str, str]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(FRACTIONS), figsize=(12, 6.5), sharex=True)
    for col, fraction in enumerate(FRACTIONS):
        for name, rows in results.items():
            method, share = name.split(" @ ")
            if share != f"{fraction:.0%}":
                continue
            for row, key in enumerate(("test_loss", "test_acc")):
                kept = [r for r in rows if r.get(key) not in (None, "")]
                colour = f"C{list(STRAGGLER_METHODS).index(method)}"  # one per method
                axes[row, col].plot([int(r["round"]) for r in kept],
                                    [float(r[key]) for r in kept], label=method,
                                    color=colour)  # fmt: skip
        axes[0, col].set_title(f"synthetic(1,1), {fraction:.0%} stragglers")
        axes[1, col].set_xlabel("round")
    axes[0, 0].set_ylabel("test loss (global model)")
    axes[1, 0].set_ylabel("test accuracy")
    for ax in axes[1]:
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def fedbuff_figure(results: dict[str, list[dict[str, str]]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.6))
    colours: dict[str, str] = {}
    for name, rows in results.items():
        method = name.split(" | ")[0]
        times, accs = evaluated(rows, "virtual_time")
        first = method not in colours
        colour = colours.setdefault(method, f"C{len(colours)}")
        ax.plot(times, accs, color=colour, alpha=0.8, lw=1.2, label=method if first else None)
    ax.axhline(target, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title("digits, Pareto(1, 1.5) fit durations: one line per seed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> str:
    """Run both experiments (or their ``--quick`` smoke test); write and return the tables."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds, 2 epochs, 1 seed")
    parser.add_argument("--rounds", type=int, default=STRAGGLER_ROUNDS, help="of (a)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="of (b)")
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    parser.add_argument("--methods", nargs="+", default=list(STRAGGLER_METHODS.values()),
                        choices=list(STRAGGLER_METHODS.values()), help="of (a)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (at most 2 here)")
    parser.add_argument("--parts", nargs="+", default=["a", "b"], choices=["a", "b"])
    parser.add_argument("--fits", type=int, default=300, help="client fits per run of (b)")
    parser.add_argument("--target", type=float, default=TARGET, help="of (b)")
    parser.add_argument("--out", type=Path, default=Path("runs/experiments/time_effects"))
    args = parser.parse_args(argv)
    rounds, epochs, seeds, fits = args.rounds, EPOCHS, args.seeds, args.fits
    if args.quick:
        rounds, epochs, seeds, fits = 2, 2, seeds[:1], 20
    args.out.mkdir(parents=True, exist_ok=True)
    sections = []
    if "a" in args.parts:
        print("(a) FedProx's stragglers", flush=True)
        jobs = straggler_jobs(rounds, epochs, args.out, args.fractions, args.methods)
        results = fit_all(jobs, args.jobs)
        straggler_figure(results, args.out / "stragglers.png")
        sections.append(f"### (a) synthetic(1,1), {rounds} rounds, {epochs} local epochs\n\n"
                        + straggler_table(results))  # fmt: skip
    if "b" in args.parts:
        print("(b) FedBuff's claim", flush=True)
        results = fit_all(fedbuff_jobs(seeds, fits, args.out), args.jobs)
        fedbuff_figure(results, args.target, args.out / "fedbuff.png")
        sections.append(f"### (b) digits, Pareto fit durations, {fits} client fits per run, "
                        f"seeds {seeds}\n\n" + fedbuff_table(results, args.target))  # fmt: skip
    smoke = smoke_test_line(rounds, STRAGGLER_ROUNDS) if args.quick else None
    text = "\n\n".join(sections + ([smoke] if smoke else [])) + "\n"
    (args.out / "table.md").write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
