"""``fedlightning fit --seeds`` and ``--fast_dev_run`` (issue 34 item 6): each seed's run is the run
``--loop.seed S`` gives, bit for bit; the summary line is the mean and sample standard deviation of
their metrics.csv (one seed: its value, no spread); on Ray the seeds run as parallel tasks with
the same results; a fast_dev_run trains one round of two batches per client and leaves nothing."""

import csv
import re
import statistics
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from fedlightning.cli import main
from fedlightning.cli import runs as cli_runs

CONF = Path(__file__).parent / "conf" / "tiny.yaml"
SHORT = ["--loop.rounds", "2", "--loop.plots", "false"]


def _fit(*args: str) -> None:
    sys.argv = ["fedlightning"]
    main(["fit", "-c", str(CONF), *args])


def _last_test_acc(run_dir: Path) -> float:
    with open(run_dir / "metrics.csv") as handle:
        return float(list(csv.DictReader(handle))[-1]["test_acc"])


def _same_model(a: Path, b: Path) -> bool:
    left, right = (torch.load(p / "global.pt", weights_only=True) for p in (a, b))
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def _check_seeds(base: Path, seeds: list[int], out: str, tmp_path: Path) -> None:
    """Each ``base/seed_S`` is the plain run with ``--loop.seed S``; the summary line in ``out``
    is the mean ± sample std of their last test_acc, read back from metrics.csv."""
    for seed in seeds:
        single = tmp_path / f"single_{seed}"
        _fit(*SHORT, "--loop.seed", str(seed), "--loop.run_dir", str(single))
        assert _same_model(base / f"seed_{seed}", single), seed
    values = [_last_test_acc(base / f"seed_{seed}") for seed in seeds]
    assert len(set(values)) > 1  # the seeds differ: the spread below is not trivially 0
    line = re.search(r"test_acc (\d\.\d{4}) ± (\d\.\d{4}) \(mean ± sample std over (\d) runs", out)
    assert line, out
    assert float(line[1]) == pytest.approx(statistics.mean(values), abs=5e-5)
    assert float(line[2]) == pytest.approx(statistics.stdev(values), abs=5e-5)
    assert int(line[3]) == len(seeds)


def test_seeds_are_the_plain_runs_and_the_summary_is_their_mean_and_std(tmp_path, capsys):
    base = tmp_path / "sweep"
    _fit("--loop.rounds", "2", "--loop.run_dir", str(base), "--seeds", "0", "3")
    out = capsys.readouterr().out
    assert (base / "seeds.png").read_bytes()[:4] == b"\x89PNG"
    _check_seeds(base, [0, 3], out, tmp_path)


def test_one_seed_prints_its_value_and_no_spread(tmp_path, capsys):
    _fit(*SHORT, "--loop.run_dir", str(tmp_path / "one"), "--seeds", "5")
    out = capsys.readouterr().out
    value = _last_test_acc(tmp_path / "one" / "seed_5")
    assert f"seed 5: test_acc {value:.4f} at round 2 (one seed: no spread)" in out
    assert "±" not in out and not (tmp_path / "one" / "seeds.png").exists()  # plots: false


def test_fast_dev_run_trains_one_round_of_two_batches_and_keeps_nothing(
    tmp_path, capsys, monkeypatch
):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen = []

    def spy(args, **options):
        cli = fit_command(args, **options)
        seen.append(cli.trainer)
        return cli

    fit_command = cli_runs.fit_command
    monkeypatch.setattr(cli_runs, "fit_command", spy)
    tensorboard = ["--loop.loggers+=lightning.pytorch.loggers.TensorBoardLogger",
                   "--loop.loggers.save_dir", str(tmp_path / "tb")]  # fmt: skip
    _fit("--loop.run_dir", str(tmp_path / "run"), "--loop.wandb", "true", *tensorboard,
         "--fast_dev_run")  # fmt: skip
    (loop,) = seen
    assert len(loop.history) == 1 and loop.history[0]["round"] == 1
    assert loop.fit_config.local_steps == cli_runs.FAST_DEV_RUN_STEPS == 2
    assert not loop.reporter.extra_loggers and loop.reporter.wandb is False
    assert "fast_dev_run passed" in capsys.readouterr().out
    assert list(scratch.iterdir()) == []  # its directory went with it
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()


@pytest.mark.slow  # starts Ray
def test_seeds_on_ray_are_parallel_tasks_with_the_same_results(tmp_path, capsys):
    base = tmp_path / "ray"
    ray_backend = ["--loop.backend", "RayBackend", "--loop.backend.num_workers", "1"]
    _fit("--loop.rounds", "2", "--loop.run_dir", str(base), *ray_backend, "--seeds", "0", "3")
    out = capsys.readouterr().out
    assert re.search(r"seed [03]: test_acc \d\.\d{4}; run directory", out), out
    for seed in (0, 3):  # each ran sequentially inside its task: its config says so
        assert "SequentialBackend" in (base / f"seed_{seed}" / "config.yaml").read_text()
    _check_seeds(base, [0, 3], out, tmp_path)


def test_seeds_png_is_titled_as_plot_titles_with_the_seeds(tmp_path, monkeypatch):
    """``seeds.png``: the algorithm and setting, as ``fedlightning plot`` titles them, over the
    seeds, not the run directory's name and a column's (issue 38 item 5)."""
    from fedlightning.analysis import plots

    drawn = []
    save = plots.save
    monkeypatch.setattr(
        plots, "save", lambda fig, out, **kw: drawn.append((fig, out)) or save(fig, out)
    )
    _fit("--loop.rounds", "1", "--loop.run_dir", str(tmp_path / "sweep"), "--seeds", "0", "3")
    (fig,) = [fig for fig, out in drawn if Path(out).name == "seeds.png"]
    assert fig.axes[0].get_title() == (
        "FedAvg · digits, Dirichlet (β = 1), 8 clients (mean ± std over seeds 0, 3)"
    )
    assert fig.axes[0].get_ylabel() == "Test accuracy"
    assert (tmp_path / "sweep" / "seeds.png").read_bytes()[:4] == b"\x89PNG"
