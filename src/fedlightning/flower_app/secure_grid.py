"""One round of the Flower backend under Flower's own SecAgg+ (``SecAggPlusWorkflow`` on the
server, ``secaggplus_mod`` in the ClientApp): no cryptography of ours.

The workflow works on Flower's legacy fit messages inside a ``LegacyContext``: :func:`run` gives it
a strategy whose ``configure_fit`` sends each SuperNode its round's blob (the fit instruction's
one "parameter") and whose ``aggregate_fit`` receives what the workflow unmasked: the mean of the
nodes' vectors (Flower divides the unmasked sum by the number of vectors it summed, since every
node reports a weight of 1 = ``max_weight``) and, per node, the plain part of its reply (the fit
result's metrics). A node that failed or dropped out of the protocol is not among them; Flower
removes its masks (or halts the round when too few shares remain, below
``reconstruction_threshold``).

Imports only the standard library and ``flwr`` (the relay app carries a copy of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import FitIns, Parameters
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key

from fedlightning.flower_app.envelope import PLAIN, STYPE


class _Node(ClientProxy):
    """A SuperNode as the legacy strategy API names it (only its node id is used)."""

    def __init__(self, node_id: int) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id

    def get_properties(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def get_parameters(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def reconnect(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class _Round(Strategy):
    """Hands the workflow each node's blob and keeps what it aggregated."""

    def __init__(self, requests: Sequence[tuple[int, bytes]]) -> None:
        self.requests = requests
        self.aggregate: bytes | None = None
        self.plain: dict[int, bytes] = {}
        self.failures: list[str] = []

    def initialize_parameters(self, client_manager: Any) -> None:
        return None

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return [
            (_Node(node), FitIns(Parameters([blob], STYPE), {})) for node, blob in self.requests
        ]

    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple:
        self.failures = [str(failure) for failure in failures]
        for proxy, fit_res in results:
            self.plain[proxy.node_id] = fit_res.metrics[PLAIN]
        if results:  # every result carries the same aggregated parameters
            self.aggregate = results[0][1].parameters.tensors[0]
        return None, {}  # the backend, not the workflow, updates the model

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return []

    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple:
        return None, {}

    def evaluate(self, server_round: int, parameters: Any) -> None:
        return None


def run(
    grid: Any,
    round_number: int,
    requests: Sequence[tuple[int, bytes]],
    options: dict[str, Any],
    timeout: float,
) -> dict[str, Any]:
    """Run SecAgg+ on ``requests`` (``(node, blob)``; ``options``: ``num_shares``,
    ``reconstruction_threshold``, ``clipping_range``, ``quantization_range``,
    ``modulus_range``). Returns ``aggregate`` (the ``.npy`` bytes of the mean of the summed
    vectors, ``None`` if the round halted), ``contributors`` (how many vectors were summed),
    ``plain`` (per contributing node, its plain part) and ``failures`` (Flower's errors)."""
    strategy = _Round(requests)
    state = RecordDict(
        {
            MAIN_CONFIGS_RECORD: ConfigRecord({Key.CURRENT_ROUND: round_number}),
            MAIN_PARAMS_RECORD: ArrayRecord(),
        }
    )
    context = LegacyContext(
        Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}),
        config=ServerConfig(num_rounds=1), strategy=strategy,
    )  # fmt: skip
    workflow = SecAggPlusWorkflow(
        options["num_shares"], options["reconstruction_threshold"], max_weight=1.0,
        clipping_range=float(options["clipping_range"]),
        quantization_range=int(options["quantization_range"]),
        modulus_range=int(options["modulus_range"]), timeout=timeout,
    )  # fmt: skip
    workflow(grid, context)
    return {
        "aggregate": strategy.aggregate,
        "contributors": len(strategy.plain),
        "plain": strategy.plain,
        "failures": strategy.failures,
    }
