"""The client system model and the synchronous virtual clock (issue 41 items 1, 2;
docs/algorithms.md section 6.3): seeded distributions, a trace file, availability and dropouts,
each round's duration recomputed from the run's own files (partition.csv, global.pt), the
deadline and over-selection, the virtual time to a target, a bit-for-bit resume, and bad options
refused in one line."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from fedlightning.analysis.plots import runs_figure
from fedlightning.errors import ConfigurationError
from fedlightning.loop.sampling import sample_clients
from fedlightning.round_components import Round, RoundComponent
from fedlightning.system import (
    ClientProfiles,
    Constant,
    Exponential,
    LogNormal,
    Pareto,
    SystemModel,
    read_trace,
)

SYSTEM = ["--loop.components+", "fedlightning.system.SystemModel", "--loop.plots", "false"]
SEQUENTIAL = "fedlightning.backends.SequentialBackend"
COHORT = "fedlightning.backends.CohortBackend"


def _arg(name, value):
    return [f"--loop.components.init_args.{name}", str(value)]


def _draws(distribution, n=40000):
    return distribution.sample(torch.Generator().manual_seed(7), n)


def test_distributions_have_the_stated_law():
    """Medians, means and tails against the closed forms (40000 draws: within a few standard
    errors)."""
    assert _draws(Constant(3.5), 5).tolist() == [3.5] * 5
    lognormal = _draws(LogNormal(median=50.0, sigma=0.8))
    assert lognormal.median().item() == pytest.approx(50.0, rel=0.03)
    assert torch.log(lognormal).std().item() == pytest.approx(0.8, rel=0.03)
    exponential = _draws(Exponential(mean=2.0))
    assert exponential.mean().item() == pytest.approx(2.0, rel=0.03)
    assert (exponential > 2.0).double().mean().item() == pytest.approx(math.exp(-1), abs=0.01)
    pareto = _draws(Pareto(scale=10.0, shape=2.5))
    assert pareto.min().item() >= 10.0
    for x in (15.0, 40.0):  # survival function (scale / x) ** shape
        assert (pareto > x).double().mean().item() == pytest.approx((10 / x) ** 2.5, abs=0.01)


def test_a_trace_gives_profiles_and_windows(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("client,speed,bandwidth,latency,windows\n1,20,1000,0.5,0-10;20-30\n0,5,2e3,,\n")
    profiles = read_trace(path)
    assert profiles.speed == (5.0, 20.0) and profiles.bandwidth == (2000.0, 1000.0)
    assert profiles.latency == (0.0, 0.5)
    assert profiles.duration(1, samples=40, upload_bytes=3000) == 40 / 20 + 3000 / 1000 + 0.5
    assert [profiles.available_at(1, t) for t in (0, 9.9, 10, 25, 30)] == [
        True, True, False, True, False]  # fmt: skip
    assert profiles.available_at(0, 1e9)  # no windows: always
    path.write_text("client,speed,bandwidth\n0,5,10\n0,6,10\n")
    with pytest.raises(ConfigurationError, match="line 3: client 0 is given twice"):
        read_trace(path)
    path.write_text("client,speed\n0,5\n")
    with pytest.raises(ConfigurationError, match=r"lacks the column\(s\) \['bandwidth'\]"):
        read_trace(path)


class _Run:
    """What SystemModel.setup reads of a run."""

    def __init__(self, num_clients=100, per_round=10):
        self.options = type("Options", (), {"seed": 3})()
        self.fit_config = type("Fit", (), {"local_steps": None, "local_epochs": 1})()
        self.num_clients, self.clients_per_round, self.batch_size = num_clients, per_round, 8


def test_availability_and_dropout_are_seeded_coins_per_round_and_client():
    """A client's fate is a function of (seed, round, client) only (not of the other sampled
    clients), with the stated probabilities."""
    model = SystemModel(availability=0.7, dropout=0.2)
    model.setup(_Run())
    rounds = [model.select_clients(Round(r, last=False), list(range(100))) for r in range(40)]
    taking_part = sum(len(kept) for kept in rounds) / 4000
    assert taking_part == pytest.approx(0.7 * 0.8, abs=0.03)
    for r in (0, 5):
        alone = [c for c in range(0, 100, 7)
                 if model.select_clients(Round(r, last=False), [c]) == [c]]  # fmt: skip
        assert alone == [c for c in rounds[r] if c % 7 == 0]


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(ConfigurationError, match=r"deadline=0.5 .* no client can meet it"):
        SystemModel(latency=Constant(1.0), deadline=0.5).setup(_Run())
    with pytest.raises(ConfigurationError, match=r"keep=11 .* samples 10 clients a round"):
        SystemModel(keep=11).setup(_Run())
    with pytest.raises(ConfigurationError, match=r"dropout=1.0 is not allowed"):
        SystemModel(dropout=1.0)
    with pytest.raises(ConfigurationError, match=r"availability='trace' is not allowed"):
        SystemModel(availability="trace")
    with pytest.raises(ConfigurationError, match=r"client 2's speed is 0.0"):
        ClientProfiles((1.0, 1.0, 0.0), (1.0,) * 3, (0.0,) * 3).check(3, "SystemModel")
    with pytest.raises(ConfigurationError, match=r"gives 3 clients, the run has 4"):
        ClientProfiles((1.0,) * 3, (1.0,) * 3, (0.0,) * 3).check(4, "SystemModel")


def _train_sizes(run_dir):
    """Each client's training samples, from partition.csv (the class counts of its split)."""
    with open(run_dir / "partition.csv") as handle:
        return {int(r["client"]): sum(int(v) for k, v in r.items() if k != "client")
                for r in csv.DictReader(handle)}  # fmt: skip


