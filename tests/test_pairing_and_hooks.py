"""Pairing declared by either side, and no silently skipped hook (docs/algorithms.md section 2.6):
an objective that needs its server, run with another, and a plug-in written against a removed
hook or a misspelt one are refused at start-up in one line naming both sides or the hook to use,
before anything is written; the shipped classes and the user plug-ins of tests/user_clients.py
pass."""

import inspect
import sys
from pathlib import Path

import pytest

import user_clients
from fedlightning import FederatedDataModule, FederatedLoop, attacks, backends, clients, server
from fedlightning.cli import main
from fedlightning.clients import ClientModule, FedNovaClient, ScaffoldClient
from fedlightning.errors import ConfigurationError
from fedlightning.loop.pairing import pairing_refusal
from fedlightning.loop.plugin_hooks import BASES, hook_problem
from fedlightning.privacy import ClientLevelDP
from fedlightning.server import FedAvg, FedNova, InCo, Scaffold
from objective_helpers import SYNTHETIC
from user_clients import FedDynPaired, FedDynServer

CONF = Path(__file__).parent / "conf"


def _start(model, aggregator, run_dir, **kwargs):
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=120, num_test=30, num_classes=3, sample_shape=(6,),
        num_clients=4, partition="iid",
    )  # fmt: skip
    loop = FederatedLoop(rounds=1, clients_per_round=2, aggregator=aggregator,
                         run_dir=str(run_dir), progress_bar=False, plots=False, **kwargs)  # fmt: skip
    return loop.fit(model, datamodule=dm)


# -- pairing --------------------------------------------------------------------------------------
def test_an_objective_that_names_its_server_is_refused_with_fedavg_before_anything_is_written(
    tmp_path,
):
    with pytest.raises(ConfigurationError) as refused:
        _start(FedDynPaired(**SYNTHETIC), FedAvg(), tmp_path / "run")
    message = str(refused.value)
    assert "client objective FedDynPaired needs aggregator FedDynServer" in message
    assert "loop.aggregator is FedAvg" in message and "\n" not in message
    assert not (tmp_path / "run").exists()
    _start(FedDynPaired(**SYNTHETIC), FedDynServer(), tmp_path / "paired")  # its own server: runs


@pytest.mark.parametrize(
    ("objective", "aggregator", "message"),
    [
        (ScaffoldClient, FedAvg(), "ScaffoldClient needs aggregator Scaffold, but loop.aggregator is FedAvg"),
        (FedNovaClient, FedAvg(), "FedNovaClient needs aggregator FedNova, but loop.aggregator is FedAvg"),
        (ClientModule, Scaffold(), "aggregator Scaffold (loop.aggregator: Scaffold) serves client objective ScaffoldClient, but the model is ClientModule"),
        (ClientModule, InCo(inner=FedNova()), "aggregator FedNova (loop.aggregator: InCo around FedNova) serves client objective FedNovaClient"),
        (ScaffoldClient, InCo(), "ScaffoldClient needs aggregator Scaffold, but loop.aggregator is InCo around FedAvg"),
    ],
    ids=["scaffold client", "fednova client", "scaffold server", "through InCo", "InCo's inner"],
)  # fmt: skip
def test_the_built_in_pairs_are_declared_and_seen_through_wrappers(objective, aggregator, message):
    assert message in pairing_refusal(objective, aggregator)


def test_wrapped_partners_pair():
    assert pairing_refusal(ScaffoldClient, InCo(inner=Scaffold())) is None
    assert pairing_refusal(FedNovaClient, InCo(inner=FedNova())) is None
    assert pairing_refusal(user_clients.CrashAndNaNClients, Scaffold()) is None  # a subclass
    pytest.importorskip("opacus")
    dp = ClientLevelDP(inner=FedAvg(weighting="uniform"), noise_multiplier=1.0)
    assert pairing_refusal(clients.FML, dp) is None  # uniform weighting, read through the wrapper


class NeedsCapability(ClientModule):
    required_aggregator = frozenset({"dynamic-regularization"})


