"""The CPU kernel family the test suite computes with, on every x86-64 machine.

A float32 result depends on which SIMD kernels add its partial sums: torch's own vectorized
kernels (ATen dispatches AVX2 or AVX-512 code by the CPU), MKL's BLAS (which picks a code path by
the CPU's vendor and instruction set: an Intel AVX-512 machine and an AMD AVX2 one run different
GEMM kernels) and oneDNN's JIT. A sha256 pinned on one machine fails on another with no code
change. Each of the three has a documented switch that fixes its family:

- ``ATEN_CPU_CAPABILITY=avx2``: ATen's AVX2 kernels, which every x86-64 machine CI may run on
  has (AVX-512 machines included);
- ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility branch that gives the same
  results on Intel and non-Intel processors (Intel's MKL developer reference, "Obtaining
  Numerically Reproducible Results");
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's JIT capped at AVX2 (the library runs with oneDNN off by
  default, ``loop.onednn``; a test that turns it on computes in the same family).

Each is read when its library first computes, so :func:`pin` runs before ``import torch``
(``tests/conftest.py`` calls it first thing; child processes inherit the environment). The pinned
hashes of ``tests/test_bitwise_configs.py`` and ``tests/test_statistic_bitwise.py`` were recorded
under exactly these settings: their ``RECORDED_UNDER`` is this module's :data:`KERNELS`, and
``tests/test_pinned_kernels.py`` checks that the session, a child process and both recordings agree.

numpy's SIMD dispatch (used by the privacy accountant's FFTs) is not pinned: an epsilon is a
numerical approximation whose last bits carry no meaning, and the metrics hashes round it to
:data:`ACCOUNTANT_DIGITS` significant digits instead.
"""

from __future__ import annotations

import os

#: environment variable -> value, set before torch loads (see the module docstring)
KERNELS: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
#: what ``torch.backends.cpu.get_cpu_capability()`` reports under :data:`KERNELS`
CAPABILITY = "AVX2"
#: significant digits kept of the accountant's columns (``dp_*``) in a pinned metrics hash:
#: computed in numpy, they move by about 1e-15 relative between AVX2 and AVX-512 machines
ACCOUNTANT_DIGITS = 10


def pin() -> None:
    """Set :data:`KERNELS` in this process's environment, whatever the caller's shell said: a
    pinned hash compares with a recording made under these values only."""
    os.environ.update(KERNELS)


def comparable(column: str, value: str) -> str:
    """A logged metric as a pinned metrics hash takes it: the accountant's columns (``dp_*``,
    numpy-computed) at :data:`ACCOUNTANT_DIGITS` significant digits, every other column as
    logged (torch-computed under the pinned kernels, so bit for bit)."""
    if column.startswith("dp_") and value:
        return f"{float(value):.{ACCOUNTANT_DIGITS}g}"
    return value
