"""End-to-end runs through the CLI on tiny data."""

import csv

import pytest
import torch

from fedlightning import ClientModule, FedAvg, FederatedDataModule, FederatedLoop, create_model
from fedlightning.errors import ConfigurationError, RunStopped
from fedlightning.loop import ClientBug, sample_clients
from fedlightning.loop.sampling import clients_per_round
from user_clients import CrashAndNaN


def test_cli_run_learns_and_writes_the_run_directory(cli, tmp_path):
    rows = cli(tmp_path / "run")
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]
    accuracies = [float(r["test_acc"]) for r in rows]
    assert all(0.0 <= a <= 1.0 for a in accuracies)
    assert accuracies[-1] > 0.6  # chance is 0.1 on 10 digit classes
    assert 0.0 <= float(rows[-1]["val_acc"]) <= 1.0
    run = tmp_path / "run"
    assert "network:" in (run / "config.yaml").read_text()
    with open(run / "partition.csv") as handle:
        table = list(csv.reader(handle))
    assert table[0][:2] == ["client", "class_0"] and len(table) == 1 + 8
    state = torch.load(run / "global.pt", weights_only=True)
    model = create_model("mlp", num_classes=10, in_channels=1, image_size=8, hidden=[64])
    model.load_state_dict(state)  # a plain state_dict of the network
    assert torch.load(run / "last.ckpt", weights_only=True)["round"] == 4
    assert (run / "curves.png").stat().st_size > 0 and (run / "partition.png").stat().st_size > 0


def test_resume_is_bitwise_equal_to_an_uninterrupted_run(cli, tmp_path):
    cli(tmp_path / "straight", "--loop.rounds", "4")
    cli(tmp_path / "resumed", "--loop.rounds", "2")
    rows = cli(
        tmp_path / "resumed",
        "--loop.rounds",
        "4",
        "--ckpt_path",
        str(tmp_path / "resumed" / "last.ckpt"),
    )
    assert (tmp_path / "straight" / "global.pt").read_bytes() == (
        tmp_path / "resumed" / "global.pt"
    ).read_bytes()
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]  # metrics.csv continues, no rows lost


def test_same_seed_same_result_other_seed_differs(cli, tmp_path):
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        cli(tmp_path / name, "--loop.rounds", "2", "--loop.seed", seed)
    read = lambda name: (tmp_path / name / "global.pt").read_bytes()  # noqa: E731
    assert read("a") == read("b")
    assert read("a") != read("c")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--loop.clients_per_round", "9"], "clients_per_round=9 exceeds num_clients=8"),
        (["--loop.min_clients", "5"], "min_clients=5 exceeds clients_per_round=4"),
        (["--data.dataset", "imagenet"], "unknown data set 'imagenet'"),
        (
            ["--data.dataset", "cifar10", "--data.root", "/nonexistent"],
            "cifar10.*not found under root",
        ),
        (["--data.beta", "0"], "beta must be > 0"),
        (["--loop.rounds", "0"], "loop.rounds=0"),
        (["--model.init_args.network", "nope"], "unknown model 'nope'"),
        (["--model.init_args.lr", "-1"], "lr must be > 0"),
    ],
)
def test_bad_input_exits_with_a_clear_message_before_training(cli, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "bad", *args)
    assert exit_info.value.code == 2
    import re

    assert re.search(message, capsys.readouterr().err)
    assert (
        not (tmp_path / "bad" / "metrics.csv").exists()
        and not (tmp_path / "bad" / "last.ckpt").exists()
    )


def test_sampling_depends_only_on_seed_and_round():
    assert sample_clients(0, 5, 20, 10) == sample_clients(0, 5, 20, 10)
    assert sample_clients(0, 5, 20, 10) != sample_clients(0, 6, 20, 10)
    assert len(set(sample_clients(1, 0, 20, 20))) == 20


class FlakyClients(CrashAndNaN, ClientModule):
    """Client 0 raises, client 1 uploads NaN: both must be left out without losing the run."""