class Declares(FedAvg):
    capabilities = frozenset({"dynamic-regularization"})


def test_a_capability_pairs_without_a_class_name():
    assert pairing_refusal(NeedsCapability, Declares()) is None
    assert "needs aggregator dynamic-regularization" in pairing_refusal(NeedsCapability, FedAvg())


# -- hooks ----------------------------------------------------------------------------------------
def _plugin_classes():
    modules = (clients, server, attacks, backends, user_clients)
    found = {c for m in modules for _, c in inspect.getmembers(m, inspect.isclass)}
    found.add(ClientLevelDP)
    return sorted(
        (c for c in found if issubclass(c, BASES) and c not in BASES), key=lambda c: c.__qualname__
    )


@pytest.mark.parametrize("cls", _plugin_classes(), ids=lambda c: c.__name__)
def test_the_shipped_classes_and_the_user_plugins_define_no_skipped_hook(cls):
    assert hook_problem(cls.__new__(cls)) is None


class ServerStep(FedAvg):
    def server_step(self, server_round):  # the hook before server_update
        return {}


class FlowerStyle(FedAvg):
    def aggregate_fit(self, server_round, results, failures):
        return None


class StateByHand(FedAvg):
    def state_dict(self):
        return {**super().state_dict(), "t": 0}


class RoundContext(ClientModule):
    round_context = ("_anchor",)


class Typo(ClientModule):
    def local_los(self, batch):
        return super().local_loss(batch) * 2


class BeginTypo(ClientModule):
    def begin_clinet(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)


class ServerTypo(FedAvg):
    def server_updat(self, server_round):
        return {}


class Helper(FedAvg):
    """A helper resembling no hook is no near miss."""

    def pseudo_gradient(self, server_round):
        return {k: self.weights[k] - server_round.mean[k] for k in server_round.parameter_keys}


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (ServerStep(), "ServerStep.server_step is no longer called: .*use server_update"),
        (FlowerStyle(), "FlowerStyle.aggregate_fit is no longer called: .*use aggregate"),
        (StateByHand(), "StateByHand.state_dict is no longer called: .*use add_state in __init__"),
        (RoundContext(**SYNTHETIC), "RoundContext.round_context is no longer called: .*begin_client"),
        (Typo(**SYNTHETIC), "Typo.local_los is not a hook of ClientModule .*did you mean local_loss"),
        (BeginTypo(**SYNTHETIC), "BeginTypo.begin_clinet .*did you mean begin_client"),
        (ServerTypo(), "ServerTypo.server_updat is not a hook of FedAvg .*did you mean server_update"),
    ],
    ids=lambda p: type(p).__name__ if not isinstance(p, str) else "",
)  # fmt: skip
def test_a_removed_or_misspelt_hook_is_refused_at_start_up(plugin, message, tmp_path):
    model = plugin if isinstance(plugin, ClientModule) else ClientModule(**SYNTHETIC)
    aggregator = plugin if not isinstance(plugin, ClientModule) else FedAvg()
    with pytest.raises(ConfigurationError, match=message) as refused:
        _start(model, aggregator, tmp_path / "run")
    assert "\n" not in str(refused.value) and not (tmp_path / "run").exists()


def test_a_helper_that_resembles_no_hook_runs_and_a_wrapped_typo_is_found(tmp_path):
    _start(ClientModule(**SYNTHETIC), Helper(), tmp_path / "helper")
    with pytest.raises(ConfigurationError, match="ServerTypo.server_updat"):
        _start(ClientModule(**SYNTHETIC), InCo(inner=ServerTypo()), tmp_path / "inco")


def test_the_cli_refuses_a_plain_counter_in_one_line(tmp_path, capsys):
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(CONF / "tiny.yaml"), "--loop.run_dir", str(tmp_path),
              "--loop.aggregator", "user_clients.AdamPlainCounter"])  # fmt: skip
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fedlightning: error: round 1: AdamPlainCounter.t changed (now 1)")
    assert not (tmp_path / "last.ckpt").exists()  # refused before round 1 is checkpointed
