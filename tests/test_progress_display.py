"""The progress a run shows (issue 34 items 4 and 7): on a terminal a bar with the remaining time
and the latest loss; in Jupyter one display per fit, updated in place each round and closed by the
summary (a line per round made 34 outputs in notebook 01's fit cell)."""

import re

import pytest
from rich.console import Console

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.clients import ClientModule
from fedlightning.loop import progress as progress_module
from fedlightning.loop.progress import latest, rich_bar
from objective_helpers import SYNTHETIC


def fit(tmp_path, rounds, progress_bar):
    data = FederatedDataModule(
        dataset="synthetic", num_samples=240, num_test=60, num_classes=3, sample_shape=(6,),
        num_clients=4, partition="iid",
    )  # fmt: skip
    loop = FederatedLoop(rounds=rounds, clients_per_round=2, run_dir=str(tmp_path), plots=False,
                         progress_bar=progress_bar)  # fmt: skip
    loop.fit(ClientModule(**SYNTHETIC), datamodule=data)


def test_the_terminal_bar_shows_remaining_time_and_the_latest_loss():
    console = Console(record=True, force_terminal=True, width=160, color_system=None)
    with rich_bar(console, total=4, start=0, enabled=True) as advance:
        advance({"round": 1, "test_acc": 0.5, "train_loss": 1.25})
        advance({"round": 2, "test_acc": 0.625, "train_loss": 0.75})
    text = console.export_text()
    final = [line for line in text.splitlines() if "2/4" in line][-1]
    assert re.search(r"2/4 \d:\d\d:\d\d < \d:\d\d:\d\d test_acc 0\.6250  train_loss 0\.7500", final)
    assert latest({"test_acc": 0.5, "train_loss": float("nan")}) == "test_acc 0.5000"


class FakeHandle:
    """Records what a Jupyter display shows: the first text and each in-place update."""

    shown: list[str] = []
    displays = 0

    def update(self, obj, raw=False):
        FakeHandle.shown.append(obj["text/plain"])


@pytest.fixture
def jupyter(monkeypatch):
    import IPython.display

    FakeHandle.shown, FakeHandle.displays = [], 0

    def display(obj, raw=False, display_id=False):
        assert raw and display_id
        FakeHandle.displays += 1
        FakeHandle.shown.append(obj["text/plain"])
        return FakeHandle()

    monkeypatch.setattr(IPython.display, "display", display)
    monkeypatch.setattr(progress_module, "output_mode", lambda console: "notebook")
    monkeypatch.setattr("fedlightning.loop.reporting.output_mode", lambda console: "notebook")
    return FakeHandle


def test_a_notebook_fit_is_one_display_updated_each_round(tmp_path, jupyter, capsys):
    fit(tmp_path, rounds=3, progress_bar=True)
    assert jupyter.displays == 1
    rounds = [text.splitlines()[0] for text in jupyter.shown]
    assert rounds[0] == "round 0/3"
    assert [r.split()[1] for r in rounds[1:4]] == ["1/3", "2/3", "3/3"]
    assert "test_acc" in rounds[1] and "train_loss" in rounds[1] and "left" in rounds[1]
    final = jupyter.shown[-1].splitlines()
    assert final[0].startswith("round 3/3") and final[-1].startswith("done: round 3/3")
    assert any(line.startswith("summary:") for line in final)
    assert "round 1/3 test_acc" not in capsys.readouterr().err  # no plain log lines besides


def test_a_notebook_fit_without_progress_shows_only_its_closing_lines(tmp_path, jupyter):
    fit(tmp_path, rounds=2, progress_bar=False)
    assert jupyter.displays == 1
    assert jupyter.shown[-1].splitlines()[-1].startswith("done: round 2/2")
    assert not any(text.startswith("round ") for text in jupyter.shown)
