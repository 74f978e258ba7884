"""``loop.backend: auto`` (the default): the cohort path where it applies and is measured faster
(docs/algorithms.md section 9.3).

The choice, made once at start-up and printed in one line (``backend: auto chose ...``):

1. :meth:`AutoBackend.check`: :class:`CohortBackend` is a candidate when its ``check`` accepts the
   objective, optimizer, precision and network; otherwise :class:`SequentialBackend`, with the
   cohort's refusal as the reason.
2. :meth:`AutoBackend.decide`, once the data is set up and before the run's identity is computed:
   a resumed run keeps the path its checkpoint records (``backend_results``), so that it computes
   what the straight run computed. Otherwise :func:`~fedlightning.backends.auto_probe.measure`
   times a step of the round's clients both ways on the run's network, device, precision and
   batch shape (cached for the process per model, device, precision, batch shape and clients), and
   the cohort is chosen only when its step takes at most :data:`MARGIN` times the sequential
   one's (0.8 on an accelerator, 0.5 on the CPU). A closer call keeps the sequential path: it is
   the bitwise reference of every other backend, and timings that close flip with the machine's
   load, which would make two runs of one config take different floating-point paths. Both times
   are printed with the choice.

On the CPU, whose cores are often shared, a vmapped convolution runs about as fast as the same
convolutions one after another (the quickstart's CNN: within 20% either way on this project's
machine), so the measurement keeps the sequential path for the library's models; a cohort must be
twice as fast there (many clients of a tiny network). The choice is recorded in the run's identity
and checkpoints; a fixed ``loop.backend`` gives the same path, and so the same bits, on every
machine.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedlightning.backends.auto_probe import Timing, measure
from fedlightning.backends.base import Backend, ClientDone, RoundResults
from fedlightning.backends.cohort import CohortBackend
from fedlightning.backends.cohort_checks import CohortRefusal
from fedlightning.backends.sequential import SequentialBackend
from fedlightning.determinism import deterministic_compute
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.training import cpu_compute

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.compute import Compute
    from fedlightning.data.datamodule import FederatedDataModule

log = logging.getLogger("fedlightning")

#: the cohort is chosen when its measured step takes at most this fraction of the sequential
#: one's, by device type (timings on shared CPU cores are noisier)
MARGIN = {"cpu": 0.5}
DEFAULT_MARGIN = 0.8
#: the measurements of this process, per model, device, precision, batch shape and clients
_MEASURED: dict[tuple, Timing] = {}


class AutoBackend(Backend):
    """Chooses :class:`CohortBackend` or :class:`SequentialBackend` (see the module docstring)
    and delegates to it; ``chosen`` is the backend in use once :meth:`decide` ran."""

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
            self.chosen = self.candidate if recorded == "cohort" else SequentialBackend()
            self.reason = "the path the resumed checkpoint's rounds took"
            return
        try:
            timing = self._measure(model, datamodule, config, compute, clients_per_round)
        except ConfigurationError:
            raise
        except Exception as error:  # noqa: BLE001 (the reference path when nothing measures)
            self._sequential(f"the probe could not time the cohort: {_one_line(error)}")
            return
        margin = MARGIN.get(compute.device.type, DEFAULT_MARGIN)
        faster = timing.cohort <= margin * timing.sequential
        self.chosen = self.candidate if faster else SequentialBackend()
        self.reason = (
            f"measured one step of {timing.clients} clients on {compute.device.type}: "
            f"cohort {timing.cohort * 1e3:.3g} ms, sequential {timing.sequential * 1e3:.3g} ms"
        )

    def _measure(self, model, datamodule, config, compute, clients_per_round) -> Timing:
        """The cached or new measurement for the round's clients per architecture group."""
        keys = model.client_key_sets(datamodule.num_clients)
        groups = len({k.group for k in keys}) if keys else 1
        clients = max(1, -(-clients_per_round // groups))
        x, y = next(iter(datamodule.client_train_dataloader(0, config.seed)))
        key = (
            type(model).__qualname__, tuple((n, tuple(p.shape)) for n, p in model.named_parameters()),
            str(compute.device), compute.precision, tuple(x.shape), x.dtype, clients,
            config.deterministic,
        )  # fmt: skip
        if key not in _MEASURED:
            batch = (x.to(compute.device), y.to(compute.device))
            # under the run's own settings (threads, oneDNN, deterministic kernels)
            with cpu_compute(config.num_threads, config.onednn):
                with deterministic_compute(config.deterministic):
                    _MEASURED[key] = measure(model, batch, clients, compute)
        timing = _MEASURED[key]
        return Timing(clients_per_round, timing.sequential * groups, timing.cohort * groups)

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
        some options; :class:`~fedlightning.backends.cohort_checks.CohortRefusal`) refuses before
        any training, and a client whose fit raises inside the cohort fails the clients it trains
        with: in both cases the run goes on sequentially from this round (where a failed client is
        that client's failure, for the loop's failure policy), saying why once."""
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
