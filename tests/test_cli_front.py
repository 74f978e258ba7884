"""The front door: `fedlightning --help`/`--version`, -c on every subcommand, a bare `fit`,
help text without RST markup, and `--print_config` as the run will use it."""

import re
import sys
from pathlib import Path

import pytest
import yaml

from fedlightning import (
    ClientModule,
    ConfigurationError,
    FederatedDataModule,
    FederatedLoop,
    __version__,
)
from fedlightning.cli import main
from fedlightning.cli.help import FIT_EPILOG, SUBCOMMANDS, plain

ROOT = Path(__file__).parents[1]
RST = re.compile(r"``|:(func|class|mod|meth|attr):")


def run_main(capsys, *args):
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_help_lists_every_subcommand_and_version(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    for name in ("fit", "cofed", "plot", "flower-app", "list", "test"):
        assert re.search(rf"^  {name}\s+\S", out, re.M), out
    assert set(SUBCOMMANDS) == {"fit", "cofed", "plot", "flower-app", "list", "test"}
    code, out, _ = run_main(capsys, "--version")
    assert code == 0 and out.strip() == f"fedlightning {__version__}"


def test_bare_fit_points_at_configs(capsys):
    code, _, err = run_main(capsys, "fit")
    assert code == 2 and "configs/quickstart.yaml" in err and "fit.model" not in err
    assert "--fast_dev_run" in err and "--seeds 0 1 2" in err


def test_fit_help_ends_with_the_options_fedlightning_adds(capsys):
    code, out, _ = run_main(capsys, "fit", "--help")
    assert code == 0
    assert " ".join(out.split()[-30:]).endswith(" ".join(FIT_EPILOG.split()[-30:]))


@pytest.mark.parametrize("command", ["fit", "cofed", "plot", "flower-app"])
def test_help_is_plain_text_and_takes_c(capsys, command):
    code, out, _ = run_main(capsys, command, "--help")
    assert code == 0
    assert "-c CONFIG, --config CONFIG" in out or "-c CONFIG" in out
    assert not RST.search(out), RST.search(out)


def test_plain_strips_markup():
    text = "see :func:`~fedlightning.training.cpu_compute` and :mod:`fedlightning.cofed.cli`; ``x``"
    assert plain(text) == "see cpu_compute and fedlightning.cofed.cli; x"
    assert plain("`docs <https://x.org>`_") == "docs (https://x.org)"


def test_cofed_takes_c(capsys):
    code, out, _ = run_main(
        capsys, "cofed", "-c", str(ROOT / "configs/cofed.yaml"), "--print_config"
    )
    assert code == 0 and "participants" in out


def test_print_config_is_resolved(capsys):
    code, out, _ = run_main(
        capsys, "fit", "-c", str(ROOT / "configs/quickstart.yaml"), "--print_config",
        "--data.num_clients", "7", "--loop.seed", "3",
    )  # fmt: skip
    assert code == 0
    config = yaml.safe_load(out)
    assert config["loop"]["run_dir"] == "runs/quickstart"
    model = config["model"]["init_args"]
    assert (model["num_classes"], model["in_channels"], model["image_size"]) == (10, 1, 8)
    assert config["data"]["seed"] == 3 and config["data"]["num_clients"] == 7
    # what runs where the config says nothing: the loop's AutoBackend, not `null`
    assert config["loop"]["backend"]["class_path"] == "fedlightning.backends.AutoBackend"


def test_print_config_without_data_says_why(capsys):
    code, out, _ = run_main(
        capsys, "fit", "-c", str(ROOT / "configs/experiments/fedcross_cifar10_cnn.yaml"),
        "--data.root", "/nonexistent", "--print_config",
    )  # fmt: skip
    assert code == 0
    assert "run_dir: runs/fedcross_cifar10_cnn" in out
    assert "linked from the data, which could not be read" in out and "cifar10" in out


def test_python_api_run_writes_config_yaml(tmp_path):
    data = FederatedDataModule(dataset="digits", num_clients=4, partition="iid", seed=1)
    model = ClientModule(network="mlp", num_classes=10, in_channels=1, image_size=8, lr=0.1)
    loop = FederatedLoop(rounds=1, clients_per_round=2, run_dir=str(tmp_path), progress_bar=False,
                         plots=False, seed=1)  # fmt: skip
    loop.fit(model, datamodule=data)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["loop"]["rounds"] == 1 and config["loop"]["run_dir"] == str(tmp_path)
    assert config["loop"]["aggregator"]["class_path"] == "fedlightning.server.FedAvg"
    assert config["model"]["class_path"] == "fedlightning.clients.ClientModule"
    assert config["model"]["init_args"]["network"] == "mlp"
    assert config["data"]["num_clients"] == 4 and config["data"]["seed"] == 1


def test_a_second_python_api_run_is_refused_with_the_python_api_s_advice(tmp_path):
    """The README's Python block run twice: the refusal names the Python arguments that resume,
    replace or move the run, not the command-line options."""

    def run():
        data = FederatedDataModule(dataset="digits", num_clients=4, partition="iid", seed=1)
        model = ClientModule(network="mlp", num_classes=10, in_channels=1, image_size=8)
        loop = FederatedLoop(rounds=1, clients_per_round=2, run_dir=str(tmp_path / "api"),
                             progress_bar=False, plots=False)  # fmt: skip
        loop.fit(model, datamodule=data)

    run()
    with pytest.raises(ConfigurationError) as refused:
        run()
    message = str(refused.value)
    assert message.startswith(f"run_dir={str(tmp_path / 'api')!r} already holds another run's")
    assert f"fit(..., ckpt_path={str(tmp_path / 'api' / 'last.ckpt')!r})" in message
    assert "FederatedLoop(..., overwrite=True), or give FederatedLoop another run_dir" in message
    assert "--" not in message


def test_cli_run_keeps_its_parsed_config(cli, tmp_path):
    cli(tmp_path / "r", "--loop.rounds", "1", "--loop.plots", "false")
    text = (tmp_path / "r" / "config.yaml").read_text()
    assert "Python API" not in text and "ckpt_path" in text
