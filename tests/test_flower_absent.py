"""Without the Flower extra, asking for the Flower backend is a configuration error (exit 2)
naming the extra, before anything is trained or written. The missing package is simulated
(``sys.modules["flwr"] = None`` makes ``import flwr`` raise ImportError), so the test runs
whether or not Flower is installed."""

import sys

import pytest

from conftest import run_cli


def test_flower_backend_without_flower_exits_2_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr", None)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path / "run", "--loop.backend", "FlowerBackend")
    assert exit_info.value.code == 2
    assert "pip install 'fedlightning[flower]'" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.csv").exists()
