"""``loop.personal``: how personalized evaluation scores each client's deployed model
(docs/algorithms.md section 10; the scoring itself: :mod:`fedlightning.loop.personal`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from fedlightning.errors import ConfigurationError, require
from fedlightning.recorded_args import RecordsInitArgs

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule

OPTION = "loop.personal.init_args."
SPLITS = ("auto", "test", "val")


class PersonalEvaluation(RecordsInitArgs):
    """Personalized evaluation: at evaluated rounds, each scored client's deployed model (the
    objective's :meth:`~fedlightning.clients.ClientModule.personal_state`: the global model for a
    global method), optionally fine-tuned on the client's training data, is scored on the client's
    own held-out split; the loop logs ``personal_acc`` (the unweighted mean over the scored
    clients) with ``_weighted``, ``_std``, ``_min``, ``_worst10`` (:mod:`fedlightning.metrics`)
    and ``personal_clients`` (how many were scored). Personalized objectives are scored with the
    defaults when ``loop.personal`` is null; global ones only when it is set.

    Args:
        clients: the clients scored at an evaluation: ``all``, or an integer K: every client when
            there are at most K, otherwise K clients sampled from ``(seed, round)`` afresh at each
            evaluation (the same rule as ``loop.val_clients``, its own draw).
        every: score at the evaluated rounds whose number is a multiple of this (and the last).
        split: the held-out data each client is scored on: ``test`` (its own test split,
            ``data.client_test_fraction``), ``val`` (its validation split) or ``auto`` (``test``
            when the data has one, else ``val``).
        fine_tune_steps: before scoring, train the deployed model this many optimizer steps on
            the client's training batches (the "FedAvg-FT" row of personalized-FL tables; Per-FedAvg
            and FedBABU personalize this way); 0: none.
        fine_tune_epochs: or this many passes over the client's training data (not both).
        fine_tune_lr: the fine-tuning learning rate (null: the objective's ``lr``); the optimizer
            is the objective's (SGD or Adam, its momentum and weight decay), over every parameter.
        save: keep the last evaluation's scored models (fine-tuned) and write them to
            ``personal.pt`` at the end of the run, for re-scoring.
    """

    def __init__(
        self,
        clients: int | Literal["all"] = 100,
        every: int = 1,
        split: Literal["auto", "test", "val"] = "auto",
        fine_tune_steps: int = 0,
        fine_tune_epochs: int = 0,
        fine_tune_lr: float | None = None,
        save: bool = True,
    ) -> None:
        require(
            clients == "all" or (type(clients) is int and clients >= 1),
            OPTION + "clients", clients, "'all' or an integer >= 1",
        )  # fmt: skip
        require(type(every) is int and every >= 1, OPTION + "every", every, "an integer >= 1")
        require(split in SPLITS, OPTION + "split", split, f"one of {', '.join(SPLITS)}")
        for name, value in (("fine_tune_steps", fine_tune_steps),
                            ("fine_tune_epochs", fine_tune_epochs)):  # fmt: skip
            require(type(value) is int and value >= 0, OPTION + name, value, "an integer >= 0")
        if fine_tune_steps and fine_tune_epochs:
            raise ConfigurationError(
                f"{OPTION}fine_tune_steps={fine_tune_steps} and fine_tune_epochs="
                f"{fine_tune_epochs} are both set: give one of them"
            )
        require(
            fine_tune_lr is None or fine_tune_lr > 0,
            OPTION + "fine_tune_lr", fine_tune_lr, "null or a number > 0",
        )  # fmt: skip
        self.clients = clients
        self.every = every
        self.split = split
        self.fine_tune_steps = fine_tune_steps
        self.fine_tune_epochs = fine_tune_epochs
        self.fine_tune_lr = fine_tune_lr
        self.save = save

    @property
    def fine_tunes(self) -> bool:
        return bool(self.fine_tune_steps or self.fine_tune_epochs)

    def scores(self, round_index: int, last: bool) -> bool:
        """Whether the evaluation of 0-based round ``round_index`` scores the clients."""
        return last or (round_index + 1) % self.every == 0

    def split_of(self, datamodule: FederatedDataModule) -> Literal["test", "val"]:
        """The split scored on ``datamodule`` (``auto`` resolved)."""
        if self.split == "auto":
            return "test" if datamodule.has_client_test else "val"
        return self.split  # type: ignore[return-value]


def resolve_personal(
    personal: PersonalEvaluation | None, objective: ClientModule, datamodule: FederatedDataModule
) -> PersonalEvaluation | None:
    """The run's personalized evaluation: ``personal`` as configured; left at null, the defaults
    (with the objective's :meth:`~fedlightning.clients.ClientModule.personal_defaults`) for a
    personalized objective, none for a global one; checked against the data (a one-line
    ConfigurationError naming the option)."""
    if personal is None:
        if not objective.personalized:
            return None
        personal = PersonalEvaluation(**objective.personal_defaults())
    split = personal.split_of(datamodule)
    if split == "test" and not datamodule.has_client_test:
        raise ConfigurationError(
            f"{OPTION}split='test' scores each client's own test split, and the data has none: "
            "set data.client_test_fraction > 0 (e.g. 0.25), or split: val"
        )
    if split == "val" and datamodule.val_fraction == 0 and datamodule.val_from_test == 0:
        raise ConfigurationError(
            f"personalized evaluation of {type(objective).__name__} scores each client's "
            "validation split, and the data has none (data.val_fraction=0): set "
            "data.client_test_fraction > 0 (its own test split) or data.val_fraction > 0"
        )
    return personal


def check_personal(personal: Any) -> PersonalEvaluation | None:
    """``loop.personal`` after checking it is a PersonalEvaluation (or null)."""
    require(
        personal is None or isinstance(personal, PersonalEvaluation),
        "loop.personal", personal, "null or a fedlightning.PersonalEvaluation",
    )  # fmt: skip
    return personal
