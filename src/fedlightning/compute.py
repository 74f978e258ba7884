"""A run's compute: device, precision and autocast, resolved once by Lightning Fabric.

The precisions ``loop.precision`` accepts, and which path runs each (the one table every check
reads: :func:`fedlightning.fit.trainer_reason`, the cohort backend's ``check``, the objectives'
``supported_precisions`` through :data:`NO_SKIP_PRECISIONS`):

==========  ===========  ======  =========================  ===================================
precision   fit loop     cohort  optimizer steps may skip   autocast
==========  ===========  ======  =========================  ===================================
32-true     lean         yes     no                         none (``32`` is Lightning's alias)
bf16-mixed  lean         yes     no                         bfloat16
16-mixed    Fabric       yes     yes (the gradient scaler)  float16; on a CPU Lightning runs
                                                            ``bf16-mixed`` instead, and so do we
64-true     no: Trainer  no      no                         none (float64 weights)
==========  ===========  ======  =========================  ===================================

The fit loop (:class:`fedlightning.fit.ClientFitter`) runs ``lean`` (plain torch per step, the
autocast above made once per fit by the run's Fabric) where no gradient scaler steps, and on
Fabric's per-step wrappers where one does.

:meth:`Compute.resolve` builds the run's one Fabric for ``(accelerator, precision)`` and reads
from it the device (``auto`` is the GPU when there is one) and the precision the fits run. The
loop resolves it once at start-up and hands it to the backend (client fits, the cohort, the
``auto`` choice), the evaluation and the server placement (:mod:`fedlightning.loop.server_device`).
A backend that crosses processes (Ray actors, Flower nodes) sends the picklable description, the
:class:`~fedlightning.protocol.FitConfig` (its ``accelerator`` and ``precision``), and each worker
resolves its own :class:`Compute` once (its device may differ from the driver's).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

import torch
from lightning.fabric import Fabric


class PrecisionPaths(NamedTuple):
    """Which paths run one precision (a row of the module docstring's table)."""

    fabric: bool  #: the fit loop runs it, lean or on Fabric (otherwise a Lightning Trainer fits)
    cohort: bool  #: the cohort backend vectorizes it
    skips_steps: bool  #: a gradient scaler may skip an optimizer step (non-finite gradients)
    autocast: torch.dtype | None  #: the dtype forward passes autocast to (None: no autocast)


PRECISION_PATHS: dict[str, PrecisionPaths] = {
    "32-true": PrecisionPaths(fabric=True, cohort=True, skips_steps=False, autocast=None),
    "bf16-mixed": PrecisionPaths(fabric=True, cohort=True, skips_steps=False, autocast=torch.bfloat16),
    "16-mixed": PrecisionPaths(fabric=True, cohort=True, skips_steps=True, autocast=torch.float16),
    "64-true": PrecisionPaths(fabric=False, cohort=False, skips_steps=False, autocast=None),
}  # fmt: skip
#: Lightning's other names for a precision
ALIASES = {"32": "32-true"}
#: every value ``loop.precision`` accepts
PRECISIONS: tuple[str, ...] = ("32-true", "32", "bf16-mixed", "16-mixed", "64-true")


def canonical(precision: str) -> str:
    """``precision`` by its canonical name (``32`` -> ``32-true``)."""
    return ALIASES.get(str(precision), str(precision))


def precisions(path: str, supported: bool = True) -> tuple[str, ...]:
    """The accepted precision names (aliases included) whose row has ``path`` equal to
    ``supported`` (``path``: a field of :class:`PrecisionPaths`)."""
    return tuple(p for p in PRECISIONS if getattr(PRECISION_PATHS[canonical(p)], path) == supported)


#: precisions the Fabric fit runs (the others get a Trainer)
FABRIC_PRECISIONS = precisions("fabric")
#: precisions the cohort backend vectorizes
COHORT_PRECISIONS = precisions("cohort")
#: precisions whose optimizer steps are never skipped by a gradient scaler (``16-mixed`` skips a
#: step with non-finite gradients, yet Lightning still counts it): objectives that divide by their
#: step count (SCAFFOLD, FedNova) support these only
NO_SKIP_PRECISIONS = frozenset(precisions("skips_steps", supported=False))


@dataclass(frozen=True)
class Compute:
    """The device, precision and autocast of a run's client fits and evaluation (module docstring).

    Attributes:
        accelerator: the Lightning accelerator as configured (``auto``, ``cpu``, ``cuda``...).
        precision: the precision the fits run: canonical, and ``bf16-mixed`` for ``16-mixed`` on a
            CPU (Lightning's substitution; it warns once, when the run's Fabric is built).
        device: the device the fits, the evaluation and the server state use.
        fabric: the run's Fabric: its device, autocast, and the fits' optimizer and backward
            wrapping. ``64-true`` fits run on a Trainer; their Fabric is a ``32-true`` one that
            serves only its device and a no-op autocast.
    """

    accelerator: str
    precision: str
    device: torch.device
    fabric: Fabric

    @classmethod
    def resolve(cls, accelerator: str, precision: str) -> Compute:
        """The compute of a run with ``accelerator`` and ``precision`` (one Fabric built)."""
        name = canonical(precision)
        if name not in PRECISION_PATHS:
            raise ValueError(f"unknown precision {precision!r}: one of {', '.join(PRECISIONS)}")
        fabric_precision = name if PRECISION_PATHS[name].fabric else "32-true"
        fabric = Fabric(accelerator=accelerator, devices=1, precision=fabric_precision)  # type: ignore[arg-type]
        device = fabric.device
        if name == "16-mixed" and device.type == "cpu":  # fp16 AMP does not exist on a CPU
            name = "bf16-mixed"
        return cls(accelerator, name, device, fabric)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype forward passes autocast to (``None``: no autocast)."""
        return PRECISION_PATHS[self.precision].autocast

    def autocast(self) -> AbstractContextManager:
        """The precision's forward context (the run's Fabric's ``autocast``)."""
        return self.fabric.autocast()

    def fit_fabric(self) -> Fabric:
        """The Fabric one client fit runs on: the run's, except under ``16-mixed``, where each
        fit gets a fresh Fabric. A ``16-mixed`` Fabric owns a gradient scaler whose scale moves
        with every step, and Lightning builds one per Trainer; its public API offers no reset, so
        a fresh Fabric per fit is what keeps scaler state from crossing clients (whose order
        must never change a result)."""
        if self.precision != "16-mixed":
            return self.fabric
        return Fabric(accelerator=self.accelerator, devices=1, precision="16-mixed")
