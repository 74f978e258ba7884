"""``loop.backend: auto`` (the default): the path a device kind's rule names, the same on every
machine of that kind whatever its load (docs/algorithms.md section 9.3).

The choice, made once at start-up and printed in one line (``backend: auto chose ...``):

1. :meth:`AutoBackend.check`: :class:`CohortBackend` is a candidate when its ``check`` accepts the
   objective, optimizer, precision and network; otherwise :class:`SequentialBackend`, with the
   cohort's refusal as the reason.
2. :meth:`AutoBackend.decide`, before the run's identity is computed: a resumed run takes the path
   its checkpoint's last rounds took (``backend_results``), so that it computes what the straight
   run computed. Otherwise the rule of the run's device type, :data:`RULE`: on the CPU the
   sequential path (at one intra-op thread per fit the cohort took 1.4 to 1.9 times as long on
   the shipped configs, and as long on the ResNets: ``benchmarks/defaults.py``), on an
   accelerator the cohort (the clients' arithmetic in one kernel per operation, where a small
   model's sequential fits are bound by kernel launches).

No timing decides: a choice by a timing taken at start-up flips with the machine's load, and two
runs of one config would then take different floating-point paths. The path is part of the run's
identity and of its checkpoints (after a fallback, the sequential one), and the run summary names
it (:mod:`fedlightning.loop.components.run_path`). A fixed ``loop.backend`` gives the same path on
every machine.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedlightning.backends.base import Backend, ClientDone, RoundResults
from fedlightning.backends.cohort import CohortBackend
from fedlightning.backends.cohort.checks import CohortRefusal
from fedlightning.backends.sequential import SequentialBackend
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import ClientJob, FitConfig

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.compute import Compute
    from fedlightning.data.datamodule import FederatedDataModule

log = logging.getLogger("fedlightning")

#: the path ``auto`` takes where the cohort can train the run, by device type, and why (any
#: device type not listed: :data:`ACCELERATOR_RULE`); docs/algorithms.md section 9.3
RULE = {"cpu": ("sequential", "the rule of docs/algorithms.md section 9.3 for the CPU")}
ACCELERATOR_RULE = ("cohort", "the rule of docs/algorithms.md section 9.3 for an accelerator")


class AutoBackend(Backend):
    """Chooses :class:`CohortBackend` or :class:`SequentialBackend` (see the module docstring)
    and delegates to it; ``chosen`` is the backend in use once :meth:`decide` ran, ``reason``
    says why."""

    def __init__(self) -> None:
        self.chosen: Backend | None = None
        self.candidate: Backend | None = None
        self.reason = ""
        self._started: tuple[Any, ...] = ()  # start()'s arguments, for a fallback

    def check(self, model: ClientModule, config: FitConfig, compute: Compute) -> None:
        cohort = CohortBackend()
        try:
            cohort.check(model, config, compute)
        except ConfigurationError as refusal:
            self._sequential(str(refusal).split(": ", 1)[-1].split(";")[0])
            return
        except Exception as error:  # noqa: BLE001 (e.g. an optimizer built from per-client state)
            self._sequential(f"the cohort's check could not run: {_one_line(error)}")
            return
        self.candidate, self.chosen = cohort, None

    def _sequential(self, reason: str) -> None:
        self.chosen = self.candidate = SequentialBackend()
        self.reason = reason

    def decide(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig,
        compute: Compute, clients_per_round: int, recorded: Any = None,
    ) -> None:  # fmt: skip
        if self.candidate is None:
            self.check(model, config, compute)
        if self.chosen is not None:  # the cohort cannot train this run
            return
        if recorded in ("sequential", "cohort"):
            path = recorded
            self.reason = "the path the resumed checkpoint's last rounds took"
        else:
            path, self.reason = RULE.get(compute.device.type, ACCELERATOR_RULE)
        self.chosen = self.candidate if path == "cohort" else SequentialBackend()

    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig,
        compute: Compute, on_client_done: ClientDone | None = None,
    ) -> None:  # fmt: skip
        if self.chosen is None:
            raise ConfigurationError("AutoBackend.start: decide() chooses the backend first")
        # said once the run starts (every start-up check passed): a refused run prints its error only
        message = f"backend: auto chose {type(self.chosen).__name__} ({self.reason})"
        log.info(message)
        print(message, file=sys.stderr)  # the run's console line, beside the loop's done line
        self._started = (model, datamodule, config, compute, on_client_done)
        self.chosen.start(*self._started)

    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        """The chosen backend's round. A cohort that finds, when the clients' round begins, that
        it cannot train them together (per-client parameters, e.g. FML's personal models under
        some options; :class:`~fedlightning.backends.cohort.checks.CohortRefusal`) refuses before
        any training, and a client whose fit raises inside the cohort fails the clients it trains
        with: in both cases the run goes on sequentially from this round (where a failed client is
        that client's failure, for the loop's failure policy), saying why once. The checkpoints
        written from then on record the sequential path, which a resume takes."""
        assert self.chosen is not None, "start() first"
        try:
            return self.chosen.run(round_index, jobs)
        except CohortRefusal as refusal:
            if not isinstance(self.chosen, CohortBackend):
                raise
            reason = str(refusal).removeprefix("loop.backend=CohortBackend cannot train ")
        except (ConfigurationError, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 (a client's failure, which the cohort shares)
            if not isinstance(self.chosen, CohortBackend):
                raise
            reason = (
                f"a client's fit raised {_one_line(error)} inside the cohort, which trains its "
                "clients together; sequentially a failed client is that client's failure"
            )
        return self._fall_back(reason, round_index, jobs)

    def _fall_back(self, reason: str, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        """The rest of the run, this round included, on the sequential backend, said once."""
        assert self.chosen is not None
        self.chosen.stop()
        self._sequential(reason)
        message = f"backend: auto falls back to SequentialBackend ({self.reason})"
        log.info(message)
        print(message, file=sys.stderr)
        self.chosen.start(*self._started)
        return self.chosen.run(round_index, jobs)

    def stop(self) -> None:
        if self.chosen is not None:
            self.chosen.stop()


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160]}" if text else type(error).__name__
