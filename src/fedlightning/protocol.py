"""What travels between the server and a client in one round (pure data, no Lightning, no maths).

The server sends each sampled client a :class:`Payload`; the client answers with an
:class:`Upload`. Algorithms put their own tensors in ``extras``:

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

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

StateDict = dict[str, Tensor]


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
        weights: the trained (sub-)state_dict, on CPU.
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
