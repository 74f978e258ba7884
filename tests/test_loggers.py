"""Lightning loggers by ``class_path`` (issue 26 item 4): the README's TensorBoard example works
with what ``make install`` installs (the ``tensorboard`` extra), and a logger whose package is
missing is one line at start-up naming the package and how to install it, before anything is
written (MLflow and Comet, absent here, are in tests/test_bad_input.py's table)."""

import pytest

TENSORBOARD = "--loop.loggers+=lightning.pytorch.loggers.TensorBoardLogger"


def test_the_readme_tensorboard_logger_writes_events(cli, tmp_path):
    pytest.importorskip("tensorboard")
    rows = cli(tmp_path / "run", "--loop.rounds", "2", TENSORBOARD,
               "--loop.loggers.save_dir", str(tmp_path / "tb"))  # fmt: skip
    assert len(rows) == 2  # metrics.csv is written as always
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))


def test_a_missing_tensorboard_names_the_extra(cli, tmp_path, capsys, monkeypatch):
    import lightning.fabric.loggers.tensorboard as tensorboard

    monkeypatch.setattr(tensorboard, "_TENSORBOARD_AVAILABLE", False)
    monkeypatch.setattr(tensorboard, "_TENSORBOARDX_AVAILABLE", False)
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "run", TENSORBOARD, "--loop.loggers.save_dir", str(tmp_path / "tb"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "fedlightning: error: lightning.pytorch.loggers.tensorboard.TensorBoardLogger needs "
        "tensorboard, which is not installed: pip install 'fedlightning[tensorboard]' "
        "(make install has it)"
    ]
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()
