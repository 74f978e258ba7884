"""Personalized evaluation (issue 39 item 1; docs/algorithms.md section 10.1): each scored
client's deployed model, fine-tuned when configured, on its own split, recomputed here by hand;
scoring never changes training; personalized objectives are scored by default, global ones on
request; the partial-sharing family gives the same bits on Ray as sequentially."""

import math

import pytest
import torch
import torch.nn.functional as F

from clustered_data import NET, planted
from fedlightning import FederatedDataModule, FederatedLoop, PersonalEvaluation
from fedlightning.backends import RayBackend, SequentialBackend
from fedlightning.clients import (
    ClientModule,
    FedBABU,
    FedBN,
    FedPer,
    FedRep,
    IFCAClient,
    LGFedAvg,
)
from fedlightning.errors import ConfigurationError
from fedlightning.loop.evaluation import val_clients
from fedlightning.models import create_model
from fedlightning.seeding import derive_seed
from fedlightning.server import IFCA, ClusteredFL, FedAvg

MLP = dict(network="mlp", network_kwargs={"hidden": [16]}, num_classes=3, in_channels=6,
           image_size=1, lr=0.1, momentum=0.5)  # fmt: skip


def _data(**kwargs):
    options = dict(dataset="synthetic", num_samples=300, num_test=60, num_classes=3,
                   sample_shape=(6,), num_clients=6, partition="pathological",
                   classes_per_client=2, client_test_fraction=0.25, batch_size=8, seed=0)  # fmt: skip
    return FederatedDataModule(**{**options, **kwargs})


def _run(model, tmp_path, rounds=2, data=None, **loop_kwargs):
    torch.manual_seed(0)
    loop = FederatedLoop(
        rounds=rounds, clients_per_round=3, run_dir=str(tmp_path), progress_bar=False, plots=False,
        **loop_kwargs,
    )  # fmt: skip
    loop.fit(model, datamodule=data or _data())
    return loop


def _model(cls=ClientModule, **kwargs):
    torch.manual_seed(0)
    return cls(**{**MLP, **kwargs})


def _accuracy(network, x, y):
    with torch.no_grad():
        return int((network(x).argmax(dim=1) == y).sum()), len(y)


def _distribution(hits):
    acc = sorted(c / n for c, n in hits)
    mean = sum(acc) / len(acc)
    worst = acc[: math.ceil(len(acc) / 10)]
    return {
        "personal_acc": mean,
        "personal_acc_weighted": sum(c for c, _ in hits) / sum(n for _, n in hits),
        "personal_acc_std": math.sqrt(sum((a - mean) ** 2 for a in acc) / len(acc)),
        "personal_acc_min": acc[0], "personal_acc_worst10": sum(worst) / len(worst),
        "personal_clients": float(len(acc)),
    }  # fmt: skip


def test_a_global_method_is_its_global_model_on_each_clients_own_test_split(tmp_path):
    loop = _run(_model(), tmp_path, personal=PersonalEvaluation())
    dm, row = _data(), loop.history[-1]
    dm.setup()
    network = create_model("mlp", 3, 6, 1, hidden=[16])
    network.load_state_dict(torch.load(tmp_path / "global.pt", weights_only=True))
    network.eval()
    hits = []
    for cid in range(6):
        x, y, _ = dm.client_test_data([cid])
        hits.append(_accuracy(network, x, y))
    for key, value in _distribution(hits).items():
        assert row[key] == pytest.approx(value, abs=1e-12), key


def test_fine_tuning_is_sgd_on_the_clients_shuffled_training_batches(tmp_path):
    """Three steps of the objective's SGD (momentum 0.5) on CE from the global model, on the
    client's batches shuffled from derive_seed(seed, "fine-tune", round, client), recomputed."""
    loop = _run(_model(), tmp_path, personal=PersonalEvaluation(fine_tune_steps=3))
    saved = torch.load(tmp_path / "personal.pt", weights_only=True)
    assert (
        saved["round"] == 2 and saved["split"] == "test" and set(saved["clients"]) == set(range(6))
    )
    dm = _data()
    dm.setup()
    start = torch.load(tmp_path / "global.pt", weights_only=True)
    for cid in (0, 4):
        x, y = dm.data.train_x[dm._train_idx[cid]], dm.data.train_y[dm._train_idx[cid]]
        generator = torch.Generator().manual_seed(derive_seed(0, "fine-tune", 1, cid))
        order = torch.randperm(len(y), generator=generator)
        x, y = x[order], y[order]
        w = {k: v.clone() for k, v in start.items()}
        buffer = {}
        for step in range(3):
            xb, yb = x[8 * step : 8 * step + 8], y[8 * step : 8 * step + 8]
            leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
            hidden = torch.relu(xb @ leaves["features.1.weight"].T + leaves["features.1.bias"])
            logits = hidden @ leaves["head.weight"].T + leaves["head.bias"]
            grads = torch.autograd.grad(F.cross_entropy(logits, yb), list(leaves.values()))
            for k, g in zip(leaves, grads, strict=True):
                buffer[k] = g if k not in buffer else 0.5 * buffer[k] + g
                w[k] = w[k] - 0.1 * buffer[k]
        for k, v in w.items():
            assert torch.allclose(saved["clients"][cid]["state_dict"][k], v, atol=1e-6), k
    assert loop.history[-1]["personal_clients"] == 6


def test_scoring_never_changes_training(tmp_path):
    plain = _run(_model(), tmp_path / "plain")
    scored = _run(_model(), tmp_path / "scored", personal=PersonalEvaluation(fine_tune_epochs=1))
    assert (tmp_path / "plain" / "global.pt").read_bytes() == (
        tmp_path / "scored" / "global.pt"
    ).read_bytes()
    assert not any(k.startswith("personal") for k in plain.history[-1])
    assert not (tmp_path / "plain" / "personal.pt").exists()
    assert scored.history[-1]["test_acc"] == plain.history[-1]["test_acc"]


