"""The metrics the papers plot: communication bytes (against a hand count), rounds to a target
accuracy, the per-client accuracy distribution and FML's personal accuracy of every client."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.clients import FML, ClientModule, ScaffoldClient
from fedlightning.errors import ConfigurationError
from fedlightning.metrics import accuracy_distribution
from fedlightning.protocol import Payload, Upload, message_bytes, nbytes
from fedlightning.server import FedAvg, FedCross, Scaffold
from objective_helpers import SYNTHETIC, synthetic_run


def _rows(run_dir):
    with open(run_dir / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def _param_bytes(model) -> int:
    # hand count: 4 bytes per float32 entry of every state_dict tensor
    return sum(4 * v.numel() for v in model.network.state_dict().values())


def test_nbytes_walks_extras():
    payload = Payload(
        {"w": torch.zeros(3, 2)}, extras={"c": {"a": torch.zeros(5, dtype=torch.float64)}, "n": 1}
    )
    assert message_bytes(payload) == 3 * 2 * 4 + 5 * 8 + 8
    assert nbytes([torch.zeros(2, dtype=torch.int64), None, "ab"]) == 16 + 0 + 2
    assert nbytes(np.zeros(3, dtype=np.float32)) == 12
    assert nbytes({"odd": range(3)}) == len(__import__("pickle").dumps(range(3)))


@pytest.mark.parametrize("name", ["fedavg", "fedcross"])
def test_fedavg_and_fedcross_bytes_match_a_hand_count(name, tmp_path):
    model = ClientModule(**SYNTHETIC)
    aggregator = FedAvg() if name == "fedavg" else FedCross()
    synthetic_run(model, aggregator, rounds=3, tmp_path=tmp_path)
    p = _param_bytes(model)
    rows = _rows(tmp_path)
    assert len(rows) == 3
    for r, row in enumerate(rows, start=1):
        # 2 clients per round, each receives one model and uploads one (FedCross: FedAvg's cost)
        assert int(row["comm_sent_bytes"]) == 2 * p
        assert int(row["comm_received_bytes"]) == 2 * p
        assert int(row["comm_sent_total"]) == r * 2 * p
        assert int(row["comm_received_total"]) == r * 2 * p


def test_scaffold_bytes_add_the_control_variates(tmp_path):
    model = ScaffoldClient(**SYNTHETIC)
    synthetic_run(model, Scaffold(), rounds=2, tmp_path=tmp_path)
    p = _param_bytes(model)  # the MLP has only trainable float parameters: |c| = |delta_c| = |w|
    for row in _rows(tmp_path):
        assert int(row["comm_sent_bytes"]) == 2 * (p + p)  # weights + c
        assert int(row["comm_received_bytes"]) == 2 * (p + p)  # weights + delta_c


def test_failed_client_sends_nothing_back():
    from fedlightning.loop.communication import CommunicationMeter
    from fedlightning.protocol import ClientJob, FitResult

    w = {"w": torch.zeros(10)}
    jobs = [ClientJob(0, c, Payload(w), {}) for c in (0, 1)]
    results = {0: FitResult(Upload(0, w, 5, 1), {}), 1: RuntimeError("boom")}
    assert CommunicationMeter().count(jobs, results) == {
        "comm_sent_bytes": 80, "comm_received_bytes": 40, "comm_sent_total": 80, "comm_received_total": 40,
    }  # fmt: skip


def test_totals_survive_a_resume(tmp_path):
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=240, num_test=60, num_classes=3, sample_shape=(6,), num_clients=4,
        partition="iid",
    )  # fmt: skip
    model = ClientModule(**SYNTHETIC)
    FederatedLoop(rounds=2, clients_per_round=2, run_dir=str(tmp_path), progress_bar=False).fit(
        model, datamodule=dm
    )
    loop = FederatedLoop(rounds=3, clients_per_round=2, run_dir=str(tmp_path), progress_bar=False)
    loop.fit(model, datamodule=dm, ckpt_path=str(tmp_path / "last.ckpt"))
    assert loop.history[-1]["comm_sent_total"] == 3 * 2 * _param_bytes(model)


def test_accuracy_distribution_by_hand():
    correct = torch.tensor([1.0, 3.0, 0.0, 8.0, 0.0])
    counts = torch.tensor([2.0, 4.0, 0.0, 8.0, 5.0])  # client 2 has no samples: left out
    accs = [0.5, 0.75, 1.0, 0.0]
    out = accuracy_distribution(correct, counts, "val_acc")
    mean = sum(accs) / 4
    assert out["val_acc"] == pytest.approx(mean)
    assert out["val_acc_weighted"] == pytest.approx(12 / 19)
    assert out["val_acc_std"] == pytest.approx(math.sqrt(sum((a - mean) ** 2 for a in accs) / 4))
    assert out["val_acc_min"] == 0.0
    assert out["val_acc_worst10"] == 0.0  # ceil(4 / 10) = 1 client
    twelve = accuracy_distribution(torch.arange(12.0), torch.full((12,), 11.0), "a")
    assert twelve["a_worst10"] == pytest.approx((0 + 1) / 2 / 11)  # ceil(12 / 10) = 2 clients


def test_target_acc_through_the_cli(cli, tmp_path):
    rows = cli(tmp_path, "--loop.target_acc", "0.5", "--loop.rounds", "5")
    accs = [float(r["test_acc"]) for r in rows]
    first = next((i for i, a in enumerate(accs) if a >= 0.5), None)
    assert first is not None, accs  # digits passes 50% within 5 rounds of the tiny config
    assert float(rows[first]["rounds_to_target"]) == first + 1
    assert float(rows[-1]["rounds_to_target"]) == first + 1
    assert (
        0
        < float(rows[-1]["time_to_target_s"])
        <= sum(float(r["round_time_s"]) for r in rows[: first + 1]) + 1e-6
    )
    assert all(r["rounds_to_target"] == "" for r in rows[:first])
    for key in ("val_acc_weighted", "val_acc_std", "val_acc_min", "val_acc_worst10"):
        assert 0.0 <= float(rows[-1][key]) <= 1.0
    assert float(rows[-1]["val_acc_min"]) <= float(rows[-1]["val_acc"])


def test_target_never_reached_is_nan(cli, tmp_path):
    rows = cli(
        tmp_path, "--loop.target_acc", "1.0", "--loop.rounds", "2", "--loop.local_epochs", "1"
    )
    assert math.isnan(float(rows[-1]["rounds_to_target"]))


def test_bad_target_acc_exits_2(cli, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path, "--loop.target_acc", "97")
    assert exit_info.value.code == 2
    assert "loop.target_acc" in capsys.readouterr().err


def test_fml_personal_accuracy_of_every_client(tmp_path):
    model = FML(**SYNTHETIC)
    loop = synthetic_run(model, FedAvg(weighting="uniform"), rounds=3, tmp_path=tmp_path)
    from fedlightning.loop.sampling import sample_clients

    seen = {c for r in range(3) for c in sample_clients(0, r, 4, 2)}
    last = loop.history[-1]
    assert last["personal_clients"] == len(seen) > 2  # more than this round's 2 clients
    assert 0.0 <= last["personal_acc_min"] <= last["personal_acc"] <= 1.0
    assert loop.store.client_ids() == sorted(seen)


def test_fml_personal_architectures_per_client(tmp_path):
    dm = FederatedDataModule(
        dataset="digits", num_clients=5, partition="shards", shards_per_client=3
    )
    model = FML(
        network="mlp", network_kwargs={"hidden": [32]}, personal_networks=["mlp", "lenet5", "cnn"],
        num_classes=10, in_channels=1, image_size=8, lr=0.05,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=2,
        clients_per_round=5,
        aggregator=FedAvg(weighting="uniform"),
        run_dir=str(tmp_path),
        progress_bar=False,
    )
    loop.fit(model, datamodule=dm)
    assert [model.personal_name(c) for c in range(5)] == ["mlp", "lenet5", "cnn", "mlp", "lenet5"]
    keys = {c: set(loop.store.get(c)["personal"]) for c in range(5)}
    assert (
        keys[0] == keys[3]
        and keys[1] == keys[4]
        and len({frozenset(k) for k in keys.values()}) == 3
    )
    assert "features.1.weight" in keys[0] and (32, 64) == tuple(
        loop.store.get(0)["personal"]["features.1.weight"].shape
    )
    assert loop.history[-1]["personal_clients"] == 5
    with pytest.raises(Exception, match="unknown model 'nope'"):
        FML(
            network="mlp",
            personal_networks=["mlp", "nope"],
            num_classes=10,
            in_channels=1,
            image_size=8,
        )


def test_fml_alpha_1_personal_is_independent_training(tmp_path):
    """alpha = 1: the personal models train on their own CE only, whatever the meme does."""
    kwargs = dict(**SYNTHETIC, alpha=1.0)
    a = synthetic_run(
        FML(**kwargs, beta=0.5), FedAvg(weighting="uniform"), rounds=2, tmp_path=tmp_path / "a"
    )
    b = synthetic_run(
        FML(**kwargs, beta=1.0), FedAvg(weighting="uniform"), rounds=2, tmp_path=tmp_path / "b"
    )
    for cid in a.store.client_ids():
        pa, pb = a.store.get(cid)["personal"], b.store.get(cid)["personal"]
        assert all(torch.allclose(pa[k], pb[k], atol=1e-6) for k in pa)


def test_validation_from_the_test_split():
    dm = FederatedDataModule(
        dataset="digits", num_clients=4, partition="shards", shards_per_client=2, val_from_test=0.2
    )
    dm.setup("fit")
    table = dm.partition_table()
    assert table.sum() == 1437  # clients train on all their samples
    held = torch.cat(list(dm._val_idx))
    test_rows = torch.cat([x for x, _ in dm.test_dataloader()])
    assert len(held) == 72 and len(test_rows) == 360 - 72  # 1/5 of the test set held out
    for cid in range(4):
        _, y = next(iter(dm.client_val_dataloader(cid)))
        val_classes = set(y.tolist())
        assert val_classes <= set(np.flatnonzero(table[cid]).tolist())  # its own label distribution
    x, y, owner = dm.client_val_data()
    assert len(y) == 72 and torch.equal(y, dm.data.test_y[held])
    with pytest.raises(ConfigurationError, match="val_from_test"):
        FederatedDataModule(val_from_test=1.0)


def test_fml_paper_options_through_the_cli(cli, tmp_path):
    rows = cli(
        tmp_path, "--model.init_args.personal_networks", "[mlp, lenet5]", "--data.val_from_test", "0.2",
        "--loop.rounds", "3", "--loop.clients_per_round", "8", config="fml_tiny.yaml",
    )  # fmt: skip
    last = rows[-1]
    assert float(last["personal_clients"]) == 8
    assert 0.0 <= float(last["personal_acc_min"]) <= float(last["personal_acc"]) <= 1.0
    assert float(last["val_acc_weighted"]) > 0.1


def test_curves_add_accuracy_against_communication(cli, tmp_path):
    from PIL import Image

    from fedlightning.analysis.plots import plot_curves

    cli(tmp_path, "--loop.target_acc", "0.3", "--loop.rounds", "2")
    with Image.open(plot_curves(tmp_path, tmp_path / "c.png")) as image:
        assert image.size[0] == 15 * 110  # a third panel: accuracy vs cumulative megabytes
    rows = _rows(tmp_path)
    for row in rows:  # without the communication columns: the two panels of before
        for key in [k for k in row if k.startswith("comm_")]:
            row.pop(key)
    with open(tmp_path / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with Image.open(plot_curves(tmp_path, tmp_path / "d.png")) as image:
        assert image.size[0] == 10 * 110
