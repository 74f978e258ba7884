"""``models.pt``: every deployable a run scored, saved beside ``global.pt`` at its end.

The file (written atomically, :func:`~fedlightning.loop.checkpoint.atomic_save`) is
``{"format": MODELS_FORMAT, "round": rounds done, "models": {name: {"architecture": str | None,
"state_dict": ...}}}``:
one entry per name of ``Aggregator.deployables()`` (``global``, each client group's model,
FedCross's ``middleware_<i>``), each with the registered model name of its architecture
(``None``: a network given as a module) and the state its scoring network is loaded with (the
deployable's weights; for FML with adaptor heads, the backbone's and the assembled head's,
:class:`~fedlightning.clients.fml_heads.HeadedBackbone`). With ``config.yaml`` (the objective's
settings) it rebuilds every scoring network: ``fedlightning test RUN_DIR`` does
(:mod:`fedlightning.cli.scoring`). docs/algorithms.md section 6.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedlightning.errors import ConfigurationError
from fedlightning.loop.checkpoint import atomic_save
from fedlightning.loop.scoring_model import SavedModel

MODELS_FILE = "models.pt"
MODELS_FORMAT = "fedlightning-models-1"
PERSONAL_FILE = "personal.pt"
PERSONAL_FORMAT = "fedlightning-personal-1"


def save_models(models: dict[str, SavedModel], rounds: int, run_dir: Path) -> None:
    """Write ``run_dir/models.pt``: :meth:`ScoringModel.saved
    <fedlightning.loop.scoring_model.ScoringModel.saved>`'s entries after ``rounds`` rounds."""
    saved = {"format": MODELS_FORMAT, "round": rounds, "models": models}
    atomic_save(saved, run_dir / MODELS_FILE, on_cpu=True)


def save_personal_models(saved: dict[str, Any], run_dir: Path) -> None:
    """Write ``run_dir/personal.pt``: the clients' deployed models as the run's last evaluation
    scored them (after fine-tuning), ``{"format": PERSONAL_FORMAT, "round": r, "split": "test" |
    "val", "clients": {client_id: {"architecture": str | None, "state_dict": ...}}}``
    (:mod:`fedlightning.loop.personal`, docs/algorithms.md section 10)."""
    atomic_save({"format": PERSONAL_FORMAT, **saved}, run_dir / PERSONAL_FILE, on_cpu=True)


def read_models(path: Path) -> tuple[int, dict[str, SavedModel]]:
    """``(rounds done, entries)`` of a ``models.pt`` (weights only: no code runs); an unreadable
    or malformed file is a one-line ConfigurationError."""
    try:
        saved: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 (torch raises many kinds for a bad file)
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        raise ConfigurationError(
            f"{path} cannot be read ({type(error).__name__}: {first}): it is truncated or corrupted"
        ) from None
    if not isinstance(saved, dict) or saved.get("format") != MODELS_FORMAT:
        raise ConfigurationError(f"{path} is not a fedlightning {MODELS_FILE} ({MODELS_FORMAT})")
    models, rounds = saved.get("models"), saved.get("round")
    if not isinstance(models, dict) or not models or type(rounds) is not int:
        raise ConfigurationError(f"{path} is malformed: it holds no models or no round")
    for name, entry in models.items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("state_dict"), dict)
            and isinstance(entry.get("architecture"), str | type(None))
        ):
            raise ConfigurationError(f"{path} is malformed: its entry {name!r} has no state_dict")
    return rounds, models
