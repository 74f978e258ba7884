"""Deterministic algorithms for a run: ``loop.deterministic`` (docs/algorithms.md section 9.1).

The same config and seed give the same bytes on every backend, on the CPU and on the GPU, only if
every kernel that runs is deterministic. ``loop.deterministic`` takes Lightning Trainer's values:

- ``true`` (the default): ``torch.use_deterministic_algorithms(True)``, cuDNN's deterministic
  algorithms (``cudnn.deterministic = True``, ``cudnn.benchmark = False``: no timing-based
  algorithm choice) and cuBLAS's fixed workspace (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which
  cuBLAS reads when its first handle is made, so it is set before CUDA starts:
  :func:`prepare_environment`, called when the loop is built and again in every worker). An op
  without a deterministic implementation stops the run at its first use with one line naming it
  and the two ways on (:func:`determinism_refusal`);
- ``warn``: the same kernels, except that such an op runs (its nondeterministic kernel) with
  torch's warning;
- ``false``: torch's defaults (the fastest kernels, cuDNN's flags as the process has them).

:func:`deterministic_compute` applies the mode for the length of a run (the driver's rounds, each
client fit on every backend, each Ray actor and Flower node through
:class:`~fedlightning.fit.ClientFitter`) and restores the process's settings afterwards.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch

from fedlightning.errors import ConfigurationError, require

log = logging.getLogger("fedlightning")

#: the values ``loop.deterministic`` accepts (Lightning Trainer's)
Deterministic = bool | Literal["warn"]
#: the environment variable cuBLAS reads for its workspace, and the value that makes it repeat
CUBLAS_VARIABLE = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = ":4096:8"
#: what torch says when an op has no deterministic implementation
_TORCH_REFUSAL = " does not have a deterministic implementation"


def check_deterministic(value: object) -> None:
    """Refuse a ``loop.deterministic`` other than ``true``, ``false`` or ``warn``."""
    require(
        isinstance(value, bool) or value == "warn",
        "loop.deterministic", value, "true, false or 'warn'",
    )  # fmt: skip


def prepare_environment(mode: Deterministic) -> None:
    """Set ``CUBLAS_WORKSPACE_CONFIG`` for a deterministic ``mode`` unless the environment has a
    value already (``:16:8`` is deterministic too). Call it before CUDA starts: cuBLAS reads it
    when it makes its first handle; if CUDA is already running, it says so once."""
    if mode is False or os.environ.get(CUBLAS_VARIABLE):
        return
    os.environ[CUBLAS_VARIABLE] = CUBLAS_DETERMINISTIC
    if torch.cuda.is_initialized():
        log.warning(
            "loop.deterministic: CUDA started before %s could be set, so cuBLAS may keep its "
            "default workspace; export %s=%s before starting Python for repeatable GPU results",
            CUBLAS_VARIABLE, CUBLAS_VARIABLE, CUBLAS_DETERMINISTIC,
        )  # fmt: skip


def determinism_refusal(error: BaseException) -> ConfigurationError | None:
    """The one-line refusal of an op torch refused under deterministic algorithms (``None``:
    ``error`` is another error)."""
    text = str(error)
    if not isinstance(error, RuntimeError) or _TORCH_REFUSAL not in text:
        return None
    op = text.split(_TORCH_REFUSAL, 1)[0].strip().splitlines()[-1]
    return ConfigurationError(
        f"loop.deterministic=true: {op} has no deterministic implementation; run with "
        "--loop.deterministic warn (it runs, with a warning, and results may vary in its last "
        "bits) or --loop.deterministic false (torch's fastest kernels, no repeatability)"
    )


@contextmanager
def deterministic_compute(mode: Deterministic) -> Iterator[None]:
    """Run the block with ``mode``'s settings (module docstring) and restore the previous ones;
    an op torch refuses as nondeterministic leaves the block as :func:`determinism_refusal`."""
    cudnn = torch.backends.cudnn
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.deterministic, cudnn.benchmark, os.environ.get(CUBLAS_VARIABLE),
    )  # fmt: skip
    prepare_environment(mode)
    torch.use_deterministic_algorithms(mode is not False, warn_only=mode == "warn")
    if mode is not False:
        cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    except RuntimeError as error:
        refusal = determinism_refusal(error)
        if refusal is None:
            raise
        raise refusal from None
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        cudnn.deterministic, cudnn.benchmark = saved[2], saved[3]
        if saved[4] is None:
            os.environ.pop(CUBLAS_VARIABLE, None)
        else:
            os.environ[CUBLAS_VARIABLE] = saved[4]
