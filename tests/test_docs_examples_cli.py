"""Every code example of the README and docs/algorithms.md runs through the CLI (issue 40 item 3):
each block that defines a plug-in is written, as it stands on the page, to a module of its own,
named by its class path on the command line, trained and resumed bit for bit; the README's Python
API block gives the same model as the CLI command with the same options. The plug-ins are typed
by their base classes, so examples without annotations parse."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import lightning
import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.cli import main
from fedlightning.clients import ClientModule

ROOT = Path(__file__).resolve().parents[1]
DOCS, README = ROOT / "docs" / "algorithms.md", ROOT / "README.md"
SEQUENTIAL = ("--loop.plots", "false", "--loop.backend", "fedlightning.backends.SequentialBackend")


def section(page: Path, heading: str) -> str:
    """The text of ``page`` under ``heading`` up to the next heading of its level or higher."""
    level = heading.split(" ", 1)[0]
    text = page.read_text().split(heading, 1)[1]
    return re.split(rf"\n#{{1,{len(level)}}} ", text, maxsplit=1)[0]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def as_module(code: str, name: str, folder: Path, monkeypatch) -> str:
    """``code`` written to ``folder/<name>.py``, importable as ``name`` (as a user's module on
    ``PYTHONPATH``); returns ``name``."""
    (folder / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(folder))
    return name


def global_bytes(run_dir: Path) -> bytes:
    return (run_dir / "global.pt").read_bytes()


def test_the_statistic_example_runs_through_the_cli_and_resumes(cli, tmp_path, monkeypatch):
    """docs 2.8's ``MeanAroundMedian`` (its ``combine`` has no annotations) named by class path
    under ``loop.aggregator.init_args.statistic``: the CLI builds what the page's Python line
    builds (the same model, bit for bit), and a resume continues it exactly."""
    (code,) = python_blocks(section(DOCS, "### 2.8 The server statistic"))
    module = as_module(code, "docs_statistic", tmp_path, monkeypatch)
    statistic = [
        "--loop.aggregator", "fedlightning.server.FedAdam",
        "--loop.aggregator.init_args.server_lr", "0.1",
        "--loop.aggregator.init_args.statistic", f"{module}.MeanAroundMedian",
        "--loop.aggregator.init_args.statistic.init_args.keep", "3",
    ]  # fmt: skip
    rows = cli(tmp_path / "straight", *SEQUENTIAL, *statistic, "--loop.rounds", "3")
    assert float(rows[-1]["test_acc"]) > 0.3  # chance is 0.1
    resumed = tmp_path / "resumed"
    cli(resumed, *SEQUENTIAL, *statistic, "--loop.rounds", "2")
    cli(resumed, *SEQUENTIAL, *statistic, "--loop.rounds", "3", "--ckpt_path",
        str(resumed / "last.ckpt"))  # fmt: skip
    assert global_bytes(resumed) == global_bytes(tmp_path / "straight")

    namespace: dict = {}
    exec(compile(code, str(DOCS), "exec"), namespace)  # the page's own `aggregator = ...` line
    python = tmp_path / "python"
    tiny_in_python(python, 3, namespace["aggregator"])
    assert global_bytes(python) == global_bytes(tmp_path / "straight")


def tiny_in_python(run_dir: Path, rounds: int, aggregator, **loop) -> None:
    """tests/conf/tiny.yaml written in Python, on the sequential backend."""
    from fedlightning.backends import SequentialBackend

    lightning.seed_everything(0, verbose=False)  # the initial model, as the CLI seeds it
    data = FederatedDataModule(dataset="digits", num_clients=8, partition="dirichlet", beta=1.0,
                               batch_size=32, seed=0)  # fmt: skip
    model = ClientModule(network="mlp", network_kwargs={"hidden": [64]}, lr=0.1, momentum=0.5,
                         num_classes=10, in_channels=1, image_size=8)  # fmt: skip
    FederatedLoop(
        rounds=rounds, clients_per_round=4, local_epochs=2, run_dir=str(run_dir),
        progress_bar=False, plots=False, aggregator=aggregator, backend=SequentialBackend(), **loop,
    ).fit(model, datamodule=data)  # fmt: skip


def test_the_python_api_block_is_the_cli_run_with_the_same_options(tmp_path, monkeypatch):
    """The README's Python API block, run as written but for its rounds, run directory and a
    backend named (the default chooses by timing), and the CLI with the same options give the
    same model bit for bit."""
    (code,) = python_blocks(section(README, "## Python API"))
    python = tmp_path / "python"
    for old, new in [
        ("rounds=30,", "rounds=2,"),
        ('"runs/api"', repr(str(python))),
        ("aggregator=FedAvg(),", "aggregator=FedAvg(), backend=SequentialBackend(),"),
    ]:
        assert old in code, old
        code = code.replace(old, new)
    from fedlightning.backends import SequentialBackend

    exec(compile(code, str(README), "exec"), {"SequentialBackend": SequentialBackend})
    sys.argv = ["fedlightning"]
    main([
        "fit", "--loop.rounds", "2", "--loop.clients_per_round", "10", "--loop.local_epochs", "2",
        "--loop.aggregator", "FedAvg", "--loop.seed", "0", "--loop.run_dir", str(tmp_path / "cli"),
        "--data.dataset", "digits", "--data.num_clients", "20", "--data.partition", "dirichlet",
        "--data.beta", "0.5", "--model", "ClientModule", "--model.network", "cnn",
        "--model.lr", "0.05", "--model.momentum", "0.5", *SEQUENTIAL,
    ])  # fmt: skip
    assert global_bytes(tmp_path / "cli") == global_bytes(python)
    assert torch.load(python / "last.ckpt", weights_only=True)["round"] == 2


NOT_A_PLUGIN = """
class Max:
    def combine(self, uploads, weights, context):
        return dict(uploads[0])


