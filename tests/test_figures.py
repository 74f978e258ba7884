"""Figures a paper takes as they are (issue 34 item 3): readable labels and titles read from the
figure objects, ``fedlightning plot``'s label, legend and size options, vector output by suffix,
CoFED's bars and the CKA panels' tick labels."""

import re
from pathlib import Path

import numpy as np
import pytest

from fedlightning.analysis.cka import plot_cka
from fedlightning.analysis.cofed_plot import relative_accuracy_figure
from fedlightning.analysis.labels import algorithm_name, axis, describe
from fedlightning.analysis.plots import curves_figure, runs_figure
from fedlightning.cli import main
from test_plots_scale import write_run

FEDPROX = """loop:
  aggregator: null
model:
  class_path: fedlightning.clients.FedProx
  init_args: {mu: 0.01}
data:
  dataset: digits
  num_clients: 20
  partition: dirichlet
  beta: 0.5
"""
HF = """loop:
  aggregator: {class_path: fedlightning.server.FedCross, init_args: {alpha: 0.9}}
model: {class_path: fedlightning.clients.ClientModule}
data:
  dataset: huggingface
  root: data/hf/cifar10
  num_clients: 10
  partition: iid
"""
ROWS = [
    {"round": r, "test_acc": 0.5 + 0.1 * r, "test_loss": 1.0 / r, "train_loss": 1.2 / r,
     "val_acc": 0.4 + 0.1 * r, "comm_sent_total": 2e6 * r, "comm_received_total": 2e6 * r,
     "dp_epsilon": 0.5 * r, "dp_delta": 1e-5}
    for r in (1, 2, 3)
]  # fmt: skip