def _upload_bytes(run_dir):
    """The bytes of one FedAvg upload: the model's state (global.pt), element size times count."""
    state = torch.load(run_dir / "global.pt", weights_only=True)
    return sum(t.numel() * t.element_size() for t in state.values())


@pytest.mark.parametrize("backend", [SEQUENTIAL, COHORT], ids=["sequential", "cohort"])
def test_each_round_lasts_as_its_slowest_client(backend, cli, tmp_path):
    """speed 50 samples/s, bandwidth 20000 B/s, latency 0.25 s, 2 local epochs: virtual time
    after round r is the sum over rounds of max_i (2 n_i / 50 + bytes / 20000 + 0.25), with
    the clients drawn as the loop draws them."""
    rows = cli(tmp_path, *SYSTEM, *_arg("speed", 50), *_arg("bandwidth", 20000),
               *_arg("latency", 0.25), "--loop.backend", backend)  # fmt: skip
    sizes, upload = _train_sizes(tmp_path), _upload_bytes(tmp_path)
    clock = 0.0
    for r, row in enumerate(rows):
        clients = sample_clients(0, r, 8, 4)
        clock += max(2 * sizes[c] / 50 + upload / 20000 + 0.25 for c in clients)
        assert float(row["virtual_time"]) == pytest.approx(clock, rel=1e-12)
        assert row["clients_late"] == row["clients_unavailable"] == "0"
    figure = runs_figure([tmp_path], x="virtual_time")  # accuracy against the virtual clock
    (line,) = figure.axes[0].lines
    assert list(line.get_xdata()) == [float(r["virtual_time"]) for r in rows]
    assert figure.axes[0].get_xlabel() == "Virtual time (s)"


def test_a_deadline_drops_late_uploads_and_over_selection_keeps_the_first(cli, tmp_path):
    """Speed 100, no upload time: each client's duration is 2 n_i / 100; a deadline between the
    second and third arrivals drops the 2 late ones (counted, and the round lasts the deadline); keep=2 aggregates
    the 2 first arrivals and the round lasts the second one."""
    base = cli(tmp_path / "base", *SYSTEM, "--loop.rounds", "1", *_arg("bandwidth", 1e12))
    sizes = _train_sizes(tmp_path / "base")
    durations = sorted(2 * sizes[c] / 100 for c in sample_clients(0, 0, 8, 4))
    assert float(base[0]["virtual_time"]) == pytest.approx(durations[-1])
    deadline = (durations[1] + durations[2]) / 2
    late = cli(tmp_path / "late", *SYSTEM, "--loop.rounds", "1", *_arg("bandwidth", 1e12),
               *_arg("deadline", deadline))  # fmt: skip
    assert late[0]["clients_late"] == "2"
    assert float(late[0]["virtual_time"]) == pytest.approx(deadline)
    kept = cli(tmp_path / "kept", *SYSTEM, "--loop.rounds", "1", *_arg("bandwidth", 1e12),
               *_arg("keep", 2))  # fmt: skip
    assert float(kept[0]["virtual_time"]) == pytest.approx(durations[1])
    # the same two clients aggregated: the same model
    for a, b in zip(*(torch.load(tmp_path / d / "global.pt", weights_only=True).values()
                      for d in ("late", "kept")), strict=True):  # fmt: skip
        assert torch.equal(a, b)
    assert late[0]["test_acc"] != base[0]["test_acc"]


