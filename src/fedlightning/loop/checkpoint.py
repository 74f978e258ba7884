"""Checkpoints: everything a resumed run needs, written atomically, read back with checks.

A checkpoint (format 4) holds the rounds done, the aggregator's and the client store's state, the
metrics history, each round component's state under its name (``components``; a checkpoint
written before round components holds the same states under ``meters``, and reads as well:
docs/algorithms.md section 6.2), the global RNG states and the run's identity
(:func:`fedlightning.loop.identity.run_identity`: its resolved config since format 3, so an older
checkpoint, which cannot tell a changed option, is refused with a message). Format 4: every
aggregator's state is its declared state (FedCross, InCo and client-level DP wrote their own
layout before; docs/algorithms.md section 2.6), and the identity names it (``server_state``); a
format-3 checkpoint is refused in one line. The rounds done and the metrics history are sealed
(``seal``: :func:`seal_of`, a SHA-256 of the two), so a checkpoint whose round or history was
edited after it was written is refused: the run would go on from a round it never reached (a
checkpoint written before the seal existed holds none, and is read without it).
:func:`read_checkpoint` turns any unreadable or inconsistent file (empty, truncated, garbage, a
malicious pickle, a hand-edited round) into a one-line
:class:`~fedlightning.errors.ConfigurationError`; :func:`atomic_save` never leaves a torn
file, and a failed write (a full disk) is a :class:`~fedlightning.errors.StorageError` naming the
directory, with the previous checkpoint untouched.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from pathlib import Path
from typing import Any

import torch

from fedlightning.errors import ConfigurationError, storage_error
from fedlightning.placement import to_cpu

CHECKPOINT_FORMAT = "fedlightning-checkpoint-4"
#: keys every checkpoint holds, with their types
REQUIRED = {
    "round": int,
    "aggregator": dict,
    "clients": dict,
    "history": list,
    "rng": dict,
    "identity": dict,
}


def atomic_save(obj: Any, path: str | Path, on_cpu: bool = False) -> None:
    """``torch.save`` to a temporary file in the same folder, fsync, then rename over ``path``:
    a reader (or a run killed mid-write) sees either the old file or the new one, never a torn one.
    A failed write removes the temporary file and raises a StorageError naming the folder.

    Every tensor in ``obj`` is written from the CPU (:func:`~fedlightning.placement.to_cpu`: the
    server state may live on the GPU), so a file loads anywhere; the caller's ``obj`` is untouched.
    ``on_cpu``: ``obj`` is known to hold CPU tensors only (a :func:`snapshot`), not walked again."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            # into memory first, then one plain write: a full disk is an OSError (ENOSPC), never
            # torch's writer failing deep inside its C++ container
            buffer = io.BytesIO()
            torch.save(obj if on_cpu else to_cpu(obj), buffer)
            handle.write(buffer.getbuffer())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as error:
        tmp.unlink(missing_ok=True)
        cause = error if isinstance(error, OSError) else _os_error(error)
        if cause is None:
            raise
        kept = f"; the previous {path.name} there is untouched" if path.exists() else ""
        raise storage_error(cause, path.parent, f"write {path.name}", kept) from None


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind a RuntimeError of torch's writer (which reports ENOSPC as a
    RuntimeError from inline_container.cc)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete the temporary files of a run killed while writing its checkpoint."""
    for stale in run_dir.glob(".last.ckpt.tmp-*"):
        stale.unlink()


def make_checkpoint(
    rounds_done: int,
    identity: dict[str, Any],
    aggregator: dict[str, Any],
    clients: dict[str, Any],
    history: list[dict[str, float]],
    logger_ids: dict[str, str | None],
    components: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint after ``rounds_done`` rounds, with the global RNG states of this moment."""
    return {
        "format": CHECKPOINT_FORMAT,
        "round": rounds_done,
        "seal": seal_of(rounds_done, history),
        "identity": identity,
        # kept at the top level too: tools (and older tests) read them there
        "seed": identity["seed"],
        "num_clients": identity["num_clients"],
        "partition_hash": identity["partition_hash"],
        "aggregator": aggregator,
        "clients": clients,
        "history": history,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "wandb_id": logger_ids.get("wandb"),
        "components": components or {},
    }


