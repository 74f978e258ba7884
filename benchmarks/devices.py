"""What the benchmarks share about the device they time: a clock that waits for queued GPU work,
and a readable device name for table titles."""

from __future__ import annotations

import platform
import time

import torch


def clock(accelerator: str) -> float:
    """``time.perf_counter()`` after the device's queued work is done (``accelerator``: ``cpu`` or
    ``cuda``)."""
    if accelerator == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def device_name(accelerator: str) -> str:
    """The GPU's name, or the CPU model from ``/proc/cpuinfo``."""
    if accelerator == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"CPU {platform.processor() or platform.machine()}".strip()
