"""Asynchronous servers on the virtual clock (issue 41 items 3-5; docs/algorithms.md section
6.4): the event order worked out by hand (tie rule, staleness, dispatch), a resume of the event
loop in the middle, FedBuff's and FedAsync's server steps on hand-made tensors, the two
equivalences (FedBuff with K = concurrency = clients per round is synchronous FedAvg; FedAsync
with concurrency 1 and alpha 1 is fitting the clients one after another), backend equality and a
bit-for-bit resume of a run killed with fits in flight, and bad options refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from fedlightning.asynchronous import FedAsync, FedBuff, staleness_factor
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import FitResult, Payload, Upload
from fedlightning.round_components import Round
from fedlightning.system import SystemModel

SEQUENTIAL = "fedlightning.backends.SequentialBackend"
COHORT = "fedlightning.backends.CohortBackend"
SERVER = "--loop.components+"


class _Run:
    """What the servers' setup reads of a run."""

    def __init__(self, num_clients=4, per_round=4):
        self.options = type("Options", (), {"seed": 0, "client_sampling": "fixed"})()
        self.fit_config = type("Fit", (), {"local_steps": None, "local_epochs": 1})()
        self.num_clients, self.clients_per_round, self.batch_size = num_clients, per_round, 8


class _Fits:
    """Fits that upload the client id as their one weight, from a server weight ``w``."""

    def __init__(self):
        self.model = torch.zeros(1)
        self.started: list[tuple[int, int, list[int]]] = []

    def payloads(self, version, clients):
        return {c: Payload({"w": self.model.clone()}) for c in clients}

    def fit(self, dispatch, version, clients):
        self.started.append((dispatch, version, list(clients)))
        payloads = self.payloads(version, clients)
        upload = {c: Upload(c, {"w": torch.full((1,), float(c))}, 8, 1) for c in clients}
        return [(c, payloads[c], FitResult(upload[c], {})) for c in clients]


def _trace(tmp_path):
    """Durations 8 / speed + 4 bytes / 4 B/s: 9, 5, 3 and 2 virtual seconds."""
    path = tmp_path / "trace.csv"
    path.write_text("client,speed,bandwidth\n0,1,4\n1,2,4\n2,4,4\n3,8,4\n")
    return str(path)


def _updates(server, fits, first, last):
    seen = []
    for r in range(first, last):
        rnd = Round(r, last=False)
        server.gather(rnd, fits)
        seen.append((rnd.client_ids[0], server.virtual_time, int(server.last["staleness_max"])))
    return seen


def test_the_event_order_worked_out_by_hand_and_its_resume(tmp_path):
    """Concurrency 4 = N, one arrival an update: client 3 arrives at t=2 and is sent again (back
    at 4), client 2 at 3 (staleness 1, back at 6), client 3 at 4 (staleness 1, back at 6),
    client 1 at 5 (staleness 3), then at t=6 client 2 before client 3 (the tie rule: dispatched
    first), handled both before any new dispatch."""
    expected = [(3, 2.0, 0), (2, 3.0, 1), (3, 4.0, 1), (1, 5.0, 3), (2, 6.0, 2), (3, 6.0, 2)]
    server = FedBuff(buffer_size=1, concurrency=4, system=SystemModel(trace=_trace(tmp_path)))
    server.setup(_Run())
    fits = _Fits()
    assert _updates(server, fits, 0, 6) == expected
    assert [(d, v, sorted(c)) for d, v, c in fits.started] == [
        (0, 0, [0, 1, 2, 3]), (1, 1, [3]), (2, 2, [2]), (3, 3, [3]), (4, 4, [1])]  # fmt: skip
    assert [item["client"] for item in server.in_flight] == [0, 1]
    resumed = FedBuff(buffer_size=1, concurrency=4, system=SystemModel(trace=_trace(tmp_path)))
    halfway = FedBuff(buffer_size=1, concurrency=4, system=SystemModel(trace=_trace(tmp_path)))
    halfway.setup(_Run())
    _updates(halfway, _Fits(), 0, 3)
    resumed.setup(_Run())
    resumed.load_state_dict(halfway.state_dict())
    assert _updates(resumed, _Fits(), 3, 6) == expected[3:]


def test_fedbuff_and_fedasync_server_steps_on_hand_made_tensors():
    """FedBuff: w + eta / sqrt(1 + tau) (w_i - w_recv); FedAsync: (1 - a_t) w + a_t w_i with
    a_t = alpha s(tau); integer entries are the client's."""
    current = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(5)}
    item = {"received": {"w": torch.tensor([0.0, 1.0]), "steps": torch.tensor(3)},
            "weights": {"w": torch.tensor([2.0, 5.0]), "steps": torch.tensor(7)}}  # fmt: skip
    buffered = FedBuff(buffer_size=2, concurrency=2, server_lr=0.5).server_weights(item, current, 3)
    assert torch.allclose(buffered["w"], torch.tensor([1.0 + 0.25 * 2.0, 2.0 + 0.25 * 4.0]))
    assert buffered["steps"].item() == 7
    mixed = FedAsync(alpha=0.5, staleness="polynomial", a=0.5).server_weights(item, current, 3)
    assert torch.allclose(mixed["w"], 0.75 * current["w"] + 0.25 * item["weights"]["w"])
    assert staleness_factor("hinge", 3, 1.0, 1) == pytest.approx(1 / 3)
    assert staleness_factor("hinge", 1, 1.0, 1) == 1.0
    assert staleness_factor("polynomial", 8, 0.5, 0) == pytest.approx(1 / 3)
    assert staleness_factor("constant", 8, 0.5, 0) == 1.0


