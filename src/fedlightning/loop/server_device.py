"""The server device: where the loop keeps the server state between rounds.

The server device is the device the run trains on: the run's
:class:`~fedlightning.compute.Compute` device (the loop's ``accelerator`` resolved once by
Lightning Fabric; ``auto`` is the GPU when there is one), which the client fits, the backends and
the evaluation use too. The global model(s), the aggregator's own state (SCAFFOLD's ``c``, FedCross's
middleware models, FedAvgM/FedAdam moments, InCo's and FedNova's updates) and the payloads built
from them live there for the whole run; aggregators compute on the device of the tensors they are
given (:mod:`fedlightning.server.functional`). So on a GPU a round never copies the server state
to the CPU and back:

- uploads of in-process backends (sequential, cohort) are produced on the device and stay there;
- backends that cross processes (Ray, Flower) send CPU tensors over the wire, and
  :meth:`ServerDevice.arrivals` moves their uploads onto the server device when they arrive
  (a no-op for uploads already there);
- only files go to the CPU: checkpoints and ``global.pt``
  (:func:`fedlightning.loop.checkpoint.atomic_save`), and the ClientStore keeps client state off
  the accelerator as before; a resumed run puts the checkpoint's server state back on the server
  device (:meth:`ServerDevice.place`).

On a CPU run every move here returns its input unchanged (:mod:`fedlightning.placement`), so
results are bit for bit those of a CPU-only server.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from fedlightning.backends.base import RoundResults
from fedlightning.placement import move
from fedlightning.protocol import FitResult

T = TypeVar("T")


class ServerDevice:
    """Places server state on one device (see the module docstring).

    Args:
        device: the server device (the run's ``Compute.device``).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)

    def place(self, value: T) -> T:
        """``value`` (a state_dict, a list of them, an aggregator's ``state_dict``) on the server
        device."""
        return move(value, self.device)

    def arrivals(self, results: RoundResults) -> RoundResults:
        """The round's results with every upload on the server device (client state is left
        where it is: the ClientStore copies it to the CPU)."""
        out: dict[int, Any] = {}
        for cid, result in results.items():
            if isinstance(result, FitResult):
                upload = move(result.upload, self.device)
                if upload is not result.upload:
                    result = FitResult(upload, result.state)
            out[cid] = result
        return out