def labels_of(ax):
    return [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_curves_have_readable_labels_and_a_title_naming_algorithm_data_and_partition(tmp_path):
    write_run(tmp_path / "run", ROWS, FEDPROX)
    fig = curves_figure(tmp_path / "run")
    acc, loss, traffic = fig.axes
    assert fig._suptitle.get_text() == "FedProx · digits, Dirichlet (β = 0.5), 20 clients"
    assert (acc.get_xlabel(), acc.get_ylabel()) == ("Round", "Accuracy")
    assert labels_of(acc) == ["Test accuracy", "Validation accuracy (global model)"]
    assert labels_of(loss) == ["Test loss", "Local training loss (mean over clients)"]
    assert traffic.get_xlabel() == "Communication (MB, sent + received)"
    np.testing.assert_allclose(traffic.get_lines()[0].get_xdata(), [4.0, 8.0, 12.0])  # MB
    assert all(float(t).is_integer() for t in acc.get_xticks())


def test_a_named_data_set_is_titled_by_its_name_not_huggingface(tmp_path):
    description = describe(__import__("yaml").safe_load(HF))
    assert description.title() == "FedCross · cifar10, IID, 10 clients"


@pytest.mark.parametrize(
    ("model", "aggregator", "name"),
    [
        (None, None, "FedAvg"),
        ({"class_path": "fedlightning.clients.MOON"}, None, "MOON"),
        ({"class_path": "fedlightning.clients.ScaffoldClient"},
         {"class_path": "fedlightning.server.Scaffold"}, "Scaffold"),
        ({"class_path": "fedlightning.clients.FedProx"},
         {"class_path": "fedlightning.server.FedAvgM"}, "FedProx + FedAvgM"),
        ({"class_path": "fedlightning.clients.ClientModule"}, "fedlightning.server.InCo", "InCo"),
    ],
)  # fmt: skip
def test_the_algorithm_is_named_by_objective_and_aggregator(model, aggregator, name):
    assert algorithm_name(model, aggregator) == name


def test_an_asynchronous_server_names_the_run():
    """A FedBuff or FedAsync run is titled by its asynchronous server, not by the FedAvg
    aggregator it applies (configs/fedbuff.yaml; docs section 6.4); other components name
    nothing."""
    for config, name in (("fedbuff", "FedBuff"), ("fedasync", "FedAsync")):
        text = (Path(__file__).resolve().parents[1] / "configs" / f"{config}.yaml").read_text()
        assert describe(__import__("yaml").safe_load(text)).algorithm == name
    buff = [{"class_path": "fedlightning.asynchronous.FedBuff"}]
    meter = [{"class_path": "my.UpdateNormMeter"}]
    prox = {"class_path": "fedlightning.clients.FedProx"}
    assert algorithm_name(prox, None, buff) == "FedProx + FedBuff"
    assert algorithm_name(None, "fedlightning.server.FedAdam", buff) == "FedBuff + FedAdam"
    assert algorithm_name(prox, None, meter) == "FedProx"


def test_epsilon_is_labelled_with_its_delta_and_bytes_in_megabytes(tmp_path):
    write_run(tmp_path / "run", ROWS, FEDPROX)
    fig = runs_figure([tmp_path / "run"], metric="dp_epsilon", x="comm_sent_total")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "ε (δ = 1e-05)"
    assert ax.get_xlabel() == "Communication sent (MB)"
    np.testing.assert_allclose(ax.get_lines()[0].get_xdata(), [2.0, 4.0, 6.0])
    assert axis("resnet10/test_acc") == ("resnet10: test accuracy", 1.0)


def test_overlaid_runs_are_named_by_algorithm_and_titled_by_their_common_setting(tmp_path):
    write_run(tmp_path / "prox", ROWS, FEDPROX)
    write_run(
        tmp_path / "avg", ROWS, FEDPROX.replace("fedlightning.clients.FedProx", "x.ClientModule")
    )
    ax = runs_figure([tmp_path / "avg", tmp_path / "prox"]).axes[0]
    assert labels_of(ax) == ["FedAvg", "FedProx"]
    assert ax.get_title() == "digits, Dirichlet (β = 0.5), 20 clients"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Round", "Test accuracy")


def test_plot_options_set_labels_legend_and_size_and_write_vector_files(tmp_path, capsys):
    for name in ("a", "b"):
        write_run(tmp_path / name, ROWS, FEDPROX)
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    options = ["--xlabel", "Communication round", "--ylabel", "Top-1 accuracy (%)",
               "--labels", "ours", "baseline", "--title", "", "--figsize", "4", "3"]  # fmt: skip
    svg = tmp_path / "fig.svg"
    main(["plot", *runs, *options, "-o", str(svg)])
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for words in ("Communication round", "Top-1 accuracy (%)", "ours", "baseline"):
        assert f">{words}<" in text.replace("&#x25;", "%")  # text stays text, editable
    width, height = (
        float(v) for v in re.search(r'width="([\d.]+)pt" height="([\d.]+)pt"', text).groups()
    )
    assert (width, height) == (4 * 72, 3 * 72)
    pdf = tmp_path / "fig.pdf"
    main(["plot", *runs, *options, "-o", str(pdf)])
    data = pdf.read_bytes()
    assert data[:5] == b"%PDF-" and b"/Subtype /Type3" not in data  # no Type 3 fonts
    assert b"/CIDFontType2" in data  # TrueType outlines, as publishers ask
    fig = runs_figure(runs, xlabel="R", ylabel="A", labels=["ours", "baseline"], figsize=(4, 3))
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("R", "A")
    assert tuple(fig.get_size_inches()) == (4, 3)
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", *runs, "--labels", "only-one", "-o", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2
    assert "--labels gives 1 name(s) for 2 line(s)" in capsys.readouterr().err


def test_plot_options_come_from_a_yaml_file_too(tmp_path, capsys):
    write_run(tmp_path / "a", ROWS, FEDPROX)
    (tmp_path / "opts.yaml").write_text("labels: ours\nfigsize: [5, 2.5]\nylabel: Acc\n")
    out = tmp_path / "o.svg"
    main(["plot", str(tmp_path / "a"), "-c", str(tmp_path / "opts.yaml"), "-o", str(out)])
    assert "wrote" in capsys.readouterr().out
    text = out.read_text()
    assert ">ours<" in text and ">Acc<" in text and 'width="360pt" height="180pt"' in text
    with pytest.raises(SystemExit):
        main(["plot", str(tmp_path / "a"), "--figsize", "0", "3", "-o", str(tmp_path / "o.png")])
    assert "--figsize 0 3: expected two numbers" in capsys.readouterr().err


def test_cofed_bars_label_every_participant_explain_red_and_span_the_differences():
    relative = [1.02, 0.98, 1.05, 1.0, 0.99, 1.03, 1.01, 1.04, 0.985, 1.02, 1.0, 1.01]
    fig = relative_accuracy_figure(relative)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(i) for i in range(12)]
    low, high = ax.get_ylim()
    assert 0.95 < low < 0.98 and 1.05 < high < 1.08  # the 0.98-1.05 differences fill the axis
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:2] == ["improved (7)", "worse than local (3)"] and legend[2].startswith("mean")
    bars = ax.patches
    assert [b.get_facecolor()[0] > 0.5 for b in bars] == [v < 1 for v in relative]  # red: worse


