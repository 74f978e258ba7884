"""A resume changes nothing silently: through ``fedlightning fit`` as a user runs it, every option
that changes the result (an lr in a hand-edited config.yaml, local epochs, batch size, precision,
a ``**kwargs`` plug-in aggregator's option, InCo's inner aggregator, the backend's numerics) is
refused naming the option path and both values, writing nothing; the options that cannot change
it (rounds, evaluation cadence, logging, plots, a backend with the same numerics) resume bitwise
equal to a straight run, and config.yaml then describes the resumed invocation. A run started from
the CLI resumes from Python and the reverse, and the two forms of the config are the same."""

import re
import shutil
import sys
from pathlib import Path

import lightning
import pytest
import yaml

from conftest import overridden
from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
from fedlightning.backends import RayBackend, SequentialBackend
from fedlightning.cli import FederatedCLI, main
from fedlightning.errors import ConfigurationError
from fedlightning.loop.rundir import MARK
from fedlightning.run_config import resolved_config
from fedlightning.server import FedAvgM, InCo
from user_clients import ServerNesterov, SmoothedCE

CONF = Path(__file__).parent / "conf"
QUIET = ["--loop.plots", "false", "--loop.progress_bar", "false"]


def fit(run_dir: Path, *args: str, config: str | Path = CONF / "tiny.yaml") -> None:
    sys.argv = ["fedlightning"]
    options = overridden(["--loop.run_dir", str(run_dir), *QUIET, *args])
    main(["fit", "--config", str(config), *options])


