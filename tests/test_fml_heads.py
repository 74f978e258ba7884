"""FML with a shared meme backbone and per-client adaptor heads for clients with different label
spaces (docs/algorithms.md section 1.6)."""

import re

import pytest
import torch

from fedlightning import FedAvg, FederatedDataModule, FederatedLoop
from fedlightning.clients import FML
from fedlightning.clients.fml_heads import mask_logits
from fedlightning.errors import ConfigurationError


class Recording(FedAvg):
    """FedAvg that keeps every round's uploads."""

    transient_attributes = frozenset({"seen"})  # the test's record, read by no later round

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []

    def aggregate(self, round_index, uploads):
        self.seen.append(list(uploads))
        super().aggregate(round_index, uploads)


def _disjoint_run(tmp_path, rounds=6, **model_kwargs):
    """3 clients, 6 synthetic classes, 2 shards each: every client holds 2 classes no one else has."""
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=600, num_test=120, num_classes=6, sample_shape=(6,),
        num_clients=3, partition="shards", shards_per_client=2, batch_size=16, noise=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    model = FML(
        network="mlp", num_classes=6, in_channels=6, image_size=1, lr=0.1, momentum=0.5,
        adaptor_features=8, **model_kwargs,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=rounds, clients_per_round=3, aggregator=Recording(weighting="uniform"),
        run_dir=str(tmp_path), progress_bar=False, plots=False, local_epochs=1,
    )  # fmt: skip
    metrics = loop.fit(model, datamodule=dm)
    return dm, model, loop, metrics


@pytest.fixture(scope="module")
def disjoint(tmp_path_factory):
    return _disjoint_run(tmp_path_factory.mktemp("fml-heads"))


def test_label_spaces_are_each_clients_training_classes(disjoint):
    dm, model, _, _ = disjoint
    spaces = [set(torch.nonzero(m).flatten().tolist()) for m in model.label_spaces]
    assert all(len(s) == 2 for s in spaces)
    assert set().union(*spaces) == set(range(6))  # disjoint: 3 x 2 distinct classes
    table = dm.partition_table()
    assert all(set(table[c].nonzero()[0].tolist()) == spaces[c] for c in range(3))


def test_disjoint_label_spaces_learn_well_above_chance_on_each_clients_own_labels(disjoint):
    _, _, _, metrics = disjoint
    # chance within a 2-class label space is 0.5; the worst client counts
    assert metrics["adaptor_acc_all_min"] >= 0.8
    assert metrics["personal_acc_all_min"] >= 0.8
    assert metrics["personal_clients"] == 3


def test_uploads_hold_the_backbone_only(disjoint):
    _, model, loop, _ = disjoint
    backbone = model.network.state_dict()
    for round_uploads in loop.aggregator.seen:
        for upload in round_uploads:
            assert upload.weights.keys() == backbone.keys()
            # nothing shaped like an adaptor head (classes x features) travels
            assert all(tuple(v.shape) not in ((6, 8), (6,)) for v in upload.weights.values())
            shapes = {k: tuple(v.shape) for k, v in upload.weights.items()}
            assert shapes == {k: tuple(v.shape) for k, v in backbone.items()}
    # the backbone's output layer gives the adaptor features, never the 6 classes
    assert model.network(torch.zeros(1, 6)).shape == (1, 8)
    assert set(loop.aggregator.global_state()) == set(backbone)


def test_heads_stay_private_and_differ_across_clients(disjoint):
    _, model, loop, _ = disjoint
    heads = [loop.store.get(c)["head"] for c in range(3)]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not torch.allclose(heads[a]["weight"], heads[b]["weight"])
    # each head's rows of classes outside its label space never trained: still the initial ones
    fresh = [torch.nonzero(~m).flatten() for m in model.label_spaces]
    trained = [torch.nonzero(m).flatten() for m in model.label_spaces]
    for c in range(3):
        rows = heads[c]["weight"]
        assert rows[trained[c]].abs().sum() > 0
        # the masked rows received no gradient, but momentum SGD with no weight decay never
        # moves a row whose gradient is always 0
        assert torch.equal(rows[fresh[c]], _initial_head(loop, c)[fresh[c]])


