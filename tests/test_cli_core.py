"""The training core through the CLI, as a user would write it: an objective whose
``configure_optimizers`` returns Lightning's scheduler dict, backends and loggers by
``class_path``, a broken objective that must not "succeed", a user objective run heterogeneously."""

from pathlib import Path

import pytest

from fedlightning.cli import main

CONF = Path(__file__).parent / "conf"


def test_a_user_objective_with_a_scheduler_dict_trains(cli, tmp_path):
    rows = cli(
        tmp_path,
        "--model.class_path",
        "user_clients.ScheduledClient",
        "--model.init_args.lr",
        "0.2",
    )
    assert all(int(float(r["clients_failed"])) == 0 for r in rows)
    assert float(rows[-1]["test_acc"]) > 0.8  # digits, 10 classes: chance is 0.1


def test_the_cohort_backend_by_class_name_equals_sequential(cli, tmp_path):
    sequential = cli(tmp_path / "sequential")
    cohort = cli(tmp_path / "cohort", "--loop.backend", "CohortBackend")
    for a, b in zip(sequential, cohort, strict=True):
        assert float(a["test_acc"]) == pytest.approx(float(b["test_acc"]), abs=0.01)


def test_extra_lightning_loggers_by_class_path(cli, tmp_path):
    extra = tmp_path / "extra"
    cli(tmp_path / "run", "--loop.loggers+=CSVLogger", f"--loop.loggers.save_dir={extra}",
        "--loop.loggers.name=mine")  # fmt: skip
    written = list(extra.rglob("metrics.csv"))
    assert len(written) == 1 and "test_acc" in written[0].read_text().splitlines()[0]


def test_a_broken_objective_stops_the_run_with_its_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([
            "fit", "--config", str(CONF / "tiny.yaml"), "--loop.run_dir", str(tmp_path),
            "--model.class_path", "user_clients.BrokenObjective",
        ])  # fmt: skip
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert "round 1: no client succeeded" in err and "ZeroDivisionError" in err
    assert not (tmp_path / "global.pt").exists()


def test_a_user_written_server_optimizer_through_the_cli(cli, tmp_path):
    plain = cli(tmp_path / "fedavg")
    rows = cli(tmp_path / "nesterov", "--loop.aggregator", "user_clients.ServerNesterov",
               "--loop.aggregator.beta", "0.5")  # fmt: skip
    assert float(rows[-1]["test_acc"]) > 0.8
    assert [r["test_acc"] for r in rows] != [r["test_acc"] for r in plain]  # the hook ran


def test_a_user_objective_runs_heterogeneously_without_a_new_class(cli, tmp_path):
    rows = cli(tmp_path, "--model.class_path", "user_clients.SmoothedCE", "--model.init_args.eps", "0.1",
               config="inco_tiny.yaml")  # fmt: skip
    last = rows[-1]
    assert {"resnet10/test_acc", "resnet14/test_acc", "resnet18/test_acc", "group_mean_acc"} <= set(
        last
    )
    assert int(float(last["clients_failed"])) == 0