def files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Finished 2-round runs to resume: the tiny MLP, with a ``**kwargs`` plug-in aggregator,
    and InCo over heterogeneous ResNets."""
    root = tmp_path_factory.mktemp("runs")
    fit(root / "tiny", "--loop.rounds", "2")
    fit(root / "plugin", "--loop.rounds", "2", "--loop.aggregator", "user_clients.ServerNesterov")
    fit(root / "inco", "--loop.rounds", "1", config=CONF / "inco_tiny.yaml")
    return root


CHANGED = {
    "lr in config.yaml": ("tiny", ["model.init_args.lr", "0.1", "0.05"], []),
    "local_epochs": ("tiny", ["loop.local_epochs", "2", "1"], ["--loop.local_epochs", "1"]),
    "batch_size": ("tiny", ["data.batch_size", "32", "16"], ["--data.batch_size", "16"]),
    "precision": (
        "tiny", ["loop.precision", "'32-true'", "'bf16-mixed'"], ["--loop.precision", "bf16-mixed"]
    ),
    "clients_per_round": (
        "tiny", ["loop.clients_per_round", "4", "6"], ["--loop.clients_per_round", "6"]
    ),
    "cohort backend": (
        "tiny",
        ["loop.backend", "'fedlightning.backends.AutoBackend'", "'fedlightning.backends.CohortBackend'"],
        ["--loop.backend", "CohortBackend"],
    ),
    "plug-in weighting": (
        "plugin",
        ["loop.aggregator.init_args.weighting", "'samples'", "'uniform'"],
        ["--loop.aggregator", "user_clients.ServerNesterov", "--loop.aggregator.weighting", "uniform"],
    ),
    "InCo inner option": (
        "inco",
        ["loop.aggregator.init_args.inner.init_args.weighting", "'uniform'", "'samples'"],
        ["--loop.aggregator.init_args.inner.init_args.weighting", "samples"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CHANGED)
def test_a_resume_that_changes_the_result_is_refused_naming_the_option(runs, case, capsys):
    run, (option, old, new), args = CHANGED[case]
    run_dir = runs / run
    config = CONF / ("inco_tiny.yaml" if run == "inco" else "tiny.yaml")
    before = files(run_dir)
    edited = None
    if case == "lr in config.yaml":  # the user edits the run's own config.yaml and resumes with it
        edited = run_dir / "config.yaml"
        edited.write_text(edited.read_text().replace("lr: 0.1\n", "lr: 0.05\n"))
        config, before = edited, files(run_dir)
    with pytest.raises(SystemExit) as exit_info:
        fit(run_dir, "--loop.rounds", "3", "--ckpt_path", str(run_dir / "last.ckpt"), *args,
            config=config)  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(
        rf"^fedlightning: error: ckpt_path='\S+' was written by another run: {re.escape(option)} "
        rf"is {re.escape(old)} in the checkpoint but {re.escape(new)} in this run; .*"
        r"--loop.overwrite true.* another --loop.run_dir$",
        err,
        re.M,
    ), err
    assert files(run_dir) == before  # nothing written: config.yaml, metrics, checkpoint
    if edited is not None:
        edited.write_text(edited.read_text().replace("lr: 0.05\n", "lr: 0.1\n"))


def test_rounds_cadence_logging_and_backend_may_change_and_the_resume_is_exact(tmp_path):
    fit(tmp_path / "straight", "--loop.rounds", "4")
    resumed = tmp_path / "resumed"
    fit(resumed, "--loop.rounds", "2")
    fit(resumed, "--loop.rounds", "4", "--ckpt_path", str(resumed / "last.ckpt"),
        "--loop.eval_every", "3", "--loop.log_every", "2", "--loop.plots", "true",
        "--loop.checkpoint_every", "2", "--loop.target_acc", "0.5",
        "--loop.backend", "SequentialBackend")  # fmt: skip
    assert (resumed / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()
    text = (resumed / "config.yaml").read_text()
    assert text.startswith(MARK)
    config = yaml.safe_load(text)  # the resumed invocation's config, not the first run's
    assert config["loop"]["rounds"] == 4 and config["loop"]["eval_every"] == 3
    assert config["loop"]["backend"]["class_path"] == "fedlightning.backends.SequentialBackend"
    assert (resumed / "curves.png").exists()


@pytest.mark.parametrize("rounds", [1, 2])
def test_a_resume_that_trains_nothing_rewrites_no_file(runs, tmp_path, caplog, rounds):
    """A 2-round run resumed with --loop.rounds 1 (or 2) trains nothing: it exits 0 with one
    line saying so, and config.yaml and every result file stay as they were, byte for byte
    (config.yaml went on saying rounds: 2)."""
    run_dir = tmp_path / "tiny"
    shutil.copytree(runs / "tiny", run_dir)
    before = files(run_dir)
    fit(run_dir, "--loop.rounds", str(rounds), "--ckpt_path", str(run_dir / "last.ckpt"))
    assert files(run_dir) == before
    line = (
        f"nothing to train: {run_dir / 'last.ckpt'} has 2 round(s) done and "
        f"loop.rounds={rounds}; {run_dir} is left as it was"
    )
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [line]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["loop"]["rounds"] == 2


def _python_run(run_dir: Path, rounds: int, ckpt_path: str | None = None, lr: float = 0.1):
    """tests/conf/tiny.yaml written in Python."""
    lightning.seed_everything(0, verbose=False)  # the initial model, as the CLI seeds it
    data = FederatedDataModule(dataset="digits", num_clients=8, partition="dirichlet", beta=1.0,
                               batch_size=32, seed=0)  # fmt: skip
    model = ClientModule(network="mlp", network_kwargs={"hidden": [64]}, lr=lr, momentum=0.5,
                         num_classes=10, in_channels=1, image_size=8)  # fmt: skip
    loop = FederatedLoop(rounds=rounds, clients_per_round=4, local_epochs=2, run_dir=str(run_dir),
                         progress_bar=False, plots=False)  # fmt: skip
    loop.fit(model, datamodule=data, ckpt_path=ckpt_path)


def test_a_cli_run_resumes_from_python_and_the_reverse(tmp_path):
    fit(tmp_path / "straight", "--loop.rounds", "4")
    cli_first, python_first = tmp_path / "cli_first", tmp_path / "python_first"
    fit(cli_first, "--loop.rounds", "2")
    with pytest.raises(
        ConfigurationError, match=r"model.init_args.lr is 0.1 in the checkpoint but 0.2"
    ):
        _python_run(cli_first, 4, str(cli_first / "last.ckpt"), lr=0.2)
    _python_run(cli_first, 4, str(cli_first / "last.ckpt"))
    _python_run(python_first, 2)
    fit(python_first, "--loop.rounds", "4", "--ckpt_path", str(python_first / "last.ckpt"))
    straight = (tmp_path / "straight" / "global.pt").read_bytes()
    assert (cli_first / "global.pt").read_bytes() == straight
    assert (python_first / "global.pt").read_bytes() == straight


def _nested_python_aggregator():
    return InCo(inner=FedAvgM(server_lr=0.5))


@pytest.mark.parametrize(
    ("args", "model", "aggregator", "backend"),
    [
        (["--model", "user_clients.SmoothedCE", "--loop.aggregator", "user_clients.ServerNesterov",
          "--loop.aggregator.weighting", "uniform", "--loop.backend", "SequentialBackend"],
         SmoothedCE, lambda: ServerNesterov(weighting="uniform"), SequentialBackend),
        (["--loop.aggregator", "fedlightning.server.InCo", "--loop.aggregator.inner",
          "fedlightning.server.FedAvgM", "--loop.aggregator.inner.server_lr", "0.5",
          "--loop.backend", "RayBackend", "--loop.backend.num_workers", "2"],
         ClientModule, _nested_python_aggregator, lambda: RayBackend(num_workers=2)),
    ],
    ids=["kwargs-plugins", "nested"],
)  # fmt: skip
def test_the_cli_and_python_forms_of_a_config_are_the_same(args, model, aggregator, backend):
    """tests/conf/tiny.yaml and ``args`` from the CLI, and the same options written in Python
    (only the arguments a user passes: defaults, ``**kwargs`` and the links are filled in)."""
    sys.argv = ["fedlightning"]
    cli = FederatedCLI(
        args=["--config", str(CONF / "tiny.yaml"), "--loop.run_dir", "runs/x", *QUIET, *args],
        run=False,
    )
    cli.trainer.config_text = cli.resolved_config()
    from_cli = resolved_config(cli.trainer.parts(), cli.model, cli.datamodule)
    loop = FederatedLoop(rounds=4, clients_per_round=4, local_epochs=2, run_dir="runs/x",
                         progress_bar=False, plots=False, aggregator=aggregator(),
                         backend=backend())  # fmt: skip
    objective = model(network="mlp", network_kwargs={"hidden": [64]}, lr=0.1, momentum=0.5)
    data = FederatedDataModule(dataset="digits", num_clients=8, partition="dirichlet", beta=1.0,
                               batch_size=32)  # fmt: skip
    assert resolved_config(loop.parts(), objective, data) == from_cli
    init_args = from_cli["loop"]["aggregator"]["init_args"]
    if "inner" in init_args:  # InCo's inner aggregator, with the FedAvg arguments it inherits
        assert init_args["inner"]["init_args"]["server_lr"] == 0.5
        assert init_args["inner"]["init_args"]["weighting"] == "samples"
    else:  # the **kwargs plug-in: its own argument and its parent's, defaults filled in
        assert init_args["beta"] == 0.5 and init_args["weighting"] == "uniform"
        assert init_args["aggregation"] == "mean"


def test_the_users_config_yaml_inside_the_run_directory_is_never_overwritten(tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    own = exp / "config.yaml"
    shutil.copy(CONF / "tiny.yaml", own)
    before = own.read_bytes()
    for extra in ([], ["--loop.overwrite", "true"]):
        with pytest.raises(SystemExit) as exit_info:
            fit(exp, "--loop.rounds", "1", *extra, config=own)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "holds a config.yaml that fedlightning did not write" in err, err
        assert "move your config out of the run directory" in err
        assert own.read_bytes() == before and sorted(p.name for p in exp.iterdir()) == [
            "config.yaml"
        ]
    # fedlightning cofed writes config.yaml too: the same refusal
    cofed_config = tmp_path / "cofed" / "config.yaml"
    cofed_config.parent.mkdir()
    shutil.copy(CONF / "cofed_tabular_tiny.yaml", cofed_config)
    with pytest.raises(SystemExit) as exit_info:
        main(["cofed", "-c", str(cofed_config), "--run_dir", str(cofed_config.parent),
              "--overwrite", "true"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "run_dir=" in (err := capsys.readouterr().err) and "did not write" in err, err
    assert cofed_config.read_bytes() == (CONF / "cofed_tabular_tiny.yaml").read_bytes()
    # the same user config from outside: the run writes its own, marked, config.yaml beside it
    moved = tmp_path / "mine.yaml"
    own.rename(moved)
    fit(exp, "--loop.rounds", "1", config=moved)
    assert (exp / "config.yaml").read_text().startswith(MARK)
    # the run's own config.yaml, used from inside its directory, resumes it (and is rewritten)
    fit(
        exp, "--loop.rounds", "2", "--ckpt_path", str(exp / "last.ckpt"), config=exp / "config.yaml"
    )
    assert yaml.safe_load((exp / "config.yaml").read_text())["loop"]["rounds"] == 2
