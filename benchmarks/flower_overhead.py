"""Per-round cost of the Flower backend against the sequential backend on the quickstart work,
interleaved.

Starts a SuperLink and ``--nodes`` SuperNodes on 127.0.0.1 with Flower's own commands
(:class:`fedlightning.flower_app.local.LocalFederation`), then runs ``configs/quickstart.yaml``
for ``--rounds`` rounds alternately with ``SequentialBackend`` and ``FlowerBackend`` (A B A B ...,
``--repeats`` pairs after one warm-up pair that is dropped: it starts the nodes' warm workers and
fills the caches). Per run, the time of ``backend.run`` per round (the client fits and, for Flower,
the messages, Flower's polling and ClientApp processes, the wire) and its median over the rounds;
the table prints, per backend, the median of those per-run medians with their range, the ratio of
each pair (flower / sequential, interleaved so that both sides of a pair see the same machine
load) as median and range, the start-up (``backend.start``), whether every run's ``global.pt``
is byte-identical to its pair's, and the load average before and after.

Where a Flower round's time goes (median over the measured rounds of the slowest node, from the
timestamps the backend collects: the relay's push and pull, the ClientApp process's start, the
node's warm worker): ``node pull + launch`` (the SuperNode's sleep between pulls, 3 s when it
finds no message, and its SuperExec's poll for a ClientApp to launch), ``clientapp start``
(Flower's ``flwr-clientapp`` process: interpreter, flwr import, app load, message pull),
``worker fits`` (fedlightning's fits on the node), ``to/from worker`` (our ClientApp forwarding
to the warm worker and back), ``reply push + pull`` (the reply's way to the relay) and
``backend`` (encoding, decoding and the relay link on the loop's side).

    python benchmarks/flower_overhead.py --rounds 3 --repeats 3 --threads 1   # fedlightning[flower]
    python benchmarks/flower_overhead.py --accelerator cuda --rounds 3 --repeats 3

``--superexec-poll S`` sets ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (an undocumented Flower 1.41
variable: the SuperExec's poll for ClientApps to launch, 1 s by default) for the SuperNodes this
benchmark starts, to show what that poll costs; the backend itself never sets it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fedlightning.backends.base import Backend
from fedlightning.backends.flower import FlowerBackend
from fedlightning.backends.sequential import SequentialBackend
from fedlightning.cli import main
from fedlightning.flower_app.local import LocalFederation

CONFIG = Path(__file__).parents[1] / "configs" / "quickstart.yaml"
#: the phases of a Flower round (see the module docstring), from the backend's timestamps
PHASES = {
    "node pull + launch": ("sent", "process_start"),
    "clientapp start": ("process_start", "handler"),
    "worker fits": ("fit_start", "fit_end"),
    "reply push + pull": ("replied", "received"),
}


class Recorder:
    """The wall time of every ``start`` and ``run`` of the backends, per run."""

    def __init__(self) -> None:
        self.run: dict[str, list[float]] = {}
        self.timings: list[dict[str, float]] = []

    def attach(self, cls: type[Backend]) -> None:
        for name in ("start", "run"):
            original = getattr(cls, name)

            def wrapper(backend, *args, _original=original, _name=name):
                began = time.perf_counter()
                try:
                    return _original(backend, *args)
                finally:
                    self.run.setdefault(_name, []).append(time.perf_counter() - began)
                    if _name == "run" and getattr(backend, "round_timings", None):
                        self.timings.append(phases(backend.round_timings, self.run["run"][-1]))

            setattr(cls, name, wrapper)


def phases(nodes: list[dict[str, float]], total: float) -> dict[str, float]:
    """The phases of one round on its slowest node (the one whose reply came last)."""
    node = max(nodes, key=lambda n: n["received"])
    out = {name: node[b] - node[a] for name, (a, b) in PHASES.items()}
    out["to/from worker"] = (node["fit_start"] - node["handler"]) + (
        node["replied"] - node["fit_end"]
    )
    out["backend"] = total - (node["received"] - node["sent"])
    return out


def fit(run_dir: Path, rounds: int, threads: int, accelerator: str, extra: list[str]) -> None:
    sys.argv = ["fedlightning"]
    main(
        ["fit", "--config", str(CONFIG), "--loop.run_dir", str(run_dir), "--loop.rounds", str(rounds),
         "--loop.num_threads", str(threads), "--loop.progress_bar", "false",
         "--loop.plots", "false", "--loop.accelerator", accelerator, *extra]
    )  # fmt: skip


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main_(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run")
    parser.add_argument("--repeats", type=int, default=3, help="measured A B pairs")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--superexec-poll", type=float, default=None)
    ns = parser.parse_args(args)
    recorders = {"sequential": Recorder(), "flower": Recorder()}
    recorders["sequential"].attach(SequentialBackend)
    recorders["flower"].attach(FlowerBackend)
    per_run: dict[str, list[float]] = {"sequential": [], "flower": []}
    starts: dict[str, list[float]] = {"sequential": [], "flower": []}
    ratios, identical, flower_phases = [], [], []
    load_before = os.getloadavg()
    federation = LocalFederation(ns.nodes, threads=ns.threads)
    if ns.superexec_poll is not None:
        federation.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(ns.superexec_poll)
    with tempfile.TemporaryDirectory() as tmp, federation as fed:
        flower = ["--loop.backend", "FlowerBackend", "--loop.backend.init_args.address",
                  fed.address, "--loop.backend.init_args.insecure", "true"]  # fmt: skip
        for repeat in range(ns.repeats + 1):
            medians = {}
            for name, extra in (("sequential", []), ("flower", flower)):
                recorder = recorders[name]
                recorder.run, recorder.timings = {}, []
                fit(Path(tmp) / f"{name}{repeat}", ns.rounds, ns.threads, ns.accelerator, extra)
                medians[name] = statistics.median(recorder.run["run"])
                if repeat:  # the first pair warms up
                    per_run[name].append(medians[name])
                    starts[name].append(recorder.run["start"][0])
                    flower_phases += recorder.timings
            same = (Path(tmp) / f"sequential{repeat}" / "global.pt").read_bytes() == (
                Path(tmp) / f"flower{repeat}" / "global.pt"
            ).read_bytes()
            if repeat:
                ratios.append(medians["flower"] / medians["sequential"])
                identical.append(same)
    load_after = os.getloadavg()
    print(
        f"quickstart work: {ns.rounds} rounds of 10 clients x 2 local epochs per run, "
        f"{ns.repeats} interleaved pairs after a warm-up pair, {ns.nodes} SuperNodes on "
        f"127.0.0.1, {ns.threads} thread(s), accelerator {ns.accelerator}"
        + (
            f", FLWR_SUPEREXEC_TASK_POLL_INTERVAL={ns.superexec_poll:g}"
            if ns.superexec_poll
            else ""
        )
    )
    print(f"{'backend':<12}{'s/round median [min, max]':>30}{'start s median':>18}")
    for name in ("sequential", "flower"):
        print(f"{name:<12}{spread(per_run[name]):>30}{statistics.median(starts[name]):>18.2f}")
    print(f"ratio flower/sequential per pair: {spread(ratios)}")
    if flower_phases:
        print("a Flower round, slowest node (median s over the measured rounds):")
        for name in [*PHASES, "to/from worker", "backend"]:
            print(f"  {name:<22}{statistics.median(p[name] for p in flower_phases):>8.2f}")
    print(f"global.pt byte-identical: {all(identical)}")
    print(
        "load average (1, 5, 15 min): before "
        + ", ".join(f"{x:.2f}" for x in load_before)
        + "; after "
        + ", ".join(f"{x:.2f}" for x in load_after)
    )


if __name__ == "__main__":
    main_()
