"""A run killed with SIGKILL at arbitrary moments always leaves a last.ckpt that loads and resumes,
and the resumed run ends bitwise equal to an uninterrupted one."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedlightning.state import ClientStore

# about 20 s of repeated runs killed with SIGKILL; `make test-all` runs it
pytestmark = pytest.mark.slow

CONF = Path(__file__).parent / "conf" / "tiny.yaml"


def _start(run_dir: Path, *args: str, config: Path = CONF) -> subprocess.Popen:
    command = [sys.executable, "-m", "fedlightning.cli", "fit", "--config", str(config),
               "--loop.rounds", "400", "--loop.run_dir", str(run_dir), *args]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _kill_after_checkpoint(
    process: subprocess.Popen, checkpoint: Path, after_round: int, delay: float
) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if checkpoint.exists():
            try:
                if torch.load(checkpoint, weights_only=True)["round"] > after_round:
                    break
            except Exception:  # being replaced right now: the next look sees the new file
                pass
        time.sleep(0.02)
    time.sleep(delay)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def test_sigkill_always_leaves_a_resumable_checkpoint(cli, tmp_path):
    run_dir = tmp_path / "killed"
    checkpoint = run_dir / "last.ckpt"
    rng = random.Random(0)
    rounds_seen = [0]
    for attempt in range(3):
        resume = ["--ckpt_path", str(checkpoint)] if attempt else []
        process = _start(run_dir, *resume)
        _kill_after_checkpoint(process, checkpoint, rounds_seen[-1], delay=rng.uniform(0.0, 0.4))
        state = torch.load(checkpoint, weights_only=True)  # never torn
        assert state["round"] >= rounds_seen[-1]
        rounds_seen.append(state["round"])
    final = rounds_seen[-1] + 2
    cli(run_dir, "--loop.rounds", str(final), "--ckpt_path", str(checkpoint))
    cli(tmp_path / "straight", "--loop.rounds", str(final))
    assert (run_dir / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()


def test_sigkill_during_a_background_checkpoint_write_leaves_a_resumable_checkpoint(cli, tmp_path):
    """The checkpoint is written by a background thread while the next round trains: a kill while
    a write is in flight (its temporary file exists) leaves the previous last.ckpt, whole, with
    every client state file it names (SCAFFOLD's c_i on disk: the next round has replaced some),
    and the resume is bitwise the uninterrupted run. A wider MLP makes each write take longer."""
    run = ("--model.class_path", "fedlightning.clients.ScaffoldClient",
           "--model.init_args.network_kwargs", "{hidden: [512, 512]}",
           "--loop.aggregator.class_path", "fedlightning.server.Scaffold",
           "--loop.client_state", "disk")  # fmt: skip
    run_dir = tmp_path / "killed"
    checkpoint = run_dir / "last.ckpt"
    hit = False
    for _ in range(8):  # a write is in flight for some ms per round: retried if missed
        resume = ["--ckpt_path", str(checkpoint)] if checkpoint.exists() else []
        process = _start(run_dir, *run, *resume)
        seen = int(torch.load(checkpoint, weights_only=True)["round"]) if resume else 0
        _kill_during_a_write(process, run_dir, checkpoint, after_round=seen)
        hit = any(run_dir.glob(".last.ckpt.tmp-*"))  # the kill cut a write short
        if hit:
            break
    assert hit, "no kill landed while a checkpoint write was in flight"
    state = torch.load(checkpoint, weights_only=True)  # the previous checkpoint, whole
    store = ClientStore("disk", run_dir / "client_state")
    store.load_state_dict(state["clients"])  # its state files are all there (count and digest)
    assert len(store) == state["clients"]["clients"] > 0
    final = int(state["round"]) + 2
    cli(run_dir, *run, "--loop.rounds", str(final), "--ckpt_path", str(checkpoint))
    assert not any(run_dir.glob(".last.ckpt.tmp-*"))  # the resume removed the torn temporary
    cli(tmp_path / "straight", *run, "--loop.rounds", str(final))
    assert (run_dir / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()


def _kill_during_a_write(
    process: subprocess.Popen, run_dir: Path, checkpoint: Path, after_round: int
) -> None:
    """SIGKILL ``process`` as soon as a checkpoint write after round ``after_round`` is in flight."""
    deadline = time.monotonic() + 120
    ready = False  # a checkpoint newer than the one this attempt resumed from is on disk
    while time.monotonic() < deadline and process.poll() is None:
        if not ready and checkpoint.exists():
            try:
                ready = torch.load(checkpoint, weights_only=True)["round"] > after_round
            except Exception:  # being replaced right now: the next look sees the new file
                pass
        if ready and any(run_dir.glob(".last.ckpt.tmp-*")):
            break
        time.sleep(0.001)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def test_sigkill_with_client_state_on_disk_resumes_bitwise(cli, tmp_path):
    """SCAFFOLD's c_i as files (``client_state: disk``): a kill at any moment (between a round's
    state files and its checkpoint, while superseded files are deleted) resumes bitwise, and the
    folder ends with one file per client that holds state."""
    config = CONF.parent / "scaffold_tiny.yaml"
    disk = ("--loop.client_state", "disk")
    run_dir = tmp_path / "killed"
    checkpoint = run_dir / "last.ckpt"
    rng = random.Random(1)
    rounds_seen = [0]
    for attempt in range(4):
        resume = ["--ckpt_path", str(checkpoint)] if attempt else []
        process = _start(run_dir, *disk, *resume, config=config)
        _kill_after_checkpoint(process, checkpoint, rounds_seen[-1], delay=rng.uniform(0.0, 0.4))
        rounds_seen.append(torch.load(checkpoint, weights_only=True)["round"])
    final = rounds_seen[-1] + 2
    rounds = ("--loop.rounds", str(final))
    cli(run_dir, *disk, *rounds, "--ckpt_path", str(checkpoint), config="scaffold_tiny.yaml")
    cli(tmp_path / "straight", *disk, *rounds, config="scaffold_tiny.yaml")
    for name in ("global.pt", "client_state"):
        resumed, straight = run_dir / name, tmp_path / "straight" / name
        if name == "global.pt":
            assert resumed.read_bytes() == straight.read_bytes()
        else:  # one file per stateful client, the same clients
            owners = [  # the folder's own hidden files (its owner and lock) left aside
                sorted(p.name.split(".")[0] for p in d.iterdir() if not p.name.startswith("."))
                for d in (resumed, straight)
            ]
            assert owners[0] == owners[1] and len(set(owners[0])) == len(owners[0])