def make():
    return Max()
"""


@pytest.mark.parametrize(
    ("option", "given", "expected"),
    [
        ("--loop.aggregator.init_args.statistic", "Max", "a class derived from object, not a "
         "subclass of fedlightning.server.statistics.base.Statistic"),
        ("--loop.aggregator.init_args.statistic", "make", "a function, not a subclass of "
         "fedlightning.server.statistics.base.Statistic"),
        ("--loop.attack", "Max", "a class derived from object, not an attack (a subclass of "
         "fedlightning.attacks.Attack)"),
        ("--loop.components+", "Max", "a class derived from object, not a subclass of "
         "fedlightning.round_components.RoundComponent"),
    ],
)  # fmt: skip
def test_a_class_path_that_is_not_a_plugin_of_its_kind_says_what_it_is(
    option, given, expected, cli, tmp_path, monkeypatch, capsys
):
    module = as_module(NOT_A_PLUGIN, "not_a_plugin", tmp_path, monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "run", "--loop.aggregator", "FedAvg", option, f"{module}.{given}")
    assert exit_info.value.code == 2
    key = option.removeprefix("--").removesuffix("+")
    assert capsys.readouterr().err == (
        f"fedlightning: error: {key}: {module}.{given} is {expected}\n"
    )
    assert not (tmp_path / "run").exists()


def test_the_readme_plugins_run_through_the_cli(cli, tmp_path, monkeypatch):
    """The README's "Adding an algorithm" block (examples/plugins.py) named by class path: a
    label-smoothing objective and server momentum, trained and checkpointed with the momentum's
    declared state."""
    (code,) = python_blocks(section(README, "## Adding an algorithm"))
    module = as_module(code, "readme_plugins", tmp_path, monkeypatch)
    rows = cli(
        tmp_path / "run", *SEQUENTIAL, "--loop.rounds", "2",
        "--model.class_path", f"{module}.LabelSmoothing", "--model.init_args.eps", "0.1",
        "--loop.aggregator", f"{module}.ServerMomentum", "--loop.aggregator.beta", "0.5",
    )  # fmt: skip
    assert float(rows[-1]["test_acc"]) > 0.3  # chance is 0.1
    state = torch.load(tmp_path / "run" / "last.ckpt", weights_only=True)["aggregator"]
    assert state["velocity"] and all(v.abs().sum() > 0 for v in state["velocity"].values())


#: every section of the README and the docs with a ``python`` block, and the test above that
#: runs it through the CLI
COVERED = {
    (README, "## Python API"): test_the_python_api_block_is_the_cli_run_with_the_same_options,
    (README, "## Adding an algorithm"): test_the_readme_plugins_run_through_the_cli,
    (DOCS, "### 2.8 The server statistic"): test_the_statistic_example_runs_through_the_cli_and_resumes,
    (DOCS, "### 6.2 Round components: the round body and the features around it"): None,
}  # fmt: skip


def test_every_python_block_of_the_readme_and_docs_is_run_through_the_cli():
    """A new ``python`` block fails here until a test runs it through the CLI (section 6.2's is
    run by tests/test_round_components.py)."""
    found = set()
    for page in (README, DOCS):
        heading, fenced = "", False
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                if not fenced and line.startswith("```python"):
                    found.add((page, heading))
                fenced = not fenced
            elif line.startswith("#") and not fenced:
                heading = line
    assert found == set(COVERED)
