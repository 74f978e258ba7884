"""Checkpoints: everything a resumed run needs, written atomically, read back with checks."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

from fedlightning.errors import ConfigurationError

CHECKPOINT_FORMAT = "fedlightning-checkpoint-1"


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file in the same folder, fsync, then rename over ``path``:
    a reader (or a run killed mid-write) sees either the old file or the new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete the temporary files of a run killed while writing its checkpoint."""
    for stale in run_dir.glob(".last.ckpt.tmp-*"):
        stale.unlink()


def make_checkpoint(
    rounds_done: int,
    seed: int,
    num_clients: int,
    partition_hash: str,
    aggregator: dict[str, Any],
    clients: dict[str, Any],
    history: list[dict[str, float]],
    logger_ids: dict[str, str | None],
    meters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint after ``rounds_done`` rounds, with the global RNG states of this moment."""
    return {
        "format": CHECKPOINT_FORMAT,
        "round": rounds_done,
        "seed": seed,
        "num_clients": num_clients,
        "partition_hash": partition_hash,
        "aggregator": aggregator,
        "clients": clients,
        "history": history,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "wandb_id": logger_ids.get("wandb"),
        "meters": meters or {},
    }


def load_checkpoint(ckpt_path: str, seed: int, partition_hash: str) -> dict[str, Any]:
    """Read ``ckpt_path`` and check it belongs to this run (same seed and data partition); restore
    the global RNG states it holds."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise ConfigurationError(f"ckpt_path={ckpt_path!r} does not exist")
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ConfigurationError(f"ckpt_path={ckpt_path!r} is not a fedlightning checkpoint")
    if checkpoint["seed"] != seed or checkpoint["partition_hash"] != partition_hash:
        raise ConfigurationError(
            f"ckpt_path={ckpt_path!r} was written with seed {checkpoint['seed']} and another data "
            f"partition than this run (seed {seed}): resume with the same data and seed"
        )
    torch.set_rng_state(checkpoint["rng"]["torch"])
    random.setstate(_as_tuple(checkpoint["rng"]["python"]))
    return checkpoint


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value
