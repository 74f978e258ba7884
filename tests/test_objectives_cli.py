"""The client objectives end to end through the CLI: resume, personal accuracy, pairing, configs."""

import re
from pathlib import Path

import pytest
import torch

from fedlightning.clients import ClientModule, FedNovaClient, ScaffoldClient
from fedlightning.errors import ConfigurationError
from fedlightning.server import FedAvg, FedNova, Scaffold
from objective_helpers import SYNTHETIC, synthetic_run

CONFIGS = Path(__file__).parents[1] / "configs"
OBJECTIVE_CONFIGS = ["fedprox.yaml", "moon.yaml", "scaffold.yaml", "fednova.yaml", "fml.yaml"]


@pytest.mark.parametrize("config", ["scaffold_tiny.yaml", "fml_tiny.yaml"])
def test_resume_with_client_state_is_bitwise_equal(cli, tmp_path, config):
    cli(tmp_path / "straight", config=config)
    cli(tmp_path / "resumed", "--loop.rounds", "2", config=config)
    checkpoint = str(tmp_path / "resumed" / "last.ckpt")
    rows = cli(tmp_path / "resumed", "--ckpt_path", checkpoint, config=config)
    assert (tmp_path / "straight" / "global.pt").read_bytes() == (
        tmp_path / "resumed" / "global.pt"
    ).read_bytes()
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]
    state = torch.load(checkpoint, weights_only=True)
    assert state["clients"]  # the per-client state (c_i, personal models) is in the checkpoint


def test_fml_logs_the_personal_accuracy_of_another_architecture(cli, tmp_path):
    rows = cli(tmp_path / "fml", "--loop.rounds", "2", config="fml_tiny.yaml")
    assert all(0.0 <= float(r["personal_acc"]) <= 1.0 for r in rows)
    assert float(rows[-1]["personal_acc"]) > 0.2  # above chance (0.1) after two rounds


@pytest.mark.parametrize(
    ("client", "aggregator", "message"),
    [
        (ScaffoldClient, FedAvg(), r"ScaffoldClient needs aggregator Scaffold.*is FedAvg"),
        (ClientModule, Scaffold(), r"Scaffold .*serves client objective ScaffoldClient"),
        (ClientModule, FedNova(), r"FedNova .*serves client objective FedNovaClient"),
        (FedNovaClient, FedAvg(), r"FedNovaClient needs aggregator FedNova.*is FedAvg"),
    ],
)
def test_mismatched_pairs_are_refused_before_training(tmp_path, client, aggregator, message):
    with pytest.raises(ConfigurationError, match=message):
        synthetic_run(client(**SYNTHETIC), aggregator, tmp_path=tmp_path)
    assert not (tmp_path / "metrics.csv").exists()


def test_paired_objectives_are_accepted(tmp_path):
    synthetic_run(FedNovaClient(**SYNTHETIC), FedNova(), rounds=1, tmp_path=tmp_path / "nova")
    synthetic_run(ScaffoldClient(**SYNTHETIC), Scaffold(), rounds=1, tmp_path=tmp_path / "scaffold")


def test_cli_refuses_a_scaffold_client_with_fedavg(cli, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(
            tmp_path / "bad",
            "--loop.aggregator.class_path",
            "fedlightning.server.FedAvg",
            config="scaffold_tiny.yaml",
        )
    assert exit_info.value.code == 2
    assert re.search(r"ScaffoldClient needs aggregator Scaffold", capsys.readouterr().err)


@pytest.mark.parametrize("config", OBJECTIVE_CONFIGS)
def test_objective_configs_run(cli, tmp_path, config):
    args = [
        "--loop.rounds",
        "1",
        "--loop.clients_per_round",
        "2",
        "--loop.local_epochs",
        "1",
        "--loop.progress_bar",
        "false",
    ]
    rows = cli(
        tmp_path / "run", *args, config=str(CONFIGS / config)
    )  # an absolute path replaces tests/conf
    assert 0.0 <= float(rows[-1]["test_acc"]) <= 1.0