def test_personalized_objectives_are_scored_by_default_on_a_sample_at_a_cadence(tmp_path):
    options = PersonalEvaluation(clients=4, every=2)
    loop = _run(_model(FedPer), tmp_path, rounds=3, personal=options)
    rows = loop.history
    assert "personal_acc" not in rows[0] and "personal_acc" in rows[1] and "personal_acc" in rows[2]
    assert rows[1]["personal_clients"] == 4
    saved = torch.load(tmp_path / "personal.pt", weights_only=True)
    assert sorted(saved["clients"]) == val_clients(0, 2, 6, 4, "personal_clients")
    default = _run(_model(FedPer), tmp_path / "default")
    assert default.history[-1]["personal_clients"] == 6  # FedPer: on with the defaults


def test_fedbabu_fine_tunes_by_default_and_a_clients_model_is_its_own(tmp_path):
    loop = _run(_model(FedBABU, fine_tune_epochs=1), tmp_path)
    assert 0 < loop.history[-1]["personal_acc"] <= 1
    saved = torch.load(tmp_path / "personal.pt", weights_only=True)["clients"]
    heads = [saved[c]["state_dict"]["head.weight"] for c in range(6)]
    assert not torch.equal(heads[0], heads[1])  # fine-tuned per client, head included


def test_a_split_the_data_lacks_is_refused_before_anything_is_written(tmp_path):
    data = _data(client_test_fraction=0.0)
    with pytest.raises(ConfigurationError, match=r"loop.personal.init_args.split='test'"):
        _run(_model(), tmp_path / "run", data=data, personal=PersonalEvaluation(split="test"))
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    with pytest.raises(ConfigurationError, match="data.val_fraction=0"):
        _run(
            _model(FedPer), tmp_path / "other", data=_data(client_test_fraction=0.0, val_fraction=0)
        )
    for bad, message in ((dict(clients=0), "clients"), (dict(every=0), "every"),
                         (dict(fine_tune_steps=1, fine_tune_epochs=1), "give one of them"),
                         (dict(split="train"), "split")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=message):
            PersonalEvaluation(**bad)


@pytest.mark.slow  # Ray's start-up and actors: about a minute
def test_the_partial_sharing_family_gives_the_same_bits_on_ray(local_ray, tmp_path):
    for cls in (FedBN, FedPer, LGFedAvg, FedRep, FedBABU):
        kwargs = {
            "network": "cnn",
            "in_channels": 1,
            "image_size": 8,
            "num_classes": 10,
            "network_kwargs": {"width": 4, "hidden": 16, "batch_norm": cls is FedBN},
        }
        data = dict(dataset="digits", sample_shape=(1, 8, 8), num_classes=10, num_clients=10,
                    classes_per_client=2)  # fmt: skip
        runs = []
        for backend in (SequentialBackend(), RayBackend(num_workers=2)):
            model = _model(cls, **kwargs)
            runs.append(_run(model, tmp_path / cls.__name__ / type(backend).__name__,
                             data=_data(**data), aggregator=FedAvg(), backend=backend,
                             local_steps=3))  # fmt: skip
        sequential, ray = runs
        assert all(torch.equal(v, ray.aggregator.global_state()[k])
                   for k, v in sequential.aggregator.global_state().items()), cls  # fmt: skip
        assert sequential.store.state_dict().keys() == ray.store.state_dict().keys()
        for cid in sequential.store.client_ids():
            mine, theirs = sequential.store.get(cid), ray.store.get(cid)
            assert all(torch.equal(v, theirs["local"][k]) for k, v in mine.get("local", {}).items())
        assert sequential.history[-1] == {**ray.history[-1], "round_time_s":
                                          sequential.history[-1]["round_time_s"]}  # fmt: skip


def _ifca():
    return IFCA(), IFCAClient(**NET)


def _cfl():
    aggregator = ClusteredFL(eps1=100.0, eps2=1e-6, warmup_rounds=2, min_cluster_size=5)
    return aggregator, ClientModule(**NET)


@pytest.mark.parametrize("make", [_ifca, _cfl], ids=["IFCA", "ClusteredFL"])
def test_a_clustered_client_deploys_its_own_clusters_model(tmp_path, make):
    """Planted clusters (half the clients see shifted labels): each client's scored model is the
    model of the cluster the aggregator assigns it (IFCA's last pick, CFL's membership), and the
    logged personal numbers are those models on each client's own validation split."""
    torch.manual_seed(0)
    aggregator, objective = make()
    loop = FederatedLoop(rounds=4, clients_per_round=8, local_epochs=2, aggregator=aggregator,
                         run_dir=str(tmp_path), progress_bar=False, plots=False,
                         personal=PersonalEvaluation(clients="all"))  # fmt: skip
    loop.fit(objective, datamodule=planted())
    server = loop.aggregator
    assignment = getattr(server, "assignment", None) or server.membership
    assert len(set(assignment)) == 2  # both clusters deployed
    saved = torch.load(tmp_path / "personal.pt", weights_only=True)["clients"]
    dm = planted()
    dm.setup()
    network, hits = create_model("mlp", 3, 6, 1), []
    for cid in range(8):
        cluster = server.models[assignment[cid]]
        for key, value in cluster.items():
            assert torch.equal(saved[cid]["state_dict"][key], value), (cid, key)
        network.load_state_dict(cluster)
        network.eval()
        x, y, _ = dm.client_val_data([cid])
        hits.append(_accuracy(network, x, y))
    for key, value in _distribution(hits).items():
        assert loop.history[-1][key] == pytest.approx(value, abs=1e-12), key