def test_cka_tick_labels_stay_within_their_own_panel(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = ["resnet10", "resnet14", "resnet18", "resnet22", "resnet26"]
    matrices = {f"layer{i}": np.eye(5) * 0.5 + 0.5 for i in range(1, 5)}
    captured = []
    real_savefig = Figure.savefig

    def keep(self, *args, **kwargs):
        captured.append(self)
        return real_savefig(self, *args, **kwargs)

    Figure.savefig = keep
    try:
        plot_cka(matrices, names, tmp_path / "cka.png")
    finally:
        Figure.savefig = real_savefig
    fig = captured[0]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]

    def tick_boxes(ax):
        labels = [*ax.get_xticklabels(), *ax.get_yticklabels()]
        return [t.get_window_extent(renderer) for t in labels if t.get_visible() and t.get_text()]

    for ax in panels:
        for other in panels:
            if other is not ax:
                taken = [other.get_window_extent(renderer), *tick_boxes(other)]
                assert not any(box.overlaps(o) for box in tick_boxes(ax) for o in taken)
    assert [t.get_text() for t in panels[0].get_yticklabels()] == names
    assert not [t for t in panels[1].get_yticklabels() if t.get_visible() and t.get_text()]


def _rows(rounds):
    return [{"round": r, "test_acc": 0.5 + r / 1000, "train_loss": 1.0 / r} for r in rounds]


@pytest.mark.parametrize(
    ("rounds", "expected"),
    [
        (range(2, 31, 2), list(range(4, 29, 4))),  # eval_every 2: never 5, 10, 15 (issue 38)
        ([*range(3, 61, 3), 61], list(range(6, 61, 6))),  # eval_every 3, 61 rounds: the last too
        (range(1, 101), list(range(10, 101, 10))),
        (range(5, 51, 5), list(range(5, 51, 5))),  # 10 evaluated rounds: each its tick
        ([1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144], [1, 3, 8, 21, 55, 144]),  # irregular
    ],
)
def test_round_ticks_fall_on_evaluated_rounds(rounds, expected, tmp_path):
    write_run(tmp_path / "run", _rows(rounds), FEDPROX)
    for ax in (curves_figure(tmp_path / "run").axes[0], runs_figure([tmp_path / "run"]).axes[0]):
        assert list(ax.get_xticks()) == expected
        low, high = ax.get_xlim()
        assert set(expected) <= set(rounds) and low < min(rounds) and high > max(rounds)


def _boxes(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # the constrained layout places the legend
    (ax,), (legend,) = fig.axes, fig.legends
    return ax.get_window_extent(renderer), legend.get_window_extent(renderer), fig.bbox


@pytest.mark.parametrize("figsize", [(5, 3.2), (3.4, 2.6)])
def test_a_small_figure_has_its_legend_below_the_axes(figsize, tmp_path):
    """At a paper's sizes the legend sits under the axes, inside the figure, and the axes keep
    most of the width (on the right the legend took about 45 % of it)."""
    runs = []
    for name in ("FedAvg", "FedCross", "FedProx"):
        write_run(tmp_path / name, _rows(range(1, 21)), FEDPROX.replace("FedProx", name))
        runs.append(tmp_path / name)
    fig = runs_figure(runs, figsize=figsize)
    axes, legend, page = _boxes(fig)
    assert legend.y1 < axes.y0 and legend.y0 >= page.y0 and page.x0 <= legend.x0
    assert legend.x1 <= page.x1 and axes.width > 0.75 * page.width
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["FedAvg", "FedCross", "FedProx"]


def test_a_wide_figure_has_its_legend_right_of_the_axes(tmp_path):
    write_run(tmp_path / "run", ROWS, FEDPROX)
    axes, legend, page = _boxes(runs_figure([tmp_path / "run"], figsize=(9, 4.4)))
    assert legend.x0 > axes.x1 and legend.x1 <= page.x1


def test_a_long_title_is_broken_between_its_parts_to_fit_a_small_figure(tmp_path):
    from fedlightning.analysis.axes_layout import fitted_title

    title = "FedAvg · digits, Dirichlet (β = 0.5), 20 clients (mean ± std over seeds 0, 1, 2)"
    assert fitted_title(title, 9) == title
    assert fitted_title(title, 5) == title.replace(" (mean", "\n(mean")
    for line in fitted_title(title, 3.4).splitlines():
        assert len(line) <= 37 and line.count("(") == line.count(")")
