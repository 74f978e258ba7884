"""``fedlightning fit --seeds`` as solid as one ``fit`` (issue 43 item 3): SIGINT and SIGTERM stop
the sweep at any seed, and the commands it prints finish the sweep (the interrupted seed resumes
bit for bit); every seed's options and run directory are checked before the first seed trains; a
failing seed is named; the output survives an ASCII-only terminal; Ray missing is the one line a
run without ``--seeds`` gets. Real signals, sent by the process to itself from inside a run."""

import io
import os
import re
import shlex
import signal
import sys
from pathlib import Path

import pytest
import torch

from fedlightning.backends.sequential import SequentialBackend
from fedlightning.cli import main
from fedlightning.loop.reporting import Reporter

CONF = Path(__file__).parent / "conf" / "tiny.yaml"
SEQUENTIAL = ["--loop.backend", "SequentialBackend", "--loop.plots", "false"]


def _fit(*args: str) -> int:
    """``fedlightning fit -c tiny.yaml ARGS`` in this process; its exit status."""
    sys.argv = ["fedlightning"]
    try:
        main(["fit", "-c", str(CONF), *args])
    except SystemExit as stop:
        return stop.code
    return 0


def _run_printed(command: str) -> None:
    """Run a command the sweep printed (``fedlightning fit ...``), as a user pastes it."""
    words = shlex.split(command)
    assert words[:2] == ["fedlightning", "fit"], command
    sys.argv = ["fedlightning"]
    main(words[1:])


def _signal_at_fit_round(monkeypatch, call: int, signum: int) -> None:
    """The ``call``-th round the sequential backend runs in this process sends ``signum``."""
    real, calls = SequentialBackend.run, []

    def run(self, r, jobs):
        calls.append(r)
        if len(calls) == call:
            os.kill(os.getpid(), signum)
        return real(self, r, jobs)

    monkeypatch.setattr(SequentialBackend, "run", run)


def test_sigterm_in_a_later_seed_stops_the_sweep_and_its_commands_finish_it(
    tmp_path, capsys, monkeypatch
):
    """Before, a signal after the first seed was ignored: seed 1 ran to the end, exit 0."""
    base, rounds = tmp_path / "sweep", ["--loop.rounds", "3"]
    _signal_at_fit_round(monkeypatch, 5, signal.SIGTERM)  # seed 1's round 2
    code = _fit(*rounds, *SEQUENTIAL, "--loop.run_dir", str(base), "--seeds", "0", "1", "2")
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 143, err[-2000:]
    assert "Traceback" not in err
    assert re.search(
        rf"^fedlightning: --seeds 0 1 2 terminated \(SIGTERM\) in seed 1 after its round 1; "
        rf"seed 0 finished \({re.escape(str(base / 'seed_0'))}\)$", err, re.M,
    ), err  # fmt: skip
    resume = re.search(r"^fedlightning: to resume seed 1: (.*)$", err, re.M)[1]
    rest = re.search(r"^fedlightning: then to run seed 2: (.*)$", err, re.M)[1]
    assert resume.endswith(f"--loop.seed 1 --loop.run_dir {base / 'seed_1'} "
                           f"--ckpt_path {base / 'seed_1' / 'last.ckpt'}")  # fmt: skip
    assert rest.endswith(f"--loop.run_dir {base} --seeds 2")
    assert torch.load(base / "seed_1" / "last.ckpt", weights_only=True)["round"] == 1
    assert not (base / "seed_2").exists()
    _run_printed(resume)
    _run_printed(rest)
    straight = tmp_path / "straight"
    assert _fit(*rounds, *SEQUENTIAL, "--loop.seed", "1", "--loop.run_dir", str(straight)) == 0
    resumed = (base / "seed_1" / "global.pt").read_bytes()
    assert resumed == (straight / "global.pt").read_bytes()  # bit for bit
    assert (base / "seed_2" / "global.pt").is_file()


