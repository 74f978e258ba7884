"""Headlines that name what they score (issue 42 item 5): a run with client groups shows
``group_mean_acc``, named, with each group's model's accuracy, in its plain round lines, its
progress bar and notebook display, its summary and its closing line, and its ``--seeds`` summary;
its metrics.csv keeps the global model's ``test_acc`` column, and the summary says which model
that is. Every figure is read back from metrics.csv and recomputed here."""

import re
import statistics

import pytest
from rich.console import Console

from fedlightning.cli.runs import SeedRun, summary_line
from fedlightning.loop.headline import ScoredModels, headline
from fedlightning.loop.progress import notebook_line, rich_bar

GROUPS = ["resnet10", "resnet14", "resnet18"]
WITHIN_GROUPS = [
    "--loop.aggregator", "fedlightning.server.FedAvg",
    "--loop.aggregator.init_args.within_groups", "true",
    "--loop.backend", "SequentialBackend", "--loop.rounds", "2",
]  # fmt: skip


def _expected(row: dict[str, str]) -> str:
    """The headline of a metrics.csv row, composed here from its columns."""
    listed = ", ".join(f"{g} {float(row[f'{g}/test_acc']):.4f}" for g in GROUPS)
    return f"group_mean_acc {float(row['group_mean_acc']):.4f} ({listed})"


def test_a_within_groups_run_headlines_group_mean_acc_and_each_group(cli, tmp_path, capsys):
    rows = cli(tmp_path / "run", *WITHIN_GROUPS, config="inco_tiny.yaml")
    err = capsys.readouterr().err.splitlines()
    last = rows[-1]
    accuracies = [float(last[f"{g}/test_acc"]) for g in GROUPS]
    assert float(last["group_mean_acc"]) == pytest.approx(statistics.mean(accuracies), abs=1e-7)
    # the global test_acc keeps its column: within groups it is the largest group's model
    assert last["test_acc"] == last["resnet18/test_acc"] and "test_loss" in last
    for row in rows:  # one plain line per evaluated round, no test_loss of one model
        line = next(x for x in err if x.startswith(f"round {row['round']}/2 "))
        assert line.startswith(f"round {row['round']}/2 {_expected(row)} time "), line
    done = [line for line in err if line.startswith("done:")]
    assert len(done) == 1 and done[0].startswith(f"done: round 2/2, {_expected(last)}, "), done
    assert "test_acc" not in done[0].replace("group_mean_acc", "")
    summary = [line for line in err if line.startswith("  headline:")]
    assert summary == [
        f"  headline: {_expected(last).split(' (')[0]} at round 2, the mean test_acc of the 3 "
        f"group models: {_expected(last).split(' (')[1][:-1]}; metrics.csv's test_acc "
        f"{float(last['test_acc']):.4f} scores the global model (resnet18) only"
    ]


def test_a_run_without_groups_headlines_test_acc_as_before(cli, tmp_path, capsys):
    rows = cli(tmp_path / "run", "--loop.rounds", "1", "--loop.plots", "false")
    err = capsys.readouterr().err
    acc, loss = float(rows[-1]["test_acc"]), float(rows[-1]["test_loss"])
    assert f"round 1/1 test_acc {acc:.4f} test_loss {loss:.4f} time " in err
    assert f"done: round 1/1, test_acc {acc:.4f}, " in err and "headline:" not in err


ROW = {"round": 3, "test_acc": 0.25, "test_loss": 2.0, "train_loss": 0.75,
       "a/test_acc": 0.25, "b/test_acc": 0.75, "group_mean_acc": 0.5}  # fmt: skip
SCORED = ScoredModels(("a", "b"), "b")


def test_the_progress_bar_and_the_notebook_line_headline_the_groups():
    console = Console(record=True, force_terminal=True, width=200, color_system=None)
    with rich_bar(console, total=4, start=2, enabled=True, scored=SCORED) as advance:
        advance(ROW)
    final = [line for line in console.export_text().splitlines() if "3/4" in line][-1]
    assert re.search(
        r"3/4 .* group_mean_acc 0\.5000 \(a 0\.2500, b 0\.7500\)  train_loss 0\.7500", final
    )
    shown = []

    class Display:
        def show(self, text):
            shown.append(text)

    with notebook_line(Display(), total=4, start=2, enabled=True, scored=SCORED) as advance:
        advance(ROW)
    assert shown[-1].startswith("round 3/4  group_mean_acc 0.5000 (a 0.2500, b 0.7500)  train")
    assert headline({**ROW, "group_mean_acc": float("nan")}, SCORED) == ""
    assert headline(ROW, ScoredModels()) == "test_acc 0.2500"  # no groups: the one model


def test_the_seeds_summary_headlines_the_groups_mean_and_spread():
    rows = [
        {"round": 15, "group_mean_acc": 0.5, "a/test_acc": 0.25, "b/test_acc": 0.75},
        {"round": 15, "group_mean_acc": 0.625, "a/test_acc": 0.5, "b/test_acc": 0.75},
        {"round": 15, "group_mean_acc": 0.75, "a/test_acc": 0.75, "b/test_acc": 0.75},
    ]
    runs = [
        SeedRun(s, f"runs/x/seed_{s}", {**r, "test_acc": 0.75}, SCORED) for s, r in enumerate(rows)
    ]
    a = [r["a/test_acc"] for r in rows]
    line = summary_line(runs)
    assert line == (
        f"seeds 0, 1, 2: group_mean_acc 0.6250 ± 0.1250 (mean ± sample std over 3 runs at round "
        f"15, a {statistics.mean(a):.4f} ± {statistics.stdev(a):.4f}, b 0.7500 ± 0.0000); "
        "runs/x/seed_*"
    )
    one = summary_line(runs[:1])
    assert one.startswith("seed 0: group_mean_acc 0.5000 (a 0.2500, b 0.7500) at round 15")
