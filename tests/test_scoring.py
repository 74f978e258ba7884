"""The scoring path and the roles around it (docs/algorithms.md section 6.1): the client groups own
every architecture's network, and evaluation scores networks of its own in eval mode, whatever a
fit left in the objective's modules; the objective only says what to score."""

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from fedlightning import ClientModule, FederatedDataModule
from fedlightning.errors import ConfigurationError
from fedlightning.loop.evaluation import Evaluator
from fedlightning.loop.scoring_model import ScoringModel
from fedlightning.models import create_model
from fedlightning.state import ClientStore

CPU = torch.device("cpu")
GROUPS = dict(
    networks=["resnet10", "resnet14"], network_kwargs={"width": 4, "stem": "small"},
    num_classes=4, in_channels=3, image_size=8,
)  # fmt: skip


def _data():
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=300, num_test=90, num_classes=4, sample_shape=(3, 8, 8),
        num_clients=4, partition="iid", eval_batch_size=32,
    )  # fmt: skip
    dm.setup()
    return dm


def _trained_looking(model: ClientModule, dm) -> dict[str, dict[str, torch.Tensor]]:
    """Each group's weights after train-mode passes (BatchNorm statistics off their init), left
    in train mode as a fit leaves them; returns each group's state_dict."""
    states = {}
    for name, network in zip(model.groups, model.client_groups.networks, strict=True):
        network.train()
        with torch.no_grad():
            for x, _ in dm.client_train_dataloader(0, 0):
                network(x)
        states[name] = {k: v.clone() for k, v in network.state_dict().items()}
    return states


def _eval_mode_scores(name: str, weights, dm) -> tuple[float, float]:
    network = create_model(name, 4, 3, 8, width=4, stem="small")
    network.load_state_dict(weights)
    network.eval()
    correct, loss, count = 0, 0.0, 0
    with torch.no_grad():
        for x, y in dm.test_dataloader():
            logits = network(x)
            correct += int((logits.argmax(1) == y).sum())
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            count += len(y)
    return correct / count, loss / count


def test_the_client_groups_own_every_network_and_a_switch_keeps_device_dtype_and_mode():
    model = ClientModule(**GROUPS)
    networks = model.client_groups.networks
    assert model.network is networks[1] and model.groups == ["resnet10", "resnet14"]
    networks.eval()  # one call reaches every group
    assert not any(m.training for net in networks for m in net.modules())
    model.train()
    model.network.double()
    small = {k: v.double() for k, v in networks[0].state_dict().items()}
    model.load_network_state(small)
    assert model.network is networks[0] and model.group == "resnet10"
    assert model.network.training and next(model.network.parameters()).dtype == torch.float64
    assert sum(1 for _ in model.parameters()) == len(list(model.network.parameters()))


def test_evaluation_scores_in_eval_mode_whatever_the_fits_left(tmp_path):
    """The objective's group networks in train mode with moved BatchNorm statistics (as fits
    leave them): every deployable scores as a fresh network in eval mode would, and the objective
    is left as it was (its mode, its weights, its active group) with the RNG untouched."""
    dm, model = _data(), ClientModule(**GROUPS)
    scoring = ScoringModel(model, CPU, nullcontext)  # built before the "fits", as at start-up
    states = _trained_looking(model, dm)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    deployables = {"global": states["resnet14"], **states}
    metrics = Evaluator(scoring).evaluate(dm, deployables, [], ClientStore(), 0)
    assert torch.equal(torch.get_rng_state(), rng)
    for name, weights in states.items():
        acc, loss = _eval_mode_scores(name, weights, dm)
        assert metrics[f"{name}/test_acc"] == pytest.approx(acc, abs=1e-6)
        assert metrics[f"{name}/test_loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["test_acc"] == metrics["resnet14/test_acc"]
    assert metrics["group_mean_acc"] == pytest.approx(
        (metrics["resnet10/test_acc"] + metrics["resnet14/test_acc"]) / 2
    )
    assert all(net.training for net in model.client_groups.networks)
    assert model.group == "resnet14"
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_what_models_pt_saves_loads_back_into_the_same_scores():
    dm, model = _data(), ClientModule(**GROUPS)
    scoring = ScoringModel(model, CPU, nullcontext)
    states = _trained_looking(model, dm)
    deployables = {"global": states["resnet14"], "resnet10": states["resnet10"]}
    saved = scoring.saved(deployables)
    assert {n: e["architecture"] for n, e in saved.items()} == {
        "global": "resnet14", "resnet10": "resnet10",
    }  # fmt: skip
    evaluator = Evaluator(scoring)
    live = evaluator.test_models(
        {n: lambda w=w: scoring.load(w) for n, w in deployables.items()}, dm.test_dataloader
    )
    restored = evaluator.test_models(
        {n: lambda e=e: scoring.load_saved(e) for n, e in saved.items()}, dm.test_dataloader
    )
    assert live == restored and set(live) == {
        "test_acc", "test_loss", "resnet10/test_acc", "resnet10/test_loss",
    }  # fmt: skip
    with pytest.raises(ConfigurationError, match="architecture 'resnet99'"):
        scoring.load_saved({"architecture": "resnet99", "state_dict": states["resnet10"]})


class OwnForward(ClientModule):
    """Scores something else than its network: its logits halved."""

    def forward(self, x):
        return self.network(x) / 2


class OwnForwardScored(OwnForward):
    def scoring_network(self, network):
        return torch.nn.Sequential(network, torch.nn.Identity())


def test_an_objective_with_its_own_forward_must_say_what_to_score():
    with pytest.raises(ConfigurationError, match="OwnForward overrides forward.*scoring_network"):
        ScoringModel(OwnForward(network="mlp", num_classes=3, in_channels=6, image_size=1), CPU,
                     nullcontext)  # fmt: skip
    scoring = ScoringModel(
        OwnForwardScored(network="mlp", num_classes=3, in_channels=6, image_size=1),
        CPU,
        nullcontext,
    )
    weights = scoring.objective.network.state_dict()
    network = scoring.load({f"0.{k}": v for k, v in weights.items()})
    assert isinstance(network, torch.nn.Sequential) and not network.training


class Recording(ClientModule):
    seen: list = []

    def evaluate_clients(self, client_ids, store, val_dataloader, device, *, scoring=None):
        Recording.seen.append(scoring)
        return {}


class OldStyle(ClientModule):
    def evaluate_clients(self, client_ids, store, val_dataloader, device):
        return {"old_style": 1.0}


def test_evaluate_clients_gets_the_scoring_networks_when_it_declares_them():
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=120, num_test=30, num_classes=3, sample_shape=(6,),
        num_clients=3, partition="iid",
    )  # fmt: skip
    dm.setup()
    recording = Recording(network="mlp", num_classes=3, in_channels=6, image_size=1)
    scoring = ScoringModel(recording, CPU, nullcontext)
    deployables = {"global": recording.network.state_dict()}
    Evaluator(scoring).evaluate(dm, deployables, [0], ClientStore(), 0)
    assert Recording.seen == [scoring.networks] and scoring.networks.deployables is deployables
    old = OldStyle(network="mlp", num_classes=3, in_channels=6, image_size=1)
    metrics = Evaluator(ScoringModel(old, CPU, nullcontext)).evaluate(
        dm, {"global": old.network.state_dict()}, [0], ClientStore(), 0
    )
    assert metrics["old_style"] == 1.0
