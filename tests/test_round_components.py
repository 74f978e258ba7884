"""Round components (docs/algorithms.md section 6.2): the worked example of the docs, written to a
module of its own as a user would, is configured through the CLI (``loop.components``) with no
edit of the library; its column is checked against the clients drawn independently, its declared
state survives a resume bit for bit, and a resume that adds or drops it is refused in one line; a
checkpoint written before round components (their states under ``meters``) still resumes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fedlightning.loop.sampling import sample_clients

DOCS = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
SHORT = ("--loop.plots", "false", "--loop.backend", "fedlightning.backends.SequentialBackend")


@pytest.fixture
def meter(tmp_path, monkeypatch) -> list[str]:
    """The docs' worked example written, as it stands on the page, to the module ``mymeters``
    on the path; returns the options that add it to a run."""
    text = DOCS.read_text()
    match = re.search(r"<!-- round-component-example -->\n```python\n(.*?)```", text, re.S)
    assert match is not None, "the worked example is missing from docs/algorithms.md"
    (tmp_path / "mymeters.py").write_text(match[1])
    monkeypatch.syspath_prepend(str(tmp_path))
    return ["--loop.components+", "mymeters.ParticipationMeter"]


def _seen(rounds: int) -> list[float]:
    """clients_seen after each round, from the sampling drawn independently (seed 0, 8 clients,
    4 a round: tests/conf/tiny.yaml)."""
    seen: set[int] = set()
    counts = []
    for r in range(rounds):
        seen.update(sample_clients(0, r, 8, 4))
        counts.append(float(len(seen)))
    return counts


def test_the_docs_meter_counts_the_clients_drawn_and_resumes(cli, tmp_path, meter):
    straight = cli(tmp_path / "straight", *SHORT, *meter, "--loop.rounds", "3")
    assert [float(row["clients_failed"]) for row in straight] == [0.0] * 3
    assert [float(row["clients_seen"]) for row in straight] == _seen(3)
    assert _seen(3)[0] < _seen(3)[-1]  # the meter's state grows over rounds

    resumed = tmp_path / "resumed"
    cli(resumed, *SHORT, *meter, "--loop.rounds", "2")
    rows = cli(resumed, *SHORT, *meter, "--loop.rounds", "3", "--ckpt_path",
               str(resumed / "last.ckpt"))  # fmt: skip
    assert [float(row["clients_seen"]) for row in rows] == _seen(3)
    checkpoint = torch.load(resumed / "last.ckpt", weights_only=True)
    seen = set().union(*(sample_clients(0, r, 8, 4) for r in range(3)))
    assert checkpoint["components"]["participation"] == {"seen": sorted(seen)}
    assert checkpoint["identity"]["components"][-1] == {
        "class_path": "mymeters.ParticipationMeter", "init_args": {"column": "clients_seen"},
    }  # fmt: skip
    assert (resumed / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()


@pytest.mark.parametrize(
    ("first", "then", "why"),
    [
        ([], ["--loop.components+", "mymeters.ParticipationMeter"],
         r"its round components are \[TargetTracker\] in the checkpoint but \[TargetTracker, "
         r"ParticipationMeter\] in this run \(ParticipationMeter added: its state would start "
         r"afresh mid-run\)"),
        (["--loop.components+", "mymeters.ParticipationMeter"], [],
         r"its round components are \[TargetTracker, ParticipationMeter\] in the checkpoint but "
         r"\[TargetTracker\] in this run \(ParticipationMeter removed: its state and columns "
         r"would end mid-run\)"),
        (["--loop.components+", "mymeters.ParticipationMeter"],
         ["--loop.components+", "mymeters.ParticipationMeter", "--loop.components.column", "n"],
         r"the round component ParticipationMeter's option column is 'clients_seen' in the "
         r"checkpoint but 'n' in this run"),
        ([], ["--loop.components+", "fedlightning.loop.components.TargetTracker",
              "--loop.components.metric", "val_acc"],
         r"the round component TargetTracker's option metric is 'test_acc' in the checkpoint but "
         r"'val_acc' in this run"),
    ],
    ids=["added", "removed", "changed", "tracker-metric"],
)  # fmt: skip
def test_a_resume_with_other_components_is_refused_naming_it(
    first, then, why, cli, tmp_path, meter, capsys
):
    run = tmp_path / "run"
    cli(run, *SHORT, *first, "--loop.rounds", "1")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(SystemExit) as exit_info:
        cli(run, *SHORT, *then, "--loop.rounds", "2", "--ckpt_path", str(run / "last.ckpt"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"fedlightning: error: ckpt_path='\S+' was written by another run: {why}; resume with "
        r"the components the checkpoint's run had \(docs/algorithms.md section 6.2\), or replace "
        r"this run .*another --loop.run_dir",
        err,
    ), err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_the_target_is_one_option_in_either_spelling_and_may_change_on_resume(cli, tmp_path):
    """``loop.target_acc`` is the tracker's ``target``: the same rows as the listed tracker, and a
    resume may set it (the tracker times every round), in the other spelling too."""
    tracker = ["--loop.components+", "fedlightning.loop.components.TargetTracker",
               "--loop.components.target", "0.5"]  # fmt: skip
    short = cli(tmp_path / "short", *SHORT, "--loop.target_acc", "0.5", "--loop.rounds", "2")
    listed = cli(tmp_path / "listed", *SHORT, *tracker, "--loop.rounds", "2")
    drop = ("round_time_s", "time_to_target_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in short] == [
        {k: v for k, v in r.items() if k not in drop} for r in listed
    ]
    assert short[0]["rounds_to_target"] == "1.0"
    resumed = tmp_path / "resumed"
    cli(resumed, *SHORT, "--loop.rounds", "1")
    rows = cli(resumed, *SHORT, *tracker, "--loop.rounds", "2", "--ckpt_path",
               str(resumed / "last.ckpt"))  # fmt: skip
    assert rows[-1]["rounds_to_target"] == "2.0"  # reached in the resumed round
    assert float(rows[-1]["time_to_target_s"]) > float(rows[-1]["round_time_s"])  # both rounds


def test_a_checkpoint_with_the_former_meters_key_resumes_their_totals(cli, tmp_path):
    straight = cli(tmp_path / "straight", *SHORT, "--loop.rounds", "3")
    run = tmp_path / "run"
    cli(run, *SHORT, "--loop.rounds", "2")
    checkpoint = torch.load(run / "last.ckpt", weights_only=True)
    assert checkpoint["components"]["communication"]["sent_total"] > 0
    checkpoint["meters"] = checkpoint.pop("components")  # as written before round components
    torch.save(checkpoint, run / "last.ckpt")
    rows = cli(run, *SHORT, "--loop.rounds", "3", "--ckpt_path", str(run / "last.ckpt"))
    for column in ("comm_sent_total", "comm_received_total"):
        assert rows[-1][column] == straight[-1][column], column


def test_a_checkpoint_from_before_the_runs_path_was_recorded_resumes(cli, tmp_path):
    """An always-on built-in cannot be added or dropped by a run, so a checkpoint without its
    state was written by a library before it existed: the run's path (``RunPath``) then starts
    afresh (the resumed rounds only), and the model is the straight run's."""
    straight = tmp_path / "straight"
    cli(straight, *SHORT, "--loop.rounds", "3")
    full = torch.load(straight / "last.ckpt", weights_only=True)["components"]["run_path"]
    assert full == {"segments": [["sequential", 1, 3]]}
    run = tmp_path / "run"
    cli(run, *SHORT, "--loop.rounds", "2")
    checkpoint = torch.load(run / "last.ckpt", weights_only=True)
    del checkpoint["components"]["run_path"]
    torch.save(checkpoint, run / "last.ckpt")
    cli(run, *SHORT, "--loop.rounds", "3", "--ckpt_path", str(run / "last.ckpt"))
    resumed = torch.load(run / "last.ckpt", weights_only=True)["components"]["run_path"]
    assert resumed == {"segments": [["sequential", 3, 3]]}
    assert (run / "global.pt").read_bytes() == (straight / "global.pt").read_bytes()


