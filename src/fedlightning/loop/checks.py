"""Start-up checks of loop options that need more than a range: the seed and the accelerator."""

from __future__ import annotations

import torch

from fedlightning.errors import ConfigurationError, require

#: seeds numpy, torch and Lightning's seed_everything all accept
MAX_SEED = 2**32 - 1
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")


def check_seed(seed: object, option: str = "loop.seed") -> None:
    """A seed is an integer in ``[0, 2**32 - 1]`` (Lightning would silently replace any other)."""
    require(
        isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED,
        option,
        seed,
        f"an integer in [0, {MAX_SEED}]",
    )


def check_accelerator(accelerator: str, option: str = "loop.accelerator") -> None:
    """Refuse an unknown accelerator or one this machine does not have."""
    require(accelerator in ACCELERATORS, option, accelerator, f"one of {', '.join(ACCELERATORS)}")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigurationError(
            f"{option}={accelerator!r} but no CUDA GPU is available on this machine "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}): use cpu or auto"
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigurationError(
            f"{option}='mps' but Apple MPS is not available on this machine: use cpu or auto"
        )
