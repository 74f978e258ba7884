"""``data.min_batch_size`` and BatchNorm's batch of one sample (issue 42 item 5;
docs/algorithms.md section 4.1): a trailing batch smaller than the minimum joins the batch before
it, every pass still covers every sample once, the default keeps torch's batches bit for bit; a
run that would train a BatchNorm network on a batch of one sample is refused in one line before
anything is written, on the sequential and the cohort backends alike."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fedlightning import FederatedDataModule
from fedlightning.cli import main
from fedlightning.data.loader import TensorBatches, batch_sizes
from fedlightning.errors import ConfigurationError
from fedlightning.loop.batch_checks import check_batches
from fedlightning.loop.identity import compare_identity
from fedlightning.models import create_model
from fedlightning.protocol import FitConfig


@pytest.mark.parametrize(
    ("n", "batch", "minimum", "sizes"),
    [
        (69, 32, 1, [32, 32, 5]),
        (69, 32, 8, [32, 37]),  # 5 < 8 joins the batch before it
        (69, 32, 5, [32, 32, 5]),  # 5 is not fewer than 5
        (65, 32, 2, [32, 33]),
        (5, 32, 8, [5]),  # one batch: kept, whatever its size
        (64, 32, 8, [32, 32]),
        (7, 1, 1, [1] * 7),
    ],
)
def test_batch_sizes(n, batch, minimum, sizes):
    assert batch_sizes(n, batch, minimum) == sizes
    assert batch_sizes(n, batch, minimum, drop_last=True) == [batch] * (n // batch)


def test_each_pass_covers_every_sample_once_in_the_merged_batches():
    x = torch.arange(69.0).unsqueeze(1)
    batches = TensorBatches(x, torch.arange(69), 32, shuffle=True, seed=3, min_batch_size=8)
    assert len(batches) == 2
    for _ in range(3):  # each pass its own shuffle
        rows = batches.batch_rows()
        assert [len(r) for r in rows] == [32, 37]
        assert sorted(torch.cat(rows).tolist()) == list(range(69))
    replay = TensorBatches(x, torch.arange(69), 32, shuffle=True, seed=3, min_batch_size=8)
    for (xb, yb), rows in zip(replay, TensorBatches(
        x, torch.arange(69), 32, shuffle=True, seed=3, min_batch_size=8
    ).batch_rows(), strict=True):  # fmt: skip
        assert torch.equal(yb, rows) and torch.equal(xb[:, 0], rows.float())


def test_the_default_cuts_the_shuffle_as_before():
    """Without a minimum the batches are torch.randperm cut every 32 rows, the last one short:
    what the pinned config hashes were recorded with."""
    y = torch.arange(69)
    order = torch.randperm(69, generator=torch.Generator().manual_seed(5))
    expected = [order[i : i + 32] for i in range(0, 69, 32)]
    got = [yb for _, yb in TensorBatches(y.float(), y, 32, shuffle=True, seed=5)]
    assert [len(b) for b in got] == [32, 32, 5]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def _bn_data(**kwargs):
    """4 IID synthetic clients of 33 training samples each: batches of 32 leave one sample."""
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=132, num_test=40, num_classes=3, sample_shape=(3, 8, 8),
        num_clients=4, partition="iid", val_fraction=0.0, **kwargs,
    )  # fmt: skip
    dm.setup()
    return dm


RESNET = create_model("resnet10", 3, 3, 8, width=4, stem="small")


def test_check_batches_refuses_a_batch_of_one_for_batchnorm_only():
    with pytest.raises(ConfigurationError) as refused:
        check_batches(RESNET, _bn_data(), FitConfig())
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "client 0 has 33 training samples: data.batch_size=32 leaves it a last batch of 1 "
        "sample (and 3 other client(s)), and BatchNorm in training mode (bn1) cannot normalise"
    )
    assert "set data.min_batch_size to 2 or more" in message
    check_batches(RESNET, _bn_data(min_batch_size=2), FitConfig())  # 33 samples: one batch
    check_batches(create_model("mlp", 3, 3, 8), _bn_data(), FitConfig())  # no BatchNorm
    check_batches(RESNET, _bn_data(), FitConfig(local_steps=1))  # never reaches the last batch
    with pytest.raises(ConfigurationError, match="data.batch_size=1"):
        check_batches(RESNET, _bn_data(batch_size=1), FitConfig())
    with pytest.raises(ConfigurationError, match="data.min_batch_size=2 with loop.dp_sgd"):
        check_batches(create_model("mlp", 3, 3, 8), _bn_data(min_batch_size=2),
                      FitConfig(dp_sgd={"noise_multiplier": 1.0}))  # fmt: skip


class _NeedsThree(nn.Linear):
    """A plug-in objective's declaration (``ClientModule.min_batch_samples``) on a bare module."""

    min_batch_samples = (3, "it compares each sample with two others")


