"""Tracking that follows the run (issue 34 item 5) and metrics.csv in reading order (item 7): a
resumed run continues the same TensorBoard run, named after the run directory, its steps
following on; TensorBoard's hparams hold the resolved config; the run's figures reach the loggers
that take images; metrics.csv starts with ``round`` and the test metrics, with one header on
resume."""

import csv

import pytest
import yaml

from fedlightning.loop.metrics_table import MetricsTable, column_order

TENSORBOARD = "--loop.loggers+=lightning.pytorch.loggers.TensorBoardLogger"


def header(run_dir):
    with open(run_dir / "metrics.csv") as handle:
        return next(csv.reader(handle))


def test_a_resumed_run_continues_its_tensorboard_run_with_config_and_figures(cli, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, board = tmp_path / "fedavg_tiny", tmp_path / "tb"
    logger = [TENSORBOARD, "--loop.loggers.save_dir", str(board)]
    cli(run, "--loop.rounds", "2", *logger)
    first_header = header(run)
    cli(run, "--loop.rounds", "3", *logger, "--ckpt_path", str(run / "last.ckpt"))
    assert [p.name for p in board.iterdir()] == ["fedavg_tiny"]  # named after the run
    folder = board / "fedavg_tiny"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # both processes, one run
    events = EventAccumulator(str(folder), size_guidance={"images": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("test_acc")] == [1, 2, 3]
    assert [e.step for e in events.Images("partition")] == [0]
    assert [e.step for e in events.Images("curves")][-1] == 3
    hparams = yaml.safe_load((folder / "hparams.yaml").read_text())
    assert {"loop", "model", "data"} <= set(hparams)
    assert hparams["loop"]["rounds"] == 2 and hparams["data"]["dataset"] == "digits"
    plugin = events.PluginTagToContent("hparams")
    assert plugin and any(b"loop/clients_per_round" in content for content in plugin.values())
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["loop"]["loggers"][0]["init_args"]["name"] == "fedavg_tiny"
    # metrics.csv: reading order, and the resumed run appended under the same header
    assert header(run) == first_header
    assert first_header[:4] == ["round", "test_acc", "test_loss", "val_acc"]
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [r["round"] for r in rows] == ["1", "2", "3"]


def test_a_tensorboard_name_the_user_gives_is_kept(cli, tmp_path):
    pytest.importorskip("tensorboard")
    board = tmp_path / "tb"
    cli(tmp_path / "run", "--loop.rounds", "1", "--loop.plots", "false", TENSORBOARD,
        "--loop.loggers.save_dir", str(board), "--loop.loggers.name", "mine")  # fmt: skip
    assert [p.name for p in (board / "mine").iterdir()] == ["version_0"]


def test_metrics_columns_come_in_reading_order():
    keys = ["comm_sent_total", "val_acc_min", "dp_epsilon", "train_loss", "round", "krum_score",
            "clients_failed", "test_loss", "resnet10/test_acc", "val_acc", "test_acc",
            "round_time_s", "group_mean_acc"]  # fmt: skip
    assert column_order(keys) == [
        "round", "test_acc", "test_loss", "group_mean_acc", "resnet10/test_acc", "val_acc",
        "val_acc_min", "train_loss", "clients_failed", "round_time_s", "comm_sent_total",
        "dp_epsilon", "krum_score",
    ]  # fmt: skip


def test_a_new_column_rewrites_the_header_and_a_resume_writes_the_same_one(tmp_path):
    rows = [{"round": 1, "test_acc": 0.5, "train_loss": 1.0},
            {"round": 2, "test_acc": 0.6, "train_loss": 0.9, "rounds_to_target": 2}]  # fmt: skip
    table = MetricsTable(tmp_path)
    table.start([])
    assert not (tmp_path / "metrics.csv").exists()  # no file before the first row
    for row in rows:
        table.add(row)
    whole = (tmp_path / "metrics.csv").read_text()
    assert whole.splitlines()[0] == "round,test_acc,train_loss,rounds_to_target"
    resumed = MetricsTable(tmp_path)
    resumed.start(rows[:1])
    resumed.add(rows[1])
    assert (tmp_path / "metrics.csv").read_text() == whole