def test_bad_options_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigurationError, match=r"buffer of 5 arrivals .* concurrency=4"):
        FedBuff(buffer_size=5, concurrency=4).setup(_Run())
    with pytest.raises(ConfigurationError, match=r"FedAsync.concurrency=9 .* at most the 4"):
        FedAsync(concurrency=9).setup(_Run())
    with pytest.raises(ConfigurationError, match=r"FedBuff.system='a deadline or keep'"):
        FedBuff(buffer_size=1, concurrency=2, system=SystemModel(deadline=3.0)).setup(_Run())
    with pytest.raises(ConfigurationError, match=r"FedAsync.alpha=0 is not allowed"):
        FedAsync(alpha=0)


def _server(kind, **options):
    args = [SERVER, f"fedlightning.asynchronous.{kind}", "--loop.plots", "false"]
    for key, value in options.items():
        args += [f"--loop.components.init_args.{key}", str(value)]
    return args


UNIFORM = ["--loop.aggregator", "fedlightning.server.FedAvg",
           "--loop.aggregator.init_args.weighting", "uniform", "--loop.local_steps", "3"]  # fmt: skip


def _global(run_dir):
    return torch.load(run_dir / "global.pt", weights_only=True)


def test_fedbuff_with_k_equal_to_the_round_is_synchronous_fedavg(cli, tmp_path):
    """Equal durations (3 steps of 32 samples, one speed), K = concurrency = clients per round =
    4, server lr 1, uniform weights: the same models as synchronous FedAvg to float rounding."""
    sync = cli(tmp_path / "sync", *UNIFORM, "--loop.plots", "false")
    fedbuff = cli(tmp_path / "fedbuff", *UNIFORM, *_server("FedBuff", buffer_size=4,
                                                          concurrency=4))  # fmt: skip
    a, b = _global(tmp_path / "sync"), _global(tmp_path / "fedbuff")
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)
    assert [float(r["test_acc"]) for r in fedbuff] == pytest.approx(
        [float(r["test_acc"]) for r in sync], abs=2 / 360)  # fmt: skip
    assert [float(r["staleness_max"]) for r in fedbuff] == [0.0] * 4
    assert [float(r["buffer_fill"]) for r in fedbuff] == [4.0] * 4


def test_fedasync_with_one_client_in_flight_and_alpha_1_fits_clients_one_after_another(
    cli, tmp_path
):
    """Concurrency 1, alpha 1: each client trains from the previous one's result: synchronous
    FedAvg with one client a round (the same clients, seeded alike) gives the same bits."""
    sync = cli(tmp_path / "sync", *UNIFORM, "--loop.clients_per_round", "1",
               "--loop.plots", "false")  # fmt: skip
    fedasync = cli(tmp_path / "fedasync", *UNIFORM,
                   *_server("FedAsync", alpha=1.0, staleness="constant", concurrency=1))  # fmt: skip
    a, b = _global(tmp_path / "sync"), _global(tmp_path / "fedasync")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["test_acc"] for r in fedasync] == [r["test_acc"] for r in sync]


SKEWED = ["--loop.components.init_args.system", "fedlightning.system.SystemModel",
          "--loop.components.init_args.system.init_args.speed", "fedlightning.system.Pareto",
          "--loop.components.init_args.system.init_args.speed.init_args.scale", "20"]  # fmt: skip
#: wall time, and the target columns the last row of the run's first segment carries
WALL = {"round_time_s", "time_to_target_s", "rounds_to_target", "virtual_time_to_target"}


def _rows(rows):
    return [{k: v for k, v in r.items() if k not in WALL} for r in rows]


