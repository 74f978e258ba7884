import numpy as np
import pytest

from fedlightning.analysis.plots import plot_partition, read_metrics
from fedlightning.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_command_overlays_runs(cli, tmp_path, capsys):
    for name in ("fedavg_a", "fedavg_b"):
        cli(tmp_path / name, "--loop.rounds", "2", "--loop.plots", "false")
    out = tmp_path / "compare.png"
    main(
        [
            "plot",
            str(tmp_path / "fedavg_a"),
            str(tmp_path / "fedavg_b"),
            "--metric",
            "test_acc",
            "-o",
            str(out),
        ]
    )
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert f"wrote {out}" in capsys.readouterr().out
    assert list(read_metrics(tmp_path / "fedavg_a")["round"]) == [1.0, 2.0]
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(tmp_path / "fedavg_a"), "--metric", "nope", "-o", str(out)])
    assert exit_info.value.code == 2 and "metric 'nope'" in capsys.readouterr().err


def test_partition_heat_map(tmp_path):
    out = plot_partition(np.arange(12).reshape(3, 4), tmp_path / "p.png")
    assert out.read_bytes()[:8] == PNG_MAGIC
