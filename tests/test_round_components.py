"""Round components (docs/algorithms.md section 6.2): the worked example of the docs, run as
written, is a new meter with no edit of the round body; its column is checked against the
clients drawn independently, and its state survives a resume; a checkpoint written before round
components (their states under ``meters``) still resumes with the meters' totals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fedlightning.loop import components
from fedlightning.loop.sampling import sample_clients

DOCS = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
SHORT = ("--loop.plots", "false", "--loop.backend", "fedlightning.backends.SequentialBackend")


def _example() -> type:
    """The docs' worked example, executed as it is written there."""
    text = DOCS.read_text()
    match = re.search(r"<!-- round-component-example -->\n```python\n(.*?)```", text, re.S)
    assert match is not None, "the worked example is missing from docs/algorithms.md"
    namespace: dict = {}
    exec(compile(match[1], str(DOCS), "exec"), namespace)
    return namespace["ParticipationMeter"]


@pytest.fixture
def with_meter(monkeypatch):
    """The example's one line in the list, before the checkpoint writer."""
    meter = _example()
    *others, writer = components.COMPONENTS
    monkeypatch.setattr(components, "COMPONENTS", (*others, lambda c: meter(), writer))


def _seen(rounds: int) -> list[float]:
    """clients_seen after each round, from the sampling drawn independently (seed 0, 8 clients,
    4 a round: tests/conf/tiny.yaml)."""
    seen: set[int] = set()
    counts = []
    for r in range(rounds):
        seen.update(sample_clients(0, r, 8, 4))
        counts.append(float(len(seen)))
    return counts


def test_the_docs_meter_counts_the_clients_drawn_and_resumes(cli, tmp_path, with_meter):
    straight = cli(tmp_path / "straight", *SHORT, "--loop.rounds", "3")
    assert [float(row["clients_failed"]) for row in straight] == [0.0] * 3
    assert [float(row["clients_seen"]) for row in straight] == _seen(3)
    assert _seen(3)[0] < _seen(3)[-1]  # the meter's state grows over rounds

    resumed = tmp_path / "resumed"
    cli(resumed, *SHORT, "--loop.rounds", "2")
    rows = cli(resumed, *SHORT, "--loop.rounds", "3", "--ckpt_path", str(resumed / "last.ckpt"))
    assert [float(row["clients_seen"]) for row in rows] == _seen(3)
    checkpoint = torch.load(resumed / "last.ckpt", weights_only=True)
    seen = set().union(*(sample_clients(0, r, 8, 4) for r in range(3)))
    assert checkpoint["components"]["participation"] == {"seen": sorted(seen)}
    assert (resumed / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()


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