def test_time_to_target_in_virtual_time_and_a_bit_for_bit_resume(cli, tmp_path):
    """Log-normal speeds, availability 0.8, dropout 0.2: a run resumed after round 2 logs the
    same rows (virtual time included) and the same model as one run straight."""
    options = [*SYSTEM, "--loop.components.init_args.speed", "fedlightning.system.LogNormal",
               "--loop.components.init_args.speed.median", "40", *_arg("availability", 0.8),
               *_arg("dropout", 0.2), "--loop.target_acc", "0.5"]  # fmt: skip
    straight = cli(tmp_path / "straight", *options)
    reached = next(r for r in straight if r.get("rounds_to_target"))
    target_round = int(float(reached["rounds_to_target"]))
    at_target = straight[target_round - 1]["virtual_time"]
    assert reached["virtual_time_to_target"] == at_target
    assert straight[-1]["virtual_time_to_target"] == at_target
    run = tmp_path / "resumed"
    cli(run, *options, "--loop.rounds", "2")
    resumed = cli(run, *options, "--ckpt_path", str(run / "last.ckpt"))
    drop = {"round_time_s", "time_to_target_s"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == [
        {k: v for k, v in r.items() if k not in drop} for r in straight]  # fmt: skip
    a, b = (torch.load(d / "global.pt", weights_only=True) for d in (run, tmp_path / "straight"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    unavailable = sum(
        int(r["clients_unavailable"]) + int(r["clients_dropped_out"]) for r in straight
    )
    assert unavailable > 0


#: the steps each upload of a round took, as StepsProbe saw them: {round: {client: steps}}
STEPS: dict[int, dict[int, int]] = {}


class StepsProbe(RoundComponent):
    """Records the optimizer steps of each upload (a test's record, in a module global)."""

    def on_results(self, round):
        STEPS[round.index] = {u.client_id: u.num_steps for u in round.uploads}


@pytest.mark.parametrize(
    "backend",
    [[SEQUENTIAL], [COHORT], [SEQUENTIAL, "--loop.fit_with", "trainer"]],
    ids=["sequential", "cohort", "trainer"],
)
def test_partial_work_sends_the_steps_done_by_the_deadline(backend, cli, tmp_path):
    """Speed 100, a deadline of 2 s (200 samples): with ``partial_work`` every client arrives by
    it, each doing min(its full 2 epochs, floor(T * 100
    / 32)) steps (the upload time is negligible here); the stragglers are counted and the round
    lasts its slowest client's min(2 n_i, 32 steps_i) / 100."""
    deadline = 2.0  # 200 samples a client: 6 steps of 32
    budget = math.floor(deadline * 100 / 32)
    STEPS.clear()
    rows = cli(tmp_path, *SYSTEM, *_arg("bandwidth", 1e12), *_arg("deadline", deadline),
               *_arg("partial_work", "true"), "--loop.components+", "test_system_model.StepsProbe",
               "--loop.backend", *backend, "--loop.rounds", "2")  # fmt: skip
    sizes = _train_sizes(tmp_path)
    full = {c: 2 * math.ceil(n / 32) for c, n in sizes.items()}
    for r, row in enumerate(rows):
        clients = sample_clients(0, r, 8, 4)
        assert STEPS[r] == {c: min(full[c], budget) for c in clients}
        assert row["clients_late"] == "0"
        assert int(row["clients_partial"]) == sum(full[c] > budget for c in clients) > 0
    upload = _upload_bytes(tmp_path) / 1e12
    end = sum(
        max(min(2 * sizes[c], 32 * STEPS[r][c]) for c in STEPS[r]) / 100 + upload for r in range(2)
    )
    assert float(rows[-1]["virtual_time"]) == pytest.approx(end, rel=1e-9)


def test_a_resume_with_another_system_model_is_refused(cli, tmp_path, capsys):
    """The system model's options are part of the run's identity: other speeds on resume are
    refused in one line, leaving the run's files as they were."""
    cli(tmp_path, *SYSTEM, *_arg("speed", 50), "--loop.rounds", "1")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path, *SYSTEM, *_arg("speed", 60), "--loop.rounds", "2",
            "--ckpt_path", str(tmp_path / "last.ckpt"))  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "was written by another run" in err and "speed" in err, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
