"""The FederatedLoop's own arguments checked when it is constructed: a bad value is a
ConfigurationError naming the option before anything is read, trained or written (the others, the
aggregator's and the backend's, are checked where they are used, at start-up:
:mod:`fedlightning.loop.startup`)."""

from __future__ import annotations

from typing import Any

from fedlightning.attacks.base import Attack
from fedlightning.backends.base import Backend
from fedlightning.compute import PRECISIONS
from fedlightning.determinism import check_deterministic
from fedlightning.errors import require
from fedlightning.loop.checks import check_seed
from fedlightning.loop.personal_options import PersonalEvaluation
from fedlightning.loop.sampling import SAMPLINGS
from fedlightning.privacy.dp_sgd import DPSGD


def check_arguments(
    *,
    rounds: int,
    clients_per_round: int | float,
    local_epochs: int,
    local_steps: int | None,
    backend: Any,
    precision: str,
    devices: int,
    seed: int,
    eval_every: int,
    val_clients: int | str,
    run_dir: str | None,
    checkpoint_every: int,
    min_clients: int,
    on_round_failure: str,
    client_state: str,
    fit_with: str,
    gradient_clip_val: float | None,
    gradient_clip_algorithm: str,
    num_threads: int | None,
    log_every: int,
    max_skipped_fraction: float,
    target_acc: float | None,
    attack: Any,
    client_sampling: str,
    dp_sgd: Any,
    deterministic: Any,
    personal: Any = None,
    **_: Any,
) -> None:
    """Check the FederatedLoop's arguments (the others are checked where they are used).

    One ``require`` per option, in a flat list: longer than 60 lines because the loop has that
    many options, and split it would only scatter them."""
    check_seed(seed)
    require(
        personal is None or isinstance(personal, PersonalEvaluation),
        "loop.personal", personal, "null or a fedlightning.PersonalEvaluation",
    )  # fmt: skip
    check_deterministic(deterministic)
    require(
        client_sampling in SAMPLINGS,
        "loop.client_sampling", client_sampling, f"one of {', '.join(SAMPLINGS)}",
    )  # fmt: skip
    require(
        dp_sgd is None or isinstance(dp_sgd, DPSGD),
        "loop.dp_sgd", dp_sgd, "null or a fedlightning.privacy.DPSGD",
    )  # fmt: skip
    require(
        run_dir is None or bool(str(run_dir).strip()),
        "loop.run_dir", run_dir, "a directory path (an empty one would write into the current folder)",
    )  # fmt: skip
    require(log_every >= 1, "loop.log_every", log_every, "an integer >= 1")
    require(
        0 <= max_skipped_fraction <= 1,
        "loop.max_skipped_fraction", max_skipped_fraction, "a number in [0, 1]",
    )  # fmt: skip
    require(rounds >= 1, "loop.rounds", rounds, "an integer >= 1")
    require(
        clients_per_round > 0 and (isinstance(clients_per_round, int) or clients_per_round <= 1),
        "loop.clients_per_round", clients_per_round, "an integer >= 1 or a fraction in (0, 1]",
    )  # fmt: skip
    require(local_epochs >= 1, "loop.local_epochs", local_epochs, "an integer >= 1")
    require(
        local_steps is None or local_steps >= 1,
        "loop.local_steps", local_steps, "null or an integer >= 1",
    )  # fmt: skip
    require(precision in PRECISIONS, "loop.precision", precision, f"one of {', '.join(PRECISIONS)}")
    require(devices == 1, "loop.devices", devices, "1 (each client fit uses one device)")
    require(eval_every >= 1, "loop.eval_every", eval_every, "an integer >= 1")
    require(
        val_clients == "all" or (type(val_clients) is int and val_clients >= 1),
        "loop.val_clients", val_clients, "'all' or an integer >= 1",
    )  # fmt: skip
    require(checkpoint_every >= 1, "loop.checkpoint_every", checkpoint_every, "an integer >= 1")
    require(min_clients >= 1, "loop.min_clients", min_clients, "an integer >= 1")
    require(
        on_round_failure in ("skip", "stop"),
        "loop.on_round_failure", on_round_failure, "'skip' or 'stop'",
    )  # fmt: skip
    require(
        client_state in ("memory", "disk"),
        "loop.client_state",
        client_state,
        "'memory' or 'disk'",
    )
    require(fit_with in ("auto", "trainer"), "loop.fit_with", fit_with, "'auto' or 'trainer'")
    require(
        gradient_clip_val is None or gradient_clip_val > 0,
        "loop.gradient_clip_val", gradient_clip_val, "null or a number > 0",
    )  # fmt: skip
    require(
        gradient_clip_algorithm in ("norm", "value"),
        "loop.gradient_clip_algorithm", gradient_clip_algorithm, "'norm' or 'value'",
    )  # fmt: skip
    require(
        num_threads is None or num_threads >= 1,
        "loop.num_threads", num_threads, "null or an integer >= 1",
    )  # fmt: skip
    require(
        target_acc is None or 0.0 < target_acc <= 1.0,
        "loop.target_acc", target_acc, "null or an accuracy in (0, 1]",
    )  # fmt: skip
    require(
        backend is None or isinstance(backend, Backend),
        "loop.backend", backend, "a Backend (AutoBackend, SequentialBackend, CohortBackend, RayBackend)",
    )  # fmt: skip
    require(
        attack is None or isinstance(attack, Attack),
        "loop.attack", attack, "null or an Attack (fedlightning.attacks: LabelFlip, SignFlip, ...)",
    )  # fmt: skip
