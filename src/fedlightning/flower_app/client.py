"""What a SuperNode does with fedlightning's messages: :func:`query_reply` and
:func:`train_reply`, run by the node's warm worker (:mod:`fedlightning.flower_app.worker`, which
the ClientApp of every app fedlightning writes forwards to).

A SuperNode serves the clients its node config names (``flower-supernode --node-config ...``):

- ``client-ids="0,3,5"``: exactly these client ids; or
- ``partition-id=P num-partitions=N``: the client ids ``c`` with ``c % N == P`` (Flower's usual
  keys: node ``P`` of ``N`` serves every ``N``-th client);
- neither: every client.

Optional ``data-root="/path"`` replaces the data module's ``root`` (where this node's data lives).

A ``query`` asks which of ``num_clients`` client ids the node serves; a ``train`` message carries
the :class:`~fedlightning.protocol.ClientJob` s of one round that this node serves, as one wire
blob (:mod:`fedlightning.flower_app.records`). The node builds the client module and the data
module once from the spec (class paths and init args, the server's own; the node's ``data-root``
applied) and fits the clients one after another with :class:`~fedlightning.fit.ClientFitter`,
exactly as the sequential backend does; the reply holds each client's upload, or its fit's
exception and traceback (one client's failure leaves the others' fits alone). Under secure
aggregation (a ``secure`` plan in the blob) the reply is the SecAgg+ vector and its plain part
instead (:func:`fedlightning.flower_app.secure.node_vector`).
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from fedlightning.flower_app.records import read_jobs, results_blob
from fedlightning.flower_app.specs import instantiate
from fedlightning.flower_app.wire import encode
from fedlightning.protocol import ClientJob, FitConfig, FitResult

#: per process: (spec, data-root) -> (model, data module); fit config -> fitter
_BUILT: dict[str, Any] = {}


def served_clients(node_config: dict[str, Any], num_clients: int) -> list[int]:
    """The client ids in ``[0, num_clients)`` a node with ``node_config`` serves (module docstring)."""
    if "client-ids" in node_config:
        ids = [int(x) for x in str(node_config["client-ids"]).replace(" ", "").split(",") if x]
        return [c for c in ids if 0 <= c < num_clients]
    if "partition-id" in node_config and "num-partitions" in node_config:
        part, parts = int(node_config["partition-id"]), int(node_config["num-partitions"])
        return [c for c in range(num_clients) if c % parts == part]
    return list(range(num_clients))


def _objects(spec: dict[str, Any], node_config: dict[str, Any], config: FitConfig):
    from fedlightning.fit import ClientFitter

    data_spec = json.loads(json.dumps(spec["data"]))
    if "data-root" in node_config:
        data_spec["init_args"]["root"] = str(node_config["data-root"])
    key = json.dumps([spec["model"], data_spec], sort_keys=True)
    if _BUILT.get("key") != key:
        model = instantiate(spec["model"])
        datamodule = instantiate(data_spec)
        datamodule.setup("fit")
        model.prepare_clients(datamodule)
        _BUILT.clear()
        _BUILT.update(key=key, model=model, dm=datamodule, placed=None)
    if _BUILT.get("config") != config:
        _BUILT.update(config=config, fitter=ClientFitter(config))
    fitter = _BUILT["fitter"]
    if _BUILT["placed"] != str(fitter.device):
        _BUILT["dm"].place_training_data(fitter.device)
        _BUILT["placed"] = str(fitter.device)
    return _BUILT["model"], _BUILT["dm"], fitter


def query_reply(num_clients: int, node_config: dict[str, Any]) -> list[int]:
    """The reply to a ``query``: the client ids this node serves."""
    return served_clients(node_config, num_clients)


def fit_jobs(
    jobs: list[ClientJob], config: FitConfig, spec: dict[str, Any], node_config: dict[str, Any]
) -> dict[int, FitResult | tuple[BaseException, str]]:
    """Fit every job's client, in order; per client its result or ``(exception, traceback)``."""
    from fedlightning.training import cpu_compute, quiet_lightning

    outcomes: dict[int, FitResult | tuple[BaseException, str]] = {}
    for job in jobs:
        try:
            num_clients = int(spec["data"]["init_args"].get("num_clients", job.client_id + 1))
            if job.client_id not in served_clients(node_config, num_clients):
                raise LookupError(f"this SuperNode does not serve client {job.client_id}")
            with cpu_compute(config.num_threads, config.onednn), quiet_lightning():
                model, datamodule, fitter = _objects(spec, node_config, config)
                outcomes[job.client_id] = fitter.fit(model, datamodule, job)
        except Exception as error:  # noqa: BLE001  (the server's failure policy decides)
            outcomes[job.client_id] = (error, traceback.format_exc())
    return outcomes


def train_reply(blob: bytes, node_config: dict[str, Any]) -> list[bytes]:
    """The reply to a ``train`` message: ``[results blob]`` (plain), or ``[plain part blob,
    SecAgg+ vector]`` when the message carries a secure plan."""
    from fedlightning.flower_app.secure import node_vector

    jobs, config, spec, secure = read_jobs(blob)
    outcomes = fit_jobs(jobs, config, spec, node_config)
    if secure is None:
        return [results_blob(outcomes)]
    plain, vector = node_vector(jobs, outcomes, secure)
    return [encode(plain), vector]
