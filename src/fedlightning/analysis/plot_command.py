"""``fedlightning plot RUN_DIR [RUN_DIR ...]``: overlay a metric of several runs
(:func:`fedlightning.analysis.plots.plot_runs`), with options for what a paper's figure needs
(axis labels, legend names, figure size; PDF or SVG by the output's suffix)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fedlightning.analysis.run_inputs import (
    PLOT_OPTIONS,
    PlotInputError,
    check_output,
    figure_size,
    read_options,
)


def parser() -> argparse.ArgumentParser:
    """The command's options (each may also come from a ``-c`` YAML file)."""
    parser = argparse.ArgumentParser(
        prog="fedlightning plot",
        description="Overlay a metric of several runs: one line per run directory, or with "
        "--group-by one mean +- std band per value of a config option (e.g. over seeds). "
        "The file type follows -o's suffix: .png, or .pdf/.svg for vector figures.",
        allow_abbrev=False,  # one spelling per option (fedlightning.config_checks)
    )
    parser.add_argument("run_dirs", nargs="+", help="run directories (each with a metrics.csv)")
    parser.add_argument(
        "-c", "--config", help="a YAML file whose keys are these options (metric, group_by, ...)"
    )
    parser.add_argument("--metric", default=None, help="a metrics.csv column (default: test_acc)")
    parser.add_argument(
        "--group-by", default=None, help="a config.yaml option: runs with the same value form one "
        "mean +- std band (e.g. loop.aggregator, model.init_args.mu)",
    )  # fmt: skip
    parser.add_argument("--x", default=None, help="the x axis: round (default) or a column")
    parser.add_argument("--title", default=None, help="the plot title ('' for none)")
    parser.add_argument("--xlabel", default=None, help="the x axis label (default: e.g. Round)")
    parser.add_argument(
        "--ylabel", default=None, help="the y axis label (default: e.g. Test accuracy)"
    )
    parser.add_argument(
        "--labels", nargs="+", default=None, metavar="NAME",
        help="the legend's names, one per line in order (per run, or per group with --group-by)",
    )  # fmt: skip
    parser.add_argument(
        "--figsize", nargs=2, default=None, metavar=("WIDTH", "HEIGHT"),
        help="the figure's size in inches (default: 9 4.4)",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", default=None, help="the figure file: .png (default runs.png), .pdf, .svg"
    )
    return parser


def plot_command(argv: Sequence[str]) -> Path:
    """Run ``fedlightning plot`` on ``argv``; a bad input is one line and exit status 2."""
    from fedlightning.analysis.plots import plot_runs

    command = parser()
    args = command.parse_args(list(argv))
    options = dict(PLOT_OPTIONS)
    try:
        if args.config:
            options.update(read_options(args.config))
        options.update({k: v for k, v in vars(args).items() if k in options and v is not None})
        out = plot_runs(
            args.run_dirs, options["metric"], check_output(options["output"]),
            options["group_by"], x=options["x"], title=options["title"],
            xlabel=options["xlabel"], ylabel=options["ylabel"], labels=options["labels"],
            figsize=figure_size(options["figsize"]),
        )  # fmt: skip
    except (FileNotFoundError, KeyError, PlotInputError) as err:
        command.error(str(err).strip("'\""))
    print(f"wrote {out}")
    return out