@pytest.mark.parametrize("kind", ["FedBuff", "FedAsync"])
def test_a_run_resumed_with_fits_in_flight_repeats_bit_for_bit_on_either_backend(
    kind, cli, tmp_path
):
    """Pareto speeds, FedBuff K=2 (or FedAsync) with 4 in flight: killed after 3 updates (fits
    in flight and, for FedBuff, arrivals in the buffer) and resumed, the run logs the rows and
    saves the model of one run straight; the cohort backend (the fits that start together
    batched) gives the same rows."""
    options = {"concurrency": 4, **({"buffer_size": 2} if kind == "FedBuff" else {})}
    args = [*_server(kind, **options), *SKEWED, "--loop.target_acc", "0.5"]
    straight = cli(tmp_path / "straight", *args, "--loop.backend", SEQUENTIAL, "--loop.rounds", "6")
    assert max(float(r["staleness_max"]) for r in straight) > 0
    run = tmp_path / "resumed"
    cli(run, *args, "--loop.backend", SEQUENTIAL, "--loop.rounds", "3")
    state = torch.load(run / "last.ckpt", weights_only=True)["components"]["asynchronous"]
    assert len(state["in_flight"]) > 0
    resumed = cli(run, *args, "--loop.backend", SEQUENTIAL, "--loop.rounds", "6",
                  "--ckpt_path", str(run / "last.ckpt"))  # fmt: skip
    assert _rows(resumed) == _rows(straight)
    target = ("rounds_to_target", "virtual_time_to_target")
    assert [resumed[-1][k] for k in target] == [straight[-1][k] for k in target]
    a, b = _global(run), _global(tmp_path / "straight")
    assert all(torch.equal(a[k], b[k]) for k in a)
    cohort = cli(tmp_path / "cohort", *args, "--loop.backend", COHORT, "--loop.rounds", "6")
    assert [r["virtual_time"] for r in cohort] == [r["virtual_time"] for r in straight]
    for x, y in zip(cohort, straight, strict=True):
        assert float(x["test_loss"]) == pytest.approx(float(y["test_loss"]), rel=1e-4)
    reached = [r for r in straight if r.get("virtual_time_to_target")]
    assert reached and not math.isnan(float(reached[-1]["virtual_time_to_target"]))


def test_a_client_that_fails_frees_its_slot_and_the_run_goes_on(cli, tmp_path, capsys):
    """Client 1's fit always raises: it is counted in the summary at every dispatch that drew
    it, never in flight, and the updates go on with the other clients."""
    rows = cli(tmp_path, "--model", "user_clients.FailsClientOne",
               *_server("FedBuff", buffer_size=2, concurrency=4), "--loop.rounds", "5")  # fmt: skip
    assert [r["round"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert all(float(r["buffer_fill"]) == 2 for r in rows)
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)["components"]["asynchronous"]
    assert 1 not in [item["client"] for item in state["in_flight"]]
    summary = [line for line in capsys.readouterr().err.splitlines() if "summary:" in line]
    failed = int(summary[-1].split("; ")[1].split(" client fit")[0])
    assert failed >= 1


@pytest.mark.slow  # a local Ray instance: about half a minute to start
def test_ray_runs_the_same_events_and_bits_as_sequential(local_ray, cli, tmp_path):
    """FedBuff under Pareto speeds on RayBackend (the fits of a dispatch in parallel actors):
    the rows (virtual time, staleness included) and global.pt of the sequential backend."""
    args = [*_server("FedBuff", buffer_size=2, concurrency=4), *SKEWED, "--loop.rounds", "4"]
    sequential = cli(tmp_path / "sequential", *args, "--loop.backend", SEQUENTIAL)
    remote = cli(tmp_path / "ray", *args, "--loop.backend", "RayBackend",
                 "--loop.backend.num_workers", "2")  # fmt: skip
    assert _rows(remote) == _rows(sequential)
    assert (tmp_path / "ray" / "global.pt").read_bytes() == (
        tmp_path / "sequential" / "global.pt"
    ).read_bytes()


def test_a_server_optimizer_takes_fedbuffs_pseudo_gradient(cli, tmp_path):
    """FedBuff's server step is linear: scaling the buffered deltas by eta (FedBuff's
    ``server_lr``) under FedAvg, or the aggregate's pseudo-gradient by eta (FedAvgM's
    ``server_lr``, no momentum), gives the same models to float rounding; with momentum the
    server optimizer's state carries across updates and the model moves elsewhere."""
    skewed = [*SKEWED, "--loop.rounds", "4", "--loop.local_steps", "3"]
    buffered = [*_server("FedBuff", buffer_size=2, concurrency=4), *skewed]
    eta = ["--loop.components.init_args.server_lr", "0.5"]
    fedavg = ["--loop.aggregator", "fedlightning.server.FedAvg",
              "--loop.aggregator.init_args.weighting", "uniform"]  # fmt: skip
    momentum = ["--loop.aggregator", "fedlightning.server.FedAvgM",
                "--loop.aggregator.init_args.weighting", "uniform",
                "--loop.aggregator.init_args.server_lr", "0.5"]  # fmt: skip
    cli(tmp_path / "fedbuff_lr", *fedavg, *buffered, *eta)
    cli(tmp_path / "fedavgm_lr", *momentum, "--loop.aggregator.init_args.server_momentum", "0",
        *buffered)  # fmt: skip
    cli(tmp_path / "momentum", *momentum, "--loop.aggregator.init_args.server_momentum", "0.9",
        *buffered)  # fmt: skip
    a, b, m = (_global(tmp_path / d) for d in ("fedbuff_lr", "fedavgm_lr", "momentum"))
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)
    assert any(not torch.allclose(a[k], m[k], atol=1e-3) for k in a)
