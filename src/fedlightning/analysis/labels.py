"""Words for figures: axis labels of ``metrics.csv`` columns and a run's title (algorithm, data set,
partition), so that a figure goes into a paper without hand edits.

:func:`axis` names a column and the factor its values are drawn with (bytes are drawn in MB; an
epsilon carries its delta); :func:`describe` reads a run's ``config.yaml`` as written by
``fedlightning fit`` or the Python API.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: the label of a column, by name (a ``<group>/test_acc`` column: the group's name + the label)
LABELS: dict[str, str] = {
    "round": "Round",
    "test_acc": "Test accuracy",
    "test_loss": "Test loss",
    "val_acc": "Validation accuracy (global model)",
    "val_acc_weighted": "Validation accuracy (sample-weighted)",
    "val_acc_std": "Validation accuracy, std over clients",
    "val_acc_min": "Validation accuracy, worst client",
    "val_acc_worst10": "Validation accuracy, worst 10% of clients",
    # the clients' own loss in their local fits (the objective's, e.g. with FedProx's term),
    # averaged over the round's clients: not the global model's loss on training data
    "train_loss": "Local training loss (mean over clients)",
    "personal_acc": "Validation accuracy (personal models)",
    "personal_train_loss": "Personal models' local training loss",
    "adaptor_acc": "Adaptor accuracy",
    "group_mean_acc": "Mean test accuracy over architectures",
    "clients_failed": "Failed clients",
    "clients_rejected": "Rejected uploads",
    "malicious_uploads": "Malicious uploads",
    "round_time_s": "Round time (s)",
    "comm_sent_bytes": "Communication sent per round (MB)",
    "comm_received_bytes": "Communication received per round (MB)",
    "comm_sent_total": "Communication sent (MB)",
    "comm_received_total": "Communication received (MB)",
    "dp_noise_multiplier": "Noise multiplier",
    "virtual_time": "Virtual time (s)",
    "staleness_mean": "Mean staleness (server updates)",
    "staleness_max": "Largest staleness (server updates)",
}
#: columns counted in bytes, drawn in megabytes (10^6 bytes)
BYTES = ("comm_sent_bytes", "comm_received_bytes", "comm_sent_total", "comm_received_total")
#: epsilon columns and the column of the delta they are spent at
EPSILONS = {
    "dp_epsilon": "dp_delta",
    "dp_sgd_epsilon_max": "dp_sgd_delta",
    "dp_sgd_epsilon_mean": "dp_sgd_delta",
}


def _first_finite(values: np.ndarray | None) -> float | None:
    if values is None:
        return None
    finite = values[np.isfinite(values)]
    return float(finite[0]) if finite.size else None


def axis(column: str, metrics: dict[str, np.ndarray] | None = None) -> tuple[str, float]:
    """``(label, scale)`` of a ``metrics.csv`` column: values are drawn multiplied by ``scale``.
    An epsilon's label carries the delta logged beside it (``ε (δ = 1e-05)``); a column without a
    label of its own is named by itself."""
    group, _, name = column.rpartition("/")
    if name in EPSILONS:
        delta = _first_finite((metrics or {}).get(EPSILONS[name]))
        prefix = {"dp_sgd_epsilon_max": "max. ", "dp_sgd_epsilon_mean": "mean "}.get(name, "")
        spent = f"{prefix}ε" + (f" (δ = {delta:.0e})" if delta is not None else "")
        return spent if not group else f"{group}: {spent}", 1.0
    label = LABELS.get(name, name)
    if group:
        label = f"{group}: {label[0].lower()}{label[1:]}"
    return label, (1e-6 if name in BYTES else 1.0)


def label(column: str, metrics: dict[str, np.ndarray] | None = None) -> str:
    """The label of a ``metrics.csv`` column (:func:`axis`)."""
    return axis(column, metrics)[0]


@dataclass(frozen=True)
class RunDescription:
    """What a figure's title says about a run."""

    algorithm: str
    data: str
    partition: str
    clients: str

    def title(self) -> str:
        """``FedAvg · digits, Dirichlet (β = 0.5), 20 clients``."""
        return f"{self.algorithm} · {self.setting()}"

    def setting(self) -> str:
        """The data set, its partition and the number of clients."""
        return ", ".join(part for part in (self.data, self.partition, self.clients) if part)


#: the package of the asynchronous servers (docs/algorithms.md section 6.4), round components
ASYNCHRONOUS = "fedlightning.asynchronous."


def _class_name(node: Any, default: str) -> str:
    if isinstance(node, dict) and "class_path" in node:
        return str(node["class_path"]).rsplit(".", 1)[-1]
    return default if node is None else str(node).rsplit(".", 1)[-1]


def algorithm_name(model: Any, aggregator: Any, components: Any = None) -> str:
    """The algorithm a client objective, an aggregator and the round components make: the
    objective's name where the server averages (``FedProx``, ``MOON``, ``FML``), the aggregator's
    where the clients are plain (``FedAvgM``, ``FedCross``, ``InCo``), one name where they pair
    (``ScaffoldClient`` with ``Scaffold``: ``Scaffold``), both otherwise (``FedProx + FedAvgM``).
    An asynchronous server among the components (``fedlightning.asynchronous``: FedBuff,
    FedAsync) is the server: ``FedBuff``, ``FedProx + FedBuff``, ``FedBuff + FedAdam``."""
    objective = _class_name(model, "ClientModule")
    server = _class_name(aggregator, "FedAvg")
    asynchronous = [
        _class_name(c, "") for c in components or ()
        if isinstance(c, dict) and str(c.get("class_path", "")).startswith(ASYNCHRONOUS)
    ]  # fmt: skip
    if asynchronous:
        server = asynchronous[0] if server == "FedAvg" else f"{asynchronous[0]} + {server}"
    if objective == "ClientModule":
        return server
    short = objective.removesuffix("Client")
    if server == "FedAvg":
        return short
    return server if short == server else f"{short} + {server}"


def _data_name(data: dict[str, Any]) -> str:
    dataset = str(data.get("dataset", "digits"))
    if dataset != "huggingface":
        return dataset
    options = data.get("source_options") or {}
    path = str(options.get("path") or data.get("root") or "huggingface").rstrip("/")
    return Path(path).name or path


def _partition_name(data: dict[str, Any]) -> str:
    partition = str(data.get("partition", "dirichlet"))
    if partition == "iid":
        return "IID"
    if partition == "dirichlet":
        return f"Dirichlet (β = {data.get('beta', 0.5):g})"
    if partition == "shards":
        return f"{data.get('shards_per_client', 2)} label shards per client"
    if partition == "natural":
        return "natural (one client per user)"
    options = ", ".join(f"{k} = {v}" for k, v in (data.get("partition_options") or {}).items())
    return f"{partition} ({options})" if options else partition


def describe(config: dict[str, Any]) -> RunDescription:
    """The :class:`RunDescription` of a run's config (a ``config.yaml`` mapping)."""
    loop, data = config.get("loop") or {}, config.get("data") or {}
    if isinstance(data, dict) and "init_args" in data:
        data = data["init_args"] or {}
    clients = data.get("num_clients")
    return RunDescription(
        algorithm=algorithm_name(
            config.get("model"), loop.get("aggregator"), loop.get("components")
        ),
        data=_data_name(data),
        partition=_partition_name(data),
        clients=f"{clients} clients" if isinstance(clients, int) else "",
    )


def describe_run(run_dir: str | Path) -> RunDescription | None:
    """The description of the run in ``run_dir`` (None without a readable ``config.yaml``)."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return describe(config) if isinstance(config, dict) else None