def seal_of(rounds_done: int, history: list[dict[str, float]]) -> str:
    """The SHA-256 of the rounds done and the metrics history (canonical JSON: keys sorted,
    numbers as Python writes them back exactly), which a checkpoint keeps as ``seal``."""
    text = json.dumps({"round": rounds_done, "history": history}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def snapshot(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``checkpoint`` that later rounds cannot change, to be written while they run: the
    server and client state copied to the CPU (an aggregator or an objective may update tensors in
    place), the history's rows and the round components' states copied; the rest (RNG states
    taken at this moment, identity, ids) holds nothing a later round changes."""
    return {
        **checkpoint,
        "aggregator": to_cpu(checkpoint["aggregator"], copy=True),
        "clients": to_cpu(checkpoint["clients"], copy=True),
        "history": [dict(row) for row in checkpoint["history"]],
        "components": to_cpu(checkpoint.get("components", {}), copy=True),
    }


def read_checkpoint(ckpt_path: str) -> dict[str, Any]:
    """Read ``ckpt_path`` (weights only: no code runs) and check its structure; any problem is a
    one-line ConfigurationError."""
    path = Path(ckpt_path)
    option = f"ckpt_path={ckpt_path!r}"
    if path.is_dir():
        raise ConfigurationError(
            f"{option} is a directory: give the checkpoint file (e.g. {str(path / 'last.ckpt')!r})"
        )
    if not path.is_file():
        raise ConfigurationError(f"{option} does not exist")
    if path.stat().st_size == 0:
        raise ConfigurationError(f"{option} is empty (0 bytes): resume from another checkpoint")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 (torch raises many kinds for a bad file)
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        raise ConfigurationError(
            f"{option} cannot be read ({type(error).__name__}: {first}): it is truncated, "
            "corrupted or not a fedlightning checkpoint; resume from another checkpoint"
        ) from None
    if not isinstance(checkpoint, dict) or "format" not in checkpoint:
        raise ConfigurationError(f"{option} is not a fedlightning checkpoint")
    if checkpoint["format"] != CHECKPOINT_FORMAT:
        raise ConfigurationError(
            f"{option} has format {checkpoint['format']!r} but this fedlightning reads "
            f"{CHECKPOINT_FORMAT!r}: resume with the fedlightning that wrote it, or start anew"
        )
    for key, kind in REQUIRED.items():
        value = checkpoint.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigurationError(
                f"{option} is inconsistent: {key!r} is {type(value).__name__}, expected "
                f"{kind.__name__}; resume from another checkpoint"
            )
    rounds = checkpoint["round"]
    if rounds < 1 or len(checkpoint["history"]) > rounds:
        raise ConfigurationError(
            f"{option} is inconsistent: round={rounds} (expected an integer >= 1 and at least "
            f"the {len(checkpoint['history'])} evaluated rounds it records); resume from another "
            "checkpoint"
        )
    if "seal" in checkpoint and checkpoint["seal"] != seal_of(rounds, checkpoint["history"]):
        raise ConfigurationError(
            f"{option} is inconsistent: its round ({rounds}) or its metrics history was changed "
            "after the run wrote it (they no longer match their seal), so it would resume from a "
            "round the run never reached; resume from an unedited checkpoint"
        )
    rng = checkpoint["rng"]
    if not isinstance(rng.get("torch"), torch.Tensor) or not isinstance(
        rng.get("python"), list | tuple
    ):
        raise ConfigurationError(f"{option} is inconsistent: its RNG states are missing")
    return checkpoint


def restore_rng(checkpoint: dict[str, Any]) -> None:
    """Restore the global RNG states a checkpoint holds."""
    torch.set_rng_state(checkpoint["rng"]["torch"])
    random.setstate(_as_tuple(checkpoint["rng"]["python"]))


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value
