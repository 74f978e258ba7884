"""Exact resume for every algorithm: each config under configs/ runs R rounds straight and R/2 +
resume to R; the final global.pt and the checkpointed server and client state (FedCross's
middleware models, SCAFFOLD's control variates, FML's personal models) are equal bit for bit."""

import sys
from pathlib import Path

import pytest
import torch

from fedlightning.cli import main

CONFIGS = sorted(
    p
    for p in (Path(__file__).parents[1] / "configs").glob("*.yaml")
    if not p.name.startswith("cofed")
)
SMALL = [
    "--loop.local_steps",
    "2",
    "--loop.eval_every",
    "4",
    "--loop.progress_bar",
    "false",
    "--loop.plots",
    "false",
]


def _fit(config: Path, run_dir: Path, rounds: int, *extra: str) -> None:
    sys.argv = ["fedlightning"]
    main(
        [
            "fit",
            "--config",
            str(config),
            "--loop.run_dir",
            str(run_dir),
            "--loop.rounds",
            str(rounds),
            *SMALL,
            *extra,
        ]
    )


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_resume_equals_straight_run(config, tmp_path):
    rounds = 4
    _fit(config, tmp_path / "straight", rounds)
    _fit(config, tmp_path / "resumed", rounds // 2)
    _fit(
        config, tmp_path / "resumed", rounds, "--ckpt_path", str(tmp_path / "resumed" / "last.ckpt")
    )
    assert (tmp_path / "straight" / "global.pt").read_bytes() == (
        tmp_path / "resumed" / "global.pt"
    ).read_bytes()
    straight, resumed = (
        torch.load(tmp_path / d / "last.ckpt", weights_only=True) for d in ("straight", "resumed")
    )
    assert straight["round"] == resumed["round"] == rounds
    assert _equal(straight["aggregator"], resumed["aggregator"])
    assert _equal(straight["clients"], resumed["clients"])