def test_an_objective_declares_the_fewest_samples_its_batches_need():
    """33 samples in batches of 32 leave a last batch of 1: a declared need of 3 refuses it
    naming the reason and the minimum that joins it to the batch before; a batch size below the
    need names the batch size; batches of 16 + 17 pass; DP-SGD's Poisson batches are refused."""
    model = _NeedsThree(4, 3)
    with pytest.raises(ConfigurationError) as refused:
        check_batches(model, _bn_data(), FitConfig())
    assert str(refused.value) == (
        "client 0 has 33 training samples: data.batch_size=32 leaves it a last batch of 1 sample "
        "(and 3 other client(s)), and it compares each sample with two others; set "
        "data.min_batch_size to 3 or more (a smaller last batch joins the one before it)"
    )
    with pytest.raises(ConfigurationError, match=r"data.batch_size=2 .* data.batch_size >= 3"):
        check_batches(model, _bn_data(batch_size=2), FitConfig())
    check_batches(model, _bn_data(batch_size=16, min_batch_size=3), FitConfig())
    with pytest.raises(ConfigurationError, match="Poisson sample, of any size down to 0, and it"):
        check_batches(model, _bn_data(), FitConfig(dp_sgd={"noise_multiplier": 1.0}))


@pytest.mark.parametrize("declared", [2, (0, "none"), (2,), ("2", "why"), (2.0, "why"), (2, None)])
def test_a_malformed_declaration_is_refused_naming_the_attribute(declared):
    model = type("Declares", (nn.Linear,), {"min_batch_samples": declared})(4, 3)
    with pytest.raises(ConfigurationError) as refused:
        check_batches(model, _bn_data(), FitConfig())
    assert str(refused.value).startswith(
        f"Declares.min_batch_samples={declared!r}: expected a pair"
    )


BN_RUN = [
    "--data.dataset", "synthetic", "--data.num_samples", "132", "--data.num_test", "40",
    "--data.num_classes", "3", "--data.sample_shape", "[3, 8, 8]", "--data.num_clients", "4",
    "--data.partition", "iid", "--data.val_fraction", "0.0",
    "--model.network", "resnet10", "--model.network_kwargs", "{width: 4, stem: small}",
    "--model.num_classes", "3", "--model.in_channels", "3", "--model.image_size", "8",
    "--loop.rounds", "1", "--loop.clients_per_round", "2", "--loop.plots", "false",
]  # fmt: skip


@pytest.mark.parametrize("backend", ["SequentialBackend", "CohortBackend"])
def test_a_batchnorm_run_fed_one_sample_is_refused_in_one_line(backend, tmp_path, capsys):
    run_dir = tmp_path / "run"
    sys.argv = ["fedlightning"]  # LightningCLI warns when both sys.argv and args are given
    args = ["fit", "--config", str(Path(__file__).parent / "conf" / "tiny.yaml"), *BN_RUN, "--loop.backend", backend,
            "--loop.run_dir", str(run_dir)]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert "last batch of 1 sample" in err and "data.min_batch_size" in err
    assert not (run_dir / "metrics.csv").exists()
    main([*args, "--data.min_batch_size", "2"])  # each client's 33 samples: one batch
    assert (run_dir / "metrics.csv").is_file()


def test_a_checkpoint_from_before_the_option_resumes_at_one():
    stored = {"config": {"data": {"batch_size": 32}}, **{k: 0 for k in DERIVED}}
    current = {**stored, "config": {"data": {"batch_size": 32, "min_batch_size": 1}}}
    compare_identity("old.ckpt", stored, current)  # the batches those runs had
    current["config"]["data"]["min_batch_size"] = 4
    with pytest.raises(
        ConfigurationError, match="data.min_batch_size is not set in the checkpoint"
    ):
        compare_identity("old.ckpt", stored, current)


DERIVED = (
    "dataset", "num_clients", "seed", "partition_hash", "architecture", "client_state",
    "server_state", "backend_results", "library_version",
)  # fmt: skip