def _tiny(**loop_kwargs):
    dm = FederatedDataModule(
        dataset="synthetic",
        num_samples=240,
        num_test=60,
        num_classes=3,
        sample_shape=(6,),
        num_clients=4,
        partition="iid",
    )
    return dm, FederatedLoop(progress_bar=False, **loop_kwargs)


def test_failed_and_non_finite_clients_are_left_out(tmp_path):
    dm, loop = _tiny(rounds=2, clients_per_round=4, run_dir=str(tmp_path))
    model = FlakyClients(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)
    metrics = loop.fit(model, datamodule=dm)
    assert metrics["clients_failed"] == 1 and metrics["clients_rejected"] == 1
    assert all(torch.isfinite(v).all() for v in loop.aggregator.global_state().values())


def test_every_client_failing_the_same_way_is_a_bug_that_stops_the_run(tmp_path):
    class Broken(ClientModule):
        def local_loss(self, batch):
            raise RuntimeError("broken objective")

    dm, loop = _tiny(rounds=2, clients_per_round=2, run_dir=str(tmp_path))
    with pytest.raises(ClientBug, match="(?s)round 1: no client succeeded.*broken objective"):
        loop.fit(Broken(network="mlp", num_classes=3, in_channels=6, image_size=1), datamodule=dm)
    assert not (tmp_path / "global.pt").exists()


class FailsThirdFit(ClientModule):
    """The third client fit of the run raises: round 2 of 2 clients has one failure."""

    fits = 0

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        FailsThirdFit.fits += 1
        if FailsThirdFit.fits == 3:
            raise RuntimeError("a failing client")


def test_isolated_failures_follow_on_round_failure(tmp_path):
    kwargs = dict(network="mlp", num_classes=3, in_channels=6, image_size=1)
    FailsThirdFit.fits = 0
    dm, loop = _tiny(
        rounds=2, clients_per_round=2, run_dir=str(tmp_path), min_clients=2, on_round_failure="stop"
    )
    with pytest.raises(RunStopped, match="round 2: only 1 of 2 clients succeeded"):
        loop.fit(FailsThirdFit(**kwargs), datamodule=dm)
    FailsThirdFit.fits = 0
    dm, loop = _tiny(
        rounds=2,
        clients_per_round=2,
        run_dir=str(tmp_path / "skip"),
        min_clients=2,
        checkpoint_every=1,
    )
    seen = []

    class Recording(FedAvg):
        def aggregate(self, round_index, uploads):
            seen.append(round_index)
            super().aggregate(round_index, uploads)

    loop.aggregator = Recording()
    metrics = loop.fit(FailsThirdFit(**kwargs), datamodule=dm)
    assert seen == [0] and metrics["clients_failed"] == 1  # round 2 was skipped, the run went on


def test_mismatched_objective_and_aggregator_are_refused(tmp_path):
    class NeedsControlVariate(ClientModule):
        required_payload_extras = frozenset({"c"})

    class NeedsDeltaC(FedAvg):
        required_upload_extras = frozenset({"delta_c"})

    dm, loop = _tiny(rounds=1, clients_per_round=2, run_dir=str(tmp_path))
    with pytest.raises(ConfigurationError, match=r"NeedsControlVariate needs \['c'\].*FedAvg"):
        loop.fit(
            NeedsControlVariate(network="mlp", num_classes=3, in_channels=6, image_size=1),
            datamodule=dm,
        )
    dm, loop = _tiny(rounds=1, clients_per_round=2, run_dir=str(tmp_path), aggregator=NeedsDeltaC())
    with pytest.raises(ConfigurationError, match=r"NeedsDeltaC needs \['delta_c'\]"):
        loop.fit(
            ClientModule(network="mlp", num_classes=3, in_channels=6, image_size=1), datamodule=dm
        )


