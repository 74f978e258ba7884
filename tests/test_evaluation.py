"""The evaluation is plain passes whose numbers are torchmetrics' to the last bit, and it scores the
validation splits of at most ``loop.val_clients`` clients, sampled from ``(seed, round)``."""

from contextlib import nullcontext

import pytest
import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
from fedlightning.errors import ConfigurationError
from fedlightning.loop.evaluation import Evaluator, val_clients
from fedlightning.loop.scoring_model import ScoringModel
from fedlightning.state import ClientStore

CPU = torch.device("cpu")


def _data(num_clients=12, **kwargs):
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=600, num_test=157, num_classes=4, sample_shape=(3, 8, 8),
        num_clients=num_clients, partition="dirichlet", beta=0.5, eval_batch_size=40, val_fraction=0.3,
        **kwargs,
    )  # fmt: skip
    dm.setup()
    return dm


def _model():
    torch.manual_seed(0)
    return ClientModule(
        network="resnet14", network_kwargs={"width": 4, "stem": "small"}, num_classes=4,
        in_channels=3, image_size=8,
    ).eval()  # fmt: skip


def test_the_test_metrics_are_torchmetrics_to_the_last_bit():
    dm, model = _data(), _model()
    with torch.no_grad():  # a trained-looking model: BatchNorm statistics moved off their init
        model.train()
        for x, _ in dm.client_train_dataloader(0, 0):
            model(x)
        model.eval()
    accuracy, loss = MulticlassAccuracy(4, average="micro"), MeanMetric()
    with torch.no_grad():
        for x, y in dm.test_dataloader():  # 157 samples in batches of 40: an uneven last one
            logits = model(x)
            accuracy.update(logits, y)
            loss.update(torch.nn.functional.cross_entropy(logits, y, reduction="none"))
    ours = Evaluator(ScoringModel(model, CPU, nullcontext)).test(model, dm.test_dataloader())
    assert ours == {"test_acc": float(accuracy.compute()), "test_loss": float(loss.compute())}
    assert 0 < ours["test_acc"] < 1


def test_the_scored_clients_are_a_seeded_sample_of_k_or_every_client():
    assert val_clients(0, 3, 10, "all") is None
    assert val_clients(0, 3, 10, 10) is None and val_clients(0, 3, 10, 100) is None
    sample = val_clients(0, 3, 1000, 7)
    assert sample == sorted(set(sample)) and len(sample) == 7 and max(sample) < 1000
    assert val_clients(0, 3, 1000, 7) == sample  # from (seed, round) only
    assert val_clients(0, 4, 1000, 7) != sample and val_clients(1, 3, 1000, 7) != sample


def test_val_acc_over_a_sample_is_the_mean_over_exactly_those_clients():
    dm, model = _data(), _model()
    scoring = ScoringModel(model, CPU, nullcontext)
    evaluator = Evaluator(scoring, seed=5, scored=4)
    scored = val_clients(5, 2, dm.num_clients, 4)
    deployables = {"global": model.network.state_dict()}
    metrics = evaluator.evaluate(dm, deployables, [], ClientStore(), 2)
    model.eval()
    per_client = []
    with torch.no_grad():
        for cid in scored:
            x, y = dm.client_val_dataloader(cid).x, dm.client_val_dataloader(cid).y
            if len(y):
                per_client.append(float((model(x).argmax(1) == y).double().mean()))
    assert metrics["val_acc"] == pytest.approx(sum(per_client) / len(per_client), abs=1e-12)
    everyone = Evaluator(scoring, seed=5, scored="all")
    full = everyone.evaluate(dm, deployables, [], ClientStore(), 2)
    assert full["val_acc"] != metrics["val_acc"]  # 4 of 12 clients is not every client
    assert full["test_acc"] == metrics["test_acc"]


@pytest.mark.parametrize("bad", [0, -3, 2.5, "some", True, None])
def test_a_bad_val_clients_is_a_clear_error(bad):
    with pytest.raises(
        ConfigurationError, match=r"loop.val_clients=.* expected 'all' or an integer >= 1"
    ):
        FederatedLoop(val_clients=bad)
