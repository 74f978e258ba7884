"""The independent scorer of tests/test_rescore.py (docs/algorithms.md section 6.1): a run's
saved models (``models.pt``, ``personal.pt``) re-scored without the library's scoring path, by a
fresh network from the registry, ``load_state_dict``, ``eval()`` and a plain loop over the test
set or each client's own split, the personal distribution recomputed here."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from fedlightning.clients.moon import ProjectedNetwork
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.models import create_model


class _Headed(nn.Module):
    """A backbone and a linear head, as FML with adaptor heads scores (``backbone.*``, ``head.*``)."""

    def __init__(self, backbone: nn.Module, features: int, classes: int) -> None:
        super().__init__()
        self.backbone, self.head = backbone, nn.Linear(features, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


def _fresh(architecture: str, model: dict) -> nn.Module:
    """A fresh network of ``architecture`` as the run's objective (config.yaml) builds it."""
    args = model["init_args"]
    shape = (args["in_channels"], args["image_size"])
    kwargs = args.get("network_kwargs") or {}
    if args.get("adaptor_features"):  # FML with adaptor heads: the backbone and the assembled head
        backbone = create_model(architecture, args["adaptor_features"], *shape, **kwargs)
        return _Headed(backbone, args["adaptor_features"], args["num_classes"])
    network = create_model(architecture, args["num_classes"], *shape, **kwargs)
    if model["class_path"].endswith("MOON"):
        return ProjectedNetwork(network, args["num_classes"], args["projection_dim"])
    return network


class _Masked(nn.Module):
    """A personal model predicting within its client's label space (FML with adaptor heads):
    the logits outside ``mask`` replaced by a large negative number."""

    def __init__(self, network: nn.Module, classes: int) -> None:
        super().__init__()
        self.network = network
        self.register_buffer("mask", torch.ones(classes, dtype=torch.bool))

    def forward(self, x):
        logits = self.network(x)
        return torch.where(self.mask, logits, torch.full_like(logits, -1e30))


class _GenericPlusPersonal(nn.Module):
    """FedRoD's deployed model: the network's logits plus a linear head on its classifier's
    input (``network.*``, ``p_head.*``)."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network
        self.p_head = nn.Linear(network.head.in_features, network.head.out_features)

    def forward(self, x):
        inputs = []
        handle = self.network.head.register_forward_pre_hook(lambda _m, a: inputs.append(a[0]))
        logits = self.network(x)
        handle.remove()
        return logits + self.p_head(inputs[0])


def _fresh_personal(entry: dict, model: dict) -> nn.Module:
    """A fresh network of a ``personal.pt`` entry: FML's personal architecture (masked to the
    client's label space with adaptor heads), FedRoD's two heads, or the objective's own
    network."""
    if model["class_path"].endswith("FedRoD"):
        return _GenericPlusPersonal(_fresh(entry["architecture"].removeprefix("fedrod:"), model))
    if not model["class_path"].endswith("FML"):
        return _fresh(entry["architecture"], model)
    args = model["init_args"]
    same = entry["architecture"] == args["network"]
    kwargs = (args.get("network_kwargs") if same else args.get("personal_network_kwargs")) or {}
    network = create_model(entry["architecture"], args["num_classes"], args["in_channels"],
                           args["image_size"], **kwargs)  # fmt: skip
    return _Masked(network, args["num_classes"]) if "mask" in entry["state_dict"] else network


def rescore_personal(run_dir: Path, config: dict, dm: FederatedDataModule) -> dict[str, float]:
    """``personal.pt`` scored independently: each client's model on its own split, then the mean,
    the sample-weighted mean, the population std, the min and the mean of the worst tenth of the
    per-client accuracies, recomputed here."""
    saved = torch.load(run_dir / "personal.pt", weights_only=True)
    correct, counts = [], []
    for cid, entry in saved["clients"].items():
        network = _fresh_personal(entry, config["model"])
        network.load_state_dict(entry["state_dict"])
        network.eval()
        x, y, _ = (
            dm.client_test_data([cid]) if saved["split"] == "test" else dm.client_val_data([cid])
        )
        if not len(y):
            continue
        with torch.no_grad():
            correct.append(int((network(x.float()).argmax(dim=1) == y).sum()))
        counts.append(len(y))
    acc = sorted(c / n for c, n in zip(correct, counts, strict=True))
    mean = sum(acc) / len(acc)
    worst = acc[: -(-len(acc) // 10)]
    return {
        "personal_acc": mean, "personal_acc_weighted": sum(correct) / sum(counts),
        "personal_acc_std": (sum((a - mean) ** 2 for a in acc) / len(acc)) ** 0.5,
        "personal_acc_min": acc[0], "personal_acc_worst10": sum(worst) / len(worst),
        "personal_clients": float(len(acc)),
    }  # fmt: skip


def rescore(run_dir: Path) -> dict[str, float]:
    """``models.pt`` scored independently: ``<name>/test_acc`` (plain for ``global``), the mean
    cross-entropy ``test_loss`` and, with several groups, their mean ``group_mean_acc``."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    dm = FederatedDataModule(**config["data"])
    dm.setup("fit")
    saved = torch.load(run_dir / "models.pt", weights_only=True)
    results: dict[str, float] = {}
    for name, entry in saved["models"].items():
        network = _fresh(entry["architecture"], config["model"])
        network.load_state_dict(entry["state_dict"])
        network.eval()
        correct, loss, count = 0, 0.0, 0
        with torch.no_grad():
            for x, y in dm.test_dataloader():
                logits = network(x.float())
                correct += int((logits.argmax(dim=1) == y).sum())
                loss += float(F.cross_entropy(logits, y, reduction="sum"))
                count += len(y)
        prefix = "" if name == "global" else f"{name}/"
        results[f"{prefix}test_acc"], results[f"{prefix}test_loss"] = correct / count, loss / count
    groups = config["model"]["init_args"].get("networks") or []
    if len(groups) > 1:
        results["group_mean_acc"] = sum(results[f"{g}/test_acc"] for g in groups) / len(groups)
    if (run_dir / "personal.pt").exists():
        results.update(rescore_personal(run_dir, config, dm))
    return results