def test_fractional_clients_per_round_local_steps_and_bf16(tmp_path):
    dm, loop = _tiny(
        rounds=1,
        clients_per_round=0.5,
        local_steps=3,
        precision="bf16-mixed",
        run_dir=str(tmp_path),
    )
    assert clients_per_round(0.5, 4, 1) == 2
    model = ClientModule(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)
    metrics = loop.fit(model, datamodule=dm)
    assert 0.0 <= metrics["test_acc"] <= 1.0


class CountingClient(ClientModule):
    """Keeps a per-client participation counter and a tensor in the ClientStore, and lets the
    counter shift its learning rate, so lost or stale state would change the result."""

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        self.state = {
            "visits": state.get("visits", 0) + 1,
            "trace": state.get("trace", torch.zeros(1)) + 1,
        }

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05 * self.state["visits"])


@pytest.mark.parametrize("client_state", ["memory", "disk"])
def test_client_state_persists_and_resumes_exactly(tmp_path, client_state):
    def run(run_dir, rounds, ckpt=None):
        dm, loop = _tiny(
            rounds=rounds, clients_per_round=2, run_dir=str(run_dir), client_state=client_state
        )
        torch.manual_seed(0)  # the initial model, as the CLI seeds it from loop.seed
        model = CountingClient(network="mlp", num_classes=3, in_channels=6, image_size=1)
        loop.fit(model, datamodule=dm, ckpt_path=ckpt)
        return loop

    straight = run(tmp_path / "a", 4)
    visits = {cid: straight.store.get(cid)["visits"] for cid in range(4) if cid in straight.store}
    assert sum(visits.values()) == 4 * 2  # every participation counted once
    run(tmp_path / "b", 2)
    resumed = run(tmp_path / "b", 4, ckpt=str(tmp_path / "b" / "last.ckpt"))
    assert (tmp_path / "a" / "global.pt").read_bytes() == (
        tmp_path / "b" / "global.pt"
    ).read_bytes()
    assert {cid: resumed.store.get(cid)["visits"] for cid in visits} == visits
    if client_state == "disk":
        folder = tmp_path / "b" / "client_state"
        files = sorted(p.name.split(".")[0] for p in folder.glob("*.pt"))
        assert files == sorted(str(c) for c in visits)  # one live file per stateful client


def test_onednn_is_off_during_a_run_and_restored_after(tmp_path):
    """torch 2.14.1's oneDNN conv backward corrupted the heap here: runs train without it by
    default (``loop.onednn``) and give the setting back afterwards."""
    seen = []

    class Recording(ClientModule):
        def training_step(self, batch, batch_idx):
            seen.append(torch.backends.mkldnn.enabled)
            return super().training_step(batch, batch_idx)

    before = torch.backends.mkldnn.enabled
    for onednn in (False, True):
        dm, loop = _tiny(
            rounds=1, clients_per_round=1, run_dir=str(tmp_path / str(onednn)), onednn=onednn
        )
        loop.fit(
            Recording(network="mlp", num_classes=3, in_channels=6, image_size=1), datamodule=dm
        )
        assert set(seen) == {onednn}
        assert torch.backends.mkldnn.enabled == before
        seen.clear()


def _outcome(results):
    from fedlightning.loop.failures import sort_results

    return sort_results(4, list(results), results)


def test_the_failure_policy_tells_bugs_from_client_failures():
    from fedlightning.backends.base import WorkerLost
    from fedlightning.loop.failures import check_for_bug

    same = _outcome({0: KeyError("a"), 1: KeyError("b")})
    with pytest.raises(ClientBug, match="round 5: no client succeeded \\(2 raised"):
        check_for_bug(4, False, same)
    mixed = _outcome({0: KeyError("a"), 1: ValueError("b")})
    check_for_bug(4, False, mixed)  # different errors in a later round: the policy decides
    with pytest.raises(ClientBug):
        check_for_bug(4, True, mixed)  # ...but the first round must have one success
    check_for_bug(0, True, _outcome({0: WorkerLost("actor died"), 1: WorkerLost("actor died")}))
