"""The torch settings that decide a process's floating-point results, carried to worker processes.

A client fit's result depends on more than its inputs and seed: on the CPU, the number of intra-op
threads decides how a reduction (a convolution's weight gradient, a matmul) is split and so the
order its partial sums are added in; oneDNN kernels, deterministic algorithms, flush-to-zero of
denormals and the float32 matmul precision change results too, and on a GPU cuDNN's flags and
cuBLAS's workspace (``CUBLAS_WORKSPACE_CONFIG``, read when CUDA starts). A worker process (a Ray
actor) starts with its own defaults (Ray sets ``OMP_NUM_THREADS`` to the actor's ``num_cpus``), so
the backends that fit clients elsewhere capture these settings in the driver, where the sequential
path computes (inside the run's ``cpu_compute`` and ``deterministic_compute``), and apply them in
each worker, the environment variable first: results are then byte-identical to the sequential
backend's whatever ``OMP_NUM_THREADS`` the user has (docs/algorithms.md section 9.1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from fedlightning.determinism import CUBLAS_VARIABLE


def _flushes_denormals() -> bool:
    """Whether denormals are flushed to zero (``torch.set_flush_denormal``, which has no getter):
    the smallest float32 denormals times one is zero exactly then."""
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    return bool((tiny * torch.ones(1))[0] == 0)


@dataclass(frozen=True)
class ComputeSettings:
    """torch's result-deciding settings of one process (see the module docstring)."""

    num_threads: int
    num_interop_threads: int
    onednn: bool
    deterministic: bool
    deterministic_warn_only: bool
    flush_denormal: bool
    float32_matmul_precision: str
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    cublas_workspace_config: str | None = None

    @classmethod
    def current(cls) -> ComputeSettings:
        """This process's settings now (in the driver: inside the run's ``cpu_compute``)."""
        return cls(
            num_threads=torch.get_num_threads(),
            num_interop_threads=torch.get_num_interop_threads(),
            onednn=torch.backends.mkldnn.enabled,
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            flush_denormal=_flushes_denormals(),
            float32_matmul_precision=torch.get_float32_matmul_precision(),
            cudnn_deterministic=torch.backends.cudnn.deterministic,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            cublas_workspace_config=os.environ.get(CUBLAS_VARIABLE),
        )

    def apply(self) -> None:
        """Make this process compute as the one :meth:`current` was taken in. The inter-op pool
        can be sized only before its first use; it runs independent ops side by side and never
        changes a result, so a process that used it already keeps its size. cuBLAS's workspace
        variable is set first: a worker applies these before it starts CUDA."""
        if self.cublas_workspace_config is not None:
            os.environ[CUBLAS_VARIABLE] = self.cublas_workspace_config
        torch.set_num_threads(self.num_threads)
        if torch.get_num_interop_threads() != self.num_interop_threads:
            try:
                torch.set_num_interop_threads(self.num_interop_threads)
            except RuntimeError:  # already used: sizes only, results are the same
                pass
        torch.backends.mkldnn.enabled = self.onednn
        torch.use_deterministic_algorithms(
            self.deterministic, warn_only=self.deterministic_warn_only
        )
        torch.set_flush_denormal(self.flush_denormal)
        torch.set_float32_matmul_precision(self.float32_matmul_precision)
        torch.backends.cudnn.deterministic = self.cudnn_deterministic
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
