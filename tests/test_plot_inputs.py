"""``fedlightning plot`` with bad input (issue 26 item 6): a bad or binary metrics.csv, an output
name matplotlib cannot write, a ``-c`` file that is not a mapping or gives a key twice, an option
given twice with two values, runs with no evaluated round in
common are each one line naming the file (row, column, option) and exit status 2, never a
traceback and never an empty plot with exit status 0; the ``--group-by`` forms its ``--help``
shows (``loop.aggregator``, ``model.init_args.mu``) group runs."""

import re

import pytest

from fedlightning.cli import main
from test_plots_scale import write_run

PROX = "model:\n  class_path: fedlightning.clients.FedProx\n  init_args:\n    mu: {mu}\n"


@pytest.fixture
def runs(tmp_path):
    """Two FedProx runs (mu 0.01 and 0.1) evaluated at rounds 1-2, and one with mu 0.01 evaluated
    at rounds 3 and 4 only."""
    for mu in (0.01, 0.1):
        rows = [{"round": r, "test_acc": 0.1 * r + mu} for r in (1, 2)]
        write_run(tmp_path / f"mu{mu}", rows, PROX.format(mu=mu))
    rows = [{"round": r, "test_acc": 0.5 if r >= 3 else None} for r in (1, 2, 3, 4)]
    write_run(tmp_path / "later", rows, PROX.format(mu=0.01))
    return tmp_path


def _plot(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return exit_info.value.code, err.strip().splitlines()[-1]


def test_the_group_by_forms_the_help_shows(runs, capsys):
    help_text = ""
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    help_text = capsys.readouterr().out
    assert "model.init_args.mu" in help_text and "loop.aggregator" in help_text
    for form in ("model.init_args.mu", "model.mu", "mu"):
        out = runs / f"{form}.png"
        main(
            ["plot", str(runs / "mu0.01"), str(runs / "mu0.1"), "--group-by", form, "-o", str(out)]
        )
        assert out.read_bytes()[:4] == b"\x89PNG"
        assert f"wrote {out}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda d: (d / "mu0.1" / "metrics.csv").write_text("round,test_acc\n1,0.5\n2,abc\n"),
         ["{d}/mu0.1"], r"mu0.1/metrics.csv row 2, column 'test_acc': 'abc' is not a number$"),
        (lambda d: (d / "mu0.1" / "metrics.csv").write_bytes(b"\x7fELF\x02\x01\x00\x00" * 20),
         ["{d}/mu0.1"], r"mu0.1/metrics.csv is not a CSV text file \(it holds binary data\)$"),
        (lambda d: (d / "mu0.1" / "metrics.csv").write_bytes(b"round,test_acc\n1,0.5\xe9\n"),
         ["{d}/mu0.1"], r"mu0.1/metrics.csv is not a readable CSV text file"),
        (lambda d: (d / "mu0.1" / "metrics.csv").write_text("round,test_acc\n1,0.5,7\n"),
         ["{d}/mu0.1"], r"mu0.1/metrics.csv: its rows do not have one value per header column$"),
        (lambda d: None, ["{d}/mu0.1", "-o", "{d}/x.txt"], r"-o '.*x.txt' has the file type 'txt': name an image file ending in one of .*\.png"),
        (lambda d: None, ["{d}/mu0.1", "-o", "{d}/x"], r"-o '.*x' has no file type"),
        (lambda d: None, ["{d}/mu0.1", "-o", "{d}/none/x.png"], r"the folder '.*none' does not exist$"),
        (lambda d: (d / "opts.yaml").write_text("- metric\n- test_acc\n"),
         ["{d}/mu0.1", "-c", "{d}/opts.yaml"], r"-c '.*opts.yaml' holds a list: expected a mapping of metric, group_by"),
        (lambda d: (d / "opts.yaml").write_text("metric: [a, b]\n"),
         ["{d}/mu0.1", "-c", "{d}/opts.yaml"], r"metric=\['a', 'b'\] is not allowed: expected a text value$"),
        (lambda d: (d / "opts.yaml").write_text("metric: {\n"),
         ["{d}/mu0.1", "-c", "{d}/opts.yaml"], r"-c '.*opts.yaml' is not readable YAML"),
        (lambda d: (d / "opts.yaml").write_bytes(b"metric: caf\xe9\n"),
         ["{d}/mu0.1", "-c", "{d}/opts.yaml"], r"-c '.*opts.yaml' is not UTF-8 text: byte 0xe9 at line 1, column 12"),
        (lambda d: None, ["{d}/mu0.1", "-c", "{d}/missing.yaml"], r"-c '.*missing.yaml' does not exist$"),
        (lambda d: (d / "opts.yaml").write_text("metric: test_acc\nx: round\nmetric: test_loss\n"),
         ["{d}/mu0.1", "-c", "{d}/opts.yaml"], r"-c '.*opts.yaml' gives metric twice \(line 1 and line 3\) in one mapping"),
        (lambda d: None, ["{d}/mu0.1", "--metric", "test_acc", "--metric", "test_loss"],
         r"--metric is given twice on the command line, as 'test_acc' and as 'test_loss'"),
        (lambda d: None, ["{d}/mu0.1", "--metric", "test_acc", "--metr", "test_loss"],
         r"unrecognized arguments: --metr test_loss"),  # no abbreviations (issue 43 item 2)
        (lambda d: None, ["{d}/mu0.01", "{d}/later", "--group-by", "mu"],
         r"μ = 0.01: no round at which .*mu0.01, .*later all have a test_acc value, so there is nothing to draw"),
        (lambda d: (d / "mu0.1" / "metrics.csv").write_text("round,test_acc\n1,\n"),
         ["{d}/mu0.1"], r"mu0.1/metrics.csv has no row with both test_acc and round$"),
    ],
    ids=["not-a-number", "binary", "not-utf8", "ragged", "txt", "no-suffix", "no-folder",
         "yaml-list", "yaml-nested", "yaml-syntax", "yaml-latin1", "no-options-file",
         "yaml-key-twice", "option-twice", "abbreviated",
         "no-common-round", "no-evaluated-round"],
)  # fmt: skip
def test_bad_plot_input_is_one_line_and_exit_2(runs, capsys, make, args, message):
    make(runs)
    args = [a.replace("{d}", str(runs)) for a in args]
    if "-o" not in args:
        args += ["-o", str(runs / "out.png")]
    code, line = _plot(capsys, *args)
    assert code == 2 and re.search(message, line), line
    assert not (runs / "out.png").exists()  # no empty plot left behind
