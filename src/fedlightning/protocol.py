"""What travels between the server and a client in one round (pure data, no Lightning, no maths).

The server sends each sampled client a :class:`Payload`; the client answers with an
:class:`Upload`. A backend receives a round's work as :class:`ClientJob` objects and answers with a
:class:`FitResult` (or the exception) per client; :class:`FitConfig` is how every client fit of a
run is done. Algorithms put their own tensors in ``extras``:

=============  =============================================  ==========================================
algorithm      payload extras                                 upload extras
=============  =============================================  ==========================================
FedAvg         -                                              -
SCAFFOLD       ``c`` (server control variate)                 ``delta_c`` (c_i+ - c_i)
FedNova        -                                              ``a`` (normalising factor a_i)
FedCross       ``model_index`` in :attr:`Payload.model_index`  -
client groups  sub-state_dict of the group's keys             the same keys in :attr:`Upload.weights`
=============  =============================================  ==========================================

Client objectives and aggregators declare the extras they need and give
(``required_payload_extras``/``payload_extras`` and ``required_upload_extras``/``upload_extras``),
and the loop checks that a pairing fits before any training starts.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
from torch import Tensor

StateDict = dict[str, Tensor]


class ClientKeys(NamedTuple):
    """What one client trains when clients own different architectures: its group's name (e.g.
    ``"resnet10"``) and the state_dict keys of that architecture (a subset of the server's)."""

    group: str
    keys: frozenset[str]


@dataclass
class Payload:
    """The server's message to one client for one round.

    Attributes:
        weights: the (sub-)state_dict the client starts from. Shared between clients and never
            modified by a client: clients copy it into their own model.
        extras: algorithm-specific tensors or numbers (e.g. SCAFFOLD's ``c``).
        model_index: which of the server's models this is (FedCross's middleware index; 0 otherwise).
    """

    weights: StateDict
    extras: dict[str, Any] = field(default_factory=dict)
    model_index: int = 0


@dataclass
class Upload:
    """One client's answer after local training.

    Attributes:
        client_id: the client's index in ``[0, num_clients)``.
        weights: the trained (sub-)state_dict, on the fitting device (in-process backends) or on
            the CPU (off a process boundary); the loop moves it onto the server device.
        num_samples: n_i, the client's number of training samples.
        num_steps: the optimizer steps actually taken (K_i / tau_i).
        extras: algorithm-specific values (e.g. SCAFFOLD's ``delta_c``).
        model_index: copied from the payload.
        metrics: local training metrics (e.g. ``train_loss``) for logging.
    """

    client_id: int
    weights: StateDict
    num_samples: int
    num_steps: int
    extras: dict[str, Any] = field(default_factory=dict)
    model_index: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ClientJob:
    """One client's fit in one round, as the loop hands it to a backend.

    Attributes:
        round_index: the 0-based round.
        client_id: the client's index in ``[0, num_clients)``.
        payload: what the server sends this client.
        state: the client's persistent state (from the ClientStore; ``{}`` before its first fit).
        max_steps: a step budget: the fit stops after this many optimizer steps, before its
            ``local_epochs`` or ``local_steps`` are done (a straggler's partial work by a
            deadline, docs/algorithms.md section 6.3); None: no budget.
    """

    round_index: int
    client_id: int
    payload: Payload
    state: dict[str, Any]
    max_steps: int | None = None


@dataclass
class FitResult:
    """What one client fit produced: the upload for the server and the client's new state."""

    upload: Upload
    state: dict[str, Any]


@dataclass(frozen=True)
class FitConfig:
    """How every client fit of a run is done (the loop's options that reach a backend).

    Attributes:
        local_epochs: passes over the client's data (ignored when ``local_steps`` is set).
        local_steps: if set, exactly this many optimizer steps (new passes as needed).
        precision: Lightning precision (``32-true``, ``bf16-mixed``, ``16-mixed``, ``64-true``...).
        accelerator: Lightning accelerator (``auto``, ``cpu``, ``gpu``, ``cuda``...).
        seed: the run's seed; client ``i``'s fit in round ``r`` is seeded from ``(seed, r, i)``.
        gradient_clip_val: clip gradients to this norm (or value); ``None``: no clipping.
        gradient_clip_algorithm: ``norm`` (total L2 norm) or ``value`` (element-wise).
        fit_with: ``auto`` (Lightning Fabric unless the objective needs the Trainer) or ``trainer``
            (a lean Lightning Trainer for every fit).
        num_threads: torch intra-op threads (``None``: torch's default).
        onednn: use oneDNN CPU kernels.
        label_flip_clients: the clients whose fits train on flipped labels ``y -> C - 1 - y`` (a
            :class:`fedlightning.attacks.LabelFlip` attack, resolved at start-up; it travels
            with the config so that every backend's workers apply it).
        dp_sgd: DP-SGD's options as plain data (``loop.dp_sgd``,
            :meth:`fedlightning.privacy.DPSGD.settings`); ``None``: no sample-level DP.
        deterministic: ``loop.deterministic`` (``True``, ``False`` or ``"warn"``), applied around
            every fit (:mod:`fedlightning.determinism`), in every worker too.
    """

    local_epochs: int = 1
    local_steps: int | None = None
    precision: str = "32-true"
    accelerator: str = "auto"
    seed: int = 0
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: Literal["norm", "value"] = "norm"
    fit_with: Literal["auto", "trainer"] = "auto"
    num_threads: int | None = None
    onednn: bool = False
    dp_sgd: dict[str, Any] | None = None
    label_flip_clients: tuple[int, ...] = ()
    deterministic: bool | Literal["warn"] = True

    def __post_init__(self) -> None:
        # a config read back from JSON (the Flower wire) holds a list: one type, hashable
        object.__setattr__(self, "label_flip_clients", tuple(self.label_flip_clients))


def nbytes(value: Any) -> int:
    """Bytes of ``value`` on the wire: tensors and arrays by ``nbytes``, containers summed, numbers
    8, strings their UTF-8 length, anything else its pickled size."""
    if isinstance(value, Tensor):
        return int(value.nbytes)
    if isinstance(value, Mapping):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(nbytes(v) for v in value)
    if isinstance(value, bool | int | float):
        return 8
    if isinstance(value, str):
        return len(value.encode())
    if value is None:
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    return len(pickle.dumps(value))


def message_bytes(message: Payload | Upload) -> int:
    """``sum nbytes(weights) + sum nbytes(extras)`` of one payload or upload."""
    return nbytes(message.weights) + nbytes(message.extras)
