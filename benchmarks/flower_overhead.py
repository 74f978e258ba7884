"""Per-round overhead of the Flower backend against the sequential backend on the quickstart work.

Starts a SuperLink and ``--nodes`` SuperNodes on 127.0.0.1 with Flower's own commands
(:class:`fedlightning.flower_app.local.LocalFederation`), then runs ``configs/quickstart.yaml`` for
``--rounds`` rounds with ``SequentialBackend`` and with ``FlowerBackend``, in this one run, and
prints per backend: the mean time of ``backend.run`` per round (the client fits and, for Flower,
the messages, the ClientApp processes and the records), the start-up (``backend.start``: for Flower
``flwr run`` of the relay app and node discovery), the per-round ratio and whether ``global.pt`` is
byte-identical.

    python benchmarks/flower_overhead.py --rounds 2 --threads 1   # needs fedlightning[flower]

On Flower 1.41 a SuperNode handles one message at a time, each in a fresh ``flwr-clientapp``
process, and sleeps 3 s when it finds no message waiting. The backend sends one message per node
and round, and the ClientApp forwards it to the node's warm worker (torch, Lightning and the data
module loaded once per node): what remains per round is mostly Flower's polling and the
``flwr-clientapp`` process start.
"""

from __future__ import annotations

import argparse
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


def timed(cls: type[Backend], times: dict[str, list[float]]) -> None:
    """Record the wall time of every ``start`` and ``run`` call of ``cls``."""
    for name in ("start", "run"):
        original = getattr(cls, name)

        def wrapper(self, *args, _original=original, _name=name):
            began = time.perf_counter()
            try:
                return _original(self, *args)
            finally:
                times.setdefault(_name, []).append(time.perf_counter() - began)

        setattr(cls, name, wrapper)


def fit(run_dir: Path, rounds: int, threads: int, extra: list[str]) -> None:
    sys.argv = ["fedlightning"]
    main(
        ["fit", "--config", str(CONFIG), "--loop.run_dir", str(run_dir), "--loop.rounds", str(rounds),
         "--loop.num_threads", str(threads), "--loop.progress_bar", "false", *extra]
    )  # fmt: skip


def main_(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    ns = parser.parse_args(args)
    seq_times: dict[str, list[float]] = {}
    flower_times: dict[str, list[float]] = {}
    timed(SequentialBackend, seq_times)
    timed(FlowerBackend, flower_times)
    with tempfile.TemporaryDirectory() as tmp, LocalFederation(ns.nodes, threads=ns.threads) as fed:
        fit(Path(tmp) / "seq", ns.rounds, ns.threads, [])
        fit(
            Path(tmp) / "flower", ns.rounds, ns.threads,
            ["--loop.backend", "FlowerBackend", "--loop.backend.init_args.address", fed.address,
             "--loop.backend.init_args.insecure", "true"],
        )  # fmt: skip
        same = (Path(tmp) / "seq" / "global.pt").read_bytes() == (
            Path(tmp) / "flower" / "global.pt"
        ).read_bytes()
    seq_round = sum(seq_times["run"]) / len(seq_times["run"])
    flower_round = sum(flower_times["run"]) / len(flower_times["run"])
    print(
        f"quickstart work: {ns.rounds} rounds of 10 clients x 2 local epochs, {ns.nodes} SuperNodes on 127.0.0.1, {ns.threads} thread(s)"
    )
    print(f"{'backend':<12}{'start (s)':>12}{'s/round':>12}{'ratio':>10}")
    print(f"{'sequential':<12}{seq_times['start'][0]:>12.2f}{seq_round:>12.2f}{1.0:>10.2f}")
    print(
        f"{'flower':<12}{flower_times['start'][0]:>12.2f}{flower_round:>12.2f}{flower_round / seq_round:>10.2f}"
    )
    print(f"per-round overhead of the Flower backend: {flower_round - seq_round:.2f} s")
    print(f"global.pt byte-identical: {same}")


if __name__ == "__main__":
    main_()