def test_a_signal_as_a_seed_finishes_stops_the_sweep_before_the_next(tmp_path, capsys, monkeypatch):
    """SIGINT while seed 0 prints its closing line (its files complete, where one ``fit``
    ignores it) is not lost: the sweep stops before seed 1, whose command then runs it."""
    base = tmp_path / "sweep"
    real_done = Reporter.done

    def done(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real_done(self, *args, **kwargs)

    monkeypatch.setattr(Reporter, "done", done)
    code = _fit("--loop.rounds", "2", *SEQUENTIAL, "--loop.run_dir", str(base), "--seeds", "0", "1")
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 130, err[-2000:]
    assert f"fedlightning: --seeds 0 1 interrupted; seed 0 finished ({base / 'seed_0'})\n" in err
    rest = re.search(r"^fedlightning: to run seed 1: (.*)$", err, re.M)[1]
    assert not (base / "seed_1").exists()
    _run_printed(rest)
    assert (base / "seed_1" / "global.pt").is_file()


@pytest.mark.parametrize("case", ["finished seed", "seed out of range"])
def test_every_seed_is_checked_before_the_first_trains(tmp_path, capsys, case):
    base = tmp_path / "sweep"
    if case == "finished seed":  # a sweep run again with one more seed
        assert _fit("--loop.rounds", "1", *SEQUENTIAL, "--loop.run_dir", str(base),
                    "--seeds", "1") == 0  # fmt: skip
        seeds, message = (
            ["0", "1"],
            (
                rf"seed 1 \({re.escape(str(base / 'seed_1'))}\) of --seeds 0 1: loop.run_dir='.*"
                r"seed_1' already holds another run's results \(metrics.csv, last.ckpt, global.pt, "
                r"models.pt\), and --seeds starts every seed afresh: replace them with --loop."
                r"overwrite true, or choose another --loop.run_dir; or resume that seed on its own: "
                r"fedlightning fit .*--loop.seed 1 --loop.run_dir \S+seed_1 --ckpt_path \S+last.ckpt$"
            ),
        )
    else:
        seeds = ["0", "4294967296"]
        message = r"seed 4294967296 .* loop.seed=4294967296 is not allowed: expected an integer in \[0, 4294967295\]"
    capsys.readouterr()
    code = _fit("--loop.rounds", "1", *SEQUENTIAL, "--loop.run_dir", str(base), "--seeds", *seeds)
    err = capsys.readouterr().err.strip()
    assert code == 2 and re.fullmatch(rf"fedlightning: error: {message}", err), err[-2000:]
    assert not (base / "seed_0").exists()  # nothing trained or written before the refusal


def test_a_failing_seed_is_named(tmp_path, capsys):
    base = tmp_path / "sweep"
    broken = ["--loop.aggregator", "user_clients.WrongServerUpdate",
              "--loop.aggregator.from_round", "2"]  # fmt: skip
    code = _fit("--loop.rounds", "2", *SEQUENTIAL, *broken, "--loop.run_dir", str(base),
                "--seeds", "3", "4")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err[-2000:]
    assert re.search(
        rf"^fedlightning: stopped: seed 3 \({re.escape(str(base / 'seed_3'))}\) of --seeds 3 4: "
        r".*WrongServerUpdate", err, re.M,
    ), err[-2000:]  # fmt: skip
    assert not (base / "seed_4").exists()


def test_the_sweep_and_fit_help_survive_an_ascii_terminal(tmp_path, monkeypatch):
    """Before, ``±`` raised UnicodeEncodeError: after every seed had trained, and in --help."""
    out, err = io.BytesIO(), io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="ascii"))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(err, encoding="ascii"))
    base = tmp_path / "sweep"
    code = _fit("--loop.rounds", "1", *SEQUENTIAL, "--loop.run_dir", str(base), "--seeds", "0", "1")
    help_code = _fit("--help")
    sys.stdout.flush(), sys.stderr.flush()
    printed, logged = out.getvalue().decode("ascii"), err.getvalue().decode("ascii")
    assert (code, help_code) == (0, 0), logged[-2000:]
    assert re.search(r"seeds 0, 1: test_acc \d\.\d{4} \+- \d\.\d{4} \(mean \+- sample std", printed)
    assert "then mean +- std); fedlightning list names" in " ".join(printed.split())


def test_ray_missing_is_the_one_line_of_a_run_without_seeds(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    ray = ["--loop.backend", "RayBackend", "--loop.rounds", "1"]
    lines = []
    for seeds in ([], ["--seeds", "0", "1"]):
        code = _fit(*ray, "--loop.run_dir", str(tmp_path / "run"), *seeds)
        lines.append((code, capsys.readouterr().err.strip()))
    assert (
        lines[0]
        == lines[1]
        == (
            2,
            "fedlightning: error: loop.backend=RayBackend needs Ray: install the extra with pip "
            "install 'fedlightning[ray]'",
        )
    )
    assert not (tmp_path / "run").exists()
