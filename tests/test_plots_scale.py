"""Plots stay readable and bounded as clients grow; curves show evaluated rounds only; runs
grouped by a config option give mean +- std bands."""

import struct
import tracemalloc

import numpy as np
import pytest

from fedlightning.analysis.partition_map import (
    binned_rows,
    label_entropy,
    partition_figure,
    plot_partition,
)
from fedlightning.analysis.plots import config_value, plot_curves
from fedlightning.cli import main


def png_size(path):
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def skewed_table(clients, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([rng.multinomial(50, rng.dirichlet([0.3] * classes)) for _ in range(clients)])


@pytest.mark.parametrize("clients", [10, 100, 10_000])
def test_partition_map_bounded_with_integer_ticks(tmp_path, clients):
    table = skewed_table(clients)
    tracemalloc.start()
    out = plot_partition(table, tmp_path / "p.png", title="digits")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    width, height = png_size(out)
    assert width <= 1100 and height <= 506, (width, height)
    assert peak < 100 * 2**20, peak  # the 10,000-client map once took 4.5 GB
    fig = partition_figure(table)
    heat = fig.axes[0]
    for ticks in (heat.get_xticks(), heat.get_yticks()):
        assert np.allclose(ticks, np.round(ticks))
    assert heat.get_ylim()[0] >= clients - 1  # the y axis spans every client
    assert len(heat.images[0].get_array()) == min(clients, 100)


def test_binned_rows_keep_label_distributions():
    table = np.zeros((300, 3))
    table[:100, 0], table[100:, 2] = 10, 5  # a third of the clients hold class 0 only
    rows, per_row = binned_rows(table, max_rows=100)
    assert per_row == 3 and rows.shape == (100, 3)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0)
    assert (rows[:, 0] == 1).sum() == 33  # sorted: 33 rows of class-0 clients, then one mixed
    np.testing.assert_allclose(label_entropy(np.array([[5, 0], [5, 5]])), [0.0, 1.0])


def write_run(run_dir, rows, config):
    run_dir.mkdir(parents=True)
    keys = list(rows[0])
    lines = [",".join(keys)] + [
        ",".join("" if r[k] is None else str(r[k]) for k in keys) for r in rows
    ]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    (run_dir / "config.yaml").write_text(config)


def test_curves_use_evaluated_rounds_only(tmp_path):
    rows = [
        {"round": 1, "test_acc": None, "test_loss": None, "train_loss": 2.0},
        {"round": 2, "test_acc": 0.5, "test_loss": 1.5, "train_loss": 1.4},
    ]
    write_run(tmp_path / "r", rows, "loop: {seed: 0}\n")
    out = plot_curves(tmp_path / "r")
    width, height = png_size(out)
    assert width < 1400 and height < 700
    # one evaluated round: the x axis is not a 0.2-wide window around it
    from fedlightning.analysis.plots import figure, round_axis

    ax = figure((4, 3)).subplots()

    round_axis(ax, np.array([2.0]))
    low, high = ax.get_xlim()
    assert high - low >= 1 and list(ax.get_xticks()) == [2.0]


def test_plot_groups_seeds_into_mean_and_std(tmp_path, capsys):
    runs = []
    for name, accs in (("a", [0.2, 0.4]), ("a", [0.4, 0.6]), ("b", [0.5, 0.7])):
        run = tmp_path / f"{name}{len(runs)}"
        rows = [{"round": r + 1, "test_acc": acc} for r, acc in enumerate(accs)]
        config = f"loop:\n  seed: {len(runs)}\n  aggregator:\n    class_path: x.{name.upper()}\n"
        write_run(run, rows, config)
        runs.append(str(run))
    assert config_value(runs[0], "loop.aggregator") == "A"
    assert config_value(runs[1], "seed") == "1"
    out = tmp_path / "g.png"
    fig_calls = []
    import matplotlib.figure

    original = matplotlib.figure.Figure.savefig

    def spy(self, *args, **kwargs):
        fig_calls.append(self)
        return original(self, *args, **kwargs)

    matplotlib.figure.Figure.savefig = spy
    try:
        main(["plot", *runs, "--group-by", "loop.aggregator", "-o", str(out)])
    finally:
        matplotlib.figure.Figure.savefig = original
    assert f"wrote {out}" in capsys.readouterr().out
    ax = fig_calls[0].axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    assert set(lines) == {"A (n = 2)", "B"}  # the aggregator's class name, and the runs it averages
    np.testing.assert_allclose(lines["A (n = 2)"].get_ydata(), [0.3, 0.5])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    std = np.std([0.2, 0.4], ddof=1)
    assert np.isclose(band.min(), 0.3 - std) and np.isclose(band.max(), 0.5 + std)
    assert ax.get_title() and ax.get_xlabel() == "Round" and ax.get_ylabel() == "Test accuracy"
    (legend,) = fig_calls[0].legends  # beside the axes, naming both lines
    assert [text.get_text() for text in legend.get_texts()] == ["A (n = 2)", "B"]
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", *runs, "--group-by", "nope", "-o", str(out)])
    assert exit_info.value.code == 2 and "--group-by 'nope'" in capsys.readouterr().err