def _initial_head(loop, client):
    """Client ``client``'s head as first created (re-created the way begin_client does it)."""
    from fedlightning.seeding import derive_seed, seed_fit

    seed_fit(derive_seed(loop.options.seed, "fit", 0, client))
    with torch.random.fork_rng(devices=[]):
        return torch.nn.Linear(8, 6).weight.detach()


def test_masked_logits_give_zero_probability_and_no_gradient():
    out = torch.randn(4, 5, requires_grad=True)
    mask = torch.tensor([True, False, True, False, False])
    y = torch.tensor([0, 2, 2, 0])
    masked = mask_logits(out, mask)
    assert torch.equal(masked.softmax(dim=1)[:, ~mask], torch.zeros(4, 3))
    torch.nn.functional.cross_entropy(masked, y).backward()
    assert torch.equal(out.grad[:, ~mask], torch.zeros(4, 3))
    # the KL between two masked outputs is finite (no 0 * inf)
    other = mask_logits(torch.randn(4, 5), mask)
    kl = torch.nn.functional.kl_div(
        masked.log_softmax(1), other.log_softmax(1), reduction="batchmean", log_target=True
    )
    assert torch.isfinite(kl)


def test_same_seed_same_run(tmp_path, disjoint):
    _, _, loop, metrics = disjoint
    _, _, again, metrics_again = _disjoint_run(tmp_path / "again")
    assert metrics_again["adaptor_acc_all"] == metrics["adaptor_acc_all"]
    first, second = loop.aggregator.global_state(), again.aggregator.global_state()
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_adaptor_features_are_refused(bad):
    with pytest.raises(ConfigurationError, match=re.escape(f"model.adaptor_features={bad!r}")):
        FML(network="mlp", num_classes=6, in_channels=6, image_size=1, adaptor_features=bad)


def test_adaptor_heads_through_the_cli(cli, tmp_path):
    rows = cli(
        tmp_path / "run", "--model.init_args.adaptor_features", "16", "--data.partition", "shards",
        "--data.num_clients", "5", "--loop.clients_per_round", "5", "--loop.rounds", "3",
        config="fml_tiny.yaml",
    )  # fmt: skip
    last = rows[-1]
    assert float(last["adaptor_acc_all"]) > 0.6  # 2-3 classes per client: chance is 0.33-0.5
    assert float(last["adaptor_acc_all_min"]) > 0.35
    assert 0 <= float(last["test_acc"]) <= 1  # the assembled heads on the global test set
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "bad", "--model.init_args.adaptor_features", "0", config="fml_tiny.yaml")
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_adaptor_heads_over_a_flower_federation_equal_sequential(tmp_path):
    """Each Flower node derives the label spaces from its own data module (prepare_clients)."""
    pytest.importorskip("flwr")
    from conftest import run_cli
    from fedlightning.flower_app.local import LocalFederation
    from test_flower import _flower_args

    args = ["--model.init_args.adaptor_features", "16", "--data.partition", "shards",
            "--loop.rounds", "2"]  # fmt: skip
    run_cli(tmp_path / "seq", *args, config="fml_tiny.yaml")
    with LocalFederation(num_nodes=2) as fed:
        run_cli(tmp_path / "flower", *args, *_flower_args(fed), config="fml_tiny.yaml")
    assert (tmp_path / "flower" / "global.pt").read_bytes() == (
        tmp_path / "seq" / "global.pt"
    ).read_bytes()
    seq, flower = (
        torch.load(tmp_path / d / "last.ckpt", weights_only=True) for d in ("seq", "flower")
    )
    states = [ckpt["clients"]["states"] for ckpt in (seq, flower)]
    assert sorted(states[0]) == sorted(states[1])
    for cid, state in states[0].items():  # the heads are checkpointed client state
        other = states[1][cid]["head"]
        assert all(torch.equal(v, other[k]) for k, v in state["head"].items())