def test_a_checkpoint_from_before_components_were_in_the_identity_resumes(cli, tmp_path, capsys):
    """Checkpoints of the current format whose identity has no ``components`` (and whose config
    has no ``loop.components``) resume: their adversary and target are read from
    ``loop.attack`` and ``loop.target_acc``; another attack is still refused."""

    def attack(fraction: str = "0.25") -> list[str]:
        return ["--loop.attack", "fedlightning.attacks.SignFlip",
                "--loop.attack.init_args.fraction", fraction]  # fmt: skip

    straight = tmp_path / "straight"
    cli(straight, *SHORT, *attack(), "--loop.target_acc", "0.5", "--loop.rounds", "2")
    run = tmp_path / "run"
    cli(run, *SHORT, *attack(), "--loop.target_acc", "0.5", "--loop.rounds", "1")
    checkpoint = torch.load(run / "last.ckpt", weights_only=True)
    del checkpoint["identity"]["components"], checkpoint["identity"]["config"]["loop"]["components"]
    torch.save(checkpoint, run / "last.ckpt")
    resume = ["--loop.rounds", "2", "--ckpt_path", str(run / "last.ckpt")]
    with pytest.raises(SystemExit):
        cli(run, *SHORT, *attack("0.5"), *resume)
    assert (
        "the round component Adversary's option attack.init_args.fraction "
        "(loop.attack.init_args.fraction) is 0.25 in the checkpoint but 0.5 in this run"
    ) in capsys.readouterr().err
    cli(run, *SHORT, *attack(), "--loop.target_acc", "0.6", *resume)  # the target may change
    assert (run / "global.pt").read_bytes() == (straight / "global.pt").read_bytes()


def test_the_docs_yaml_configures_the_meter_and_the_tracker(cli, tmp_path, meter):
    """Section 6.2's YAML block, as a config file after tests/conf/tiny.yaml."""
    block = re.search(r"```yaml\n(loop:\n  components:.*?)```", DOCS.read_text(), re.S)
    assert block is not None
    (tmp_path / "components.yaml").write_text(block[1])
    rows = cli(tmp_path / "run", *SHORT, "--config", str(tmp_path / "components.yaml"),
               "--loop.rounds", "2")  # fmt: skip
    assert [float(row["clients_seen"]) for row in rows] == _seen(2)
    assert "rounds_to_target" in rows[-1]  # the tracker's target 0.9: not reached, NaN
