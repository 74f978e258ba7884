"""``loop.backend: auto`` takes its device kind's path, never one a timing chose (issue 43 item 1,
docs/algorithms.md section 9.3): the cohort only where it applies, the rule of the device type
otherwise, printed in one line; a resume takes the path its checkpoint's last rounds took, also
after a fallback to sequential fits mid-run; and the run summary says which path ran. The cohort
path is exercised on the CPU by giving the CPU the accelerators' rule."""

import pytest
import torch

from fedlightning import FedAvg, FederatedDataModule, FederatedLoop
from fedlightning.backends import AutoBackend, CohortBackend, SequentialBackend, auto
from fedlightning.backends.cohort.checks import CohortRefusal
from fedlightning.clients import ClientModule, ScaffoldClient
from fedlightning.compute import Compute
from fedlightning.protocol import FitConfig
from objective_helpers import SYNTHETIC
from test_cohort import Manual, Scheduled


def _data(num_clients=4):
    return FederatedDataModule(
        dataset="synthetic", num_samples=40 * num_clients, num_test=30, num_classes=3,
        sample_shape=(6,), num_clients=num_clients, partition="iid", batch_size=16,
    )  # fmt: skip


def _fit(tmp_path, rounds=2, ckpt_path=None, **kwargs):
    torch.manual_seed(0)
    loop = FederatedLoop(
        rounds=rounds, clients_per_round=4, aggregator=FedAvg(), run_dir=str(tmp_path),
        progress_bar=False, plots=False, **kwargs,
    )  # fmt: skip
    loop.fit(ClientModule(**SYNTHETIC, momentum=0.5), datamodule=_data(), ckpt_path=ckpt_path)
    return loop


def _recorded_path(run_dir):
    return torch.load(run_dir / "last.ckpt", weights_only=False)["identity"]["backend_results"]


@pytest.fixture
def cohort_on_cpu(monkeypatch):
    """The CPU given the accelerators' rule, so that ``auto`` takes the cohort here."""
    monkeypatch.setitem(auto.RULE, "cpu", ("cohort", "the accelerators' rule, for this test"))


@pytest.mark.parametrize(
    ("make", "candidate", "reason"),
    [
        (lambda: ScaffoldClient(**SYNTHETIC), CohortBackend, ""),
        (lambda: Manual(**SYNTHETIC), SequentialBackend, "manual optimization"),
        (lambda: Scheduled(**SYNTHETIC), SequentialBackend, "LR schedulers"),
    ],
)
def test_the_cohort_is_a_candidate_only_where_it_applies(make, candidate, reason, capsys):
    backend = AutoBackend()
    backend.check(make(), FitConfig(accelerator="cpu"), Compute.resolve("cpu", "32-true"))
    assert type(backend.candidate) is candidate and reason in backend.reason
    assert (backend.chosen is None) == (candidate is CohortBackend)  # the rule decides later
    assert capsys.readouterr().err == ""  # said when the run starts


@pytest.mark.parametrize(
    ("device", "chosen", "reason"),
    [
        ("cpu", SequentialBackend, "for the CPU"),
        ("cuda", CohortBackend, "for an accelerator"),
        ("mps", CohortBackend, "for an accelerator"),
    ],
)
def test_the_device_type_decides_and_nothing_is_timed(device, chosen, reason, monkeypatch):
    """The choice reads no clock: with every clock of the process broken, ``decide`` still
    chooses, by the device type alone (a device object is all it reads of the compute)."""
    from types import SimpleNamespace

    def no_clock():
        raise AssertionError("the backend choice read a clock")

    for name in ("perf_counter", "monotonic", "time", "process_time", "thread_time"):
        monkeypatch.setattr(f"time.{name}", no_clock)
    backend, model = AutoBackend(), ScaffoldClient(**SYNTHETIC)
    backend.check(model, FitConfig(accelerator="cpu"), Compute.resolve("cpu", "32-true"))
    compute = SimpleNamespace(device=torch.device(device))
    backend.decide(model, None, FitConfig(accelerator="cpu"), compute, 4)
    assert type(backend.chosen) is chosen and reason in backend.reason


def test_a_cpu_run_takes_the_sequential_path_and_says_so(tmp_path, capsys):
    loop = _fit(tmp_path, rounds=2)
    assert type(loop.backend.chosen) is SequentialBackend
    err = capsys.readouterr().err
    assert (
        "backend: auto chose SequentialBackend (the rule of docs/algorithms.md section 9.3 for the CPU)"
        in err
    )
    assert _recorded_path(tmp_path) == "sequential"
    summary = next(line for line in err.splitlines() if line.startswith("path: "))
    assert summary.startswith("path: sequential fits in rounds 1-2 on cpu, 1 intra-op thread ")
    assert "(AutoBackend: the rule of docs/algorithms.md section 9.3 for the CPU)" in summary


def test_the_rules_cohort_is_bitwise_the_cohort_backend(tmp_path, cohort_on_cpu, capsys):
    loop = _fit(tmp_path / "auto", rounds=2)
    assert type(loop.backend.chosen) is CohortBackend and _recorded_path(tmp_path / "auto") == (
        "cohort"
    )
    assert "path: cohort fits in rounds 1-2 on cpu" in capsys.readouterr().err
    _fit(tmp_path / "named", rounds=2, backend=CohortBackend())
    assert (tmp_path / "auto/global.pt").read_bytes() == (tmp_path / "named/global.pt").read_bytes()


def test_a_resume_keeps_the_checkpoints_path_whatever_the_rule_says_now(tmp_path, monkeypatch):
    monkeypatch.setitem(auto.RULE, "cpu", ("cohort", "an earlier rule"))
    straight = _fit(tmp_path / "straight", rounds=2)
    _fit(tmp_path / "resumed", rounds=1)
    monkeypatch.setitem(auto.RULE, "cpu", ("sequential", "today's rule"))
    resumed = _fit(
        tmp_path / "resumed", rounds=2, ckpt_path=str(tmp_path / "resumed" / "last.ckpt")
    )
    assert isinstance(straight.backend.chosen, CohortBackend)
    assert isinstance(resumed.backend.chosen, CohortBackend)
    assert resumed.backend.reason == "the path the resumed checkpoint's last rounds took"
    assert (tmp_path / "resumed" / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()


@pytest.fixture
def cohort_refuses_round_3(monkeypatch, cohort_on_cpu):
    """The cohort refuses the clients of round 3 (0-based 2) only, as it refuses per-client
    parameters it finds when their round begins: ``auto`` falls back to sequential fits there."""
    run = CohortBackend.run

    def refusing(self, round_index, jobs):
        if round_index == 2:
            raise CohortRefusal("loop.backend=CohortBackend cannot train round 3 (this test)")
        return run(self, round_index, jobs)

    monkeypatch.setattr(CohortBackend, "run", refusing)


def test_after_a_fallback_the_checkpoints_record_sequential_and_a_resume_takes_it(
    tmp_path, cohort_refuses_round_3, capsys
):
    """Rounds 1-2 on the cohort, 3-4 sequential: a run resumed from round 3's checkpoint trains
    round 4 sequentially (the cohort would round differently), byte for byte the straight run,
    and both summaries name the rounds each path ran."""
    straight = _fit(tmp_path / "straight", rounds=4)
    err = capsys.readouterr().err
    assert "backend: auto falls back to SequentialBackend (round 3 (this test))" in err
    assert isinstance(straight.backend.chosen, SequentialBackend)
    assert _recorded_path(tmp_path / "straight") == "sequential"
    path = "path: cohort fits in rounds 1-2, sequential fits in rounds 3-4 on cpu"
    assert path in err
    _fit(tmp_path / "resumed", rounds=3)
    assert _recorded_path(tmp_path / "resumed") == "sequential"
    capsys.readouterr()
    resumed = _fit(
        tmp_path / "resumed", rounds=4, ckpt_path=str(tmp_path / "resumed" / "last.ckpt")
    )
    assert isinstance(resumed.backend.chosen, SequentialBackend)
    assert resumed.backend.reason == "the path the resumed checkpoint's last rounds took"
    assert path in capsys.readouterr().err  # the rounds before the resume included
    assert (tmp_path / "resumed" / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()


def test_a_cohort_that_refuses_the_clients_at_their_round_falls_back_to_sequential(
    tmp_path, cohort_on_cpu, capsys
):
    """FML with personal networks of two architectures, on the cohort by the rule, which can
    only tell at the round's begin_client that the clients differ: the run goes on sequentially,
    says so, and logs what a sequential run logs, bit for bit."""
    from conftest import run_cli

    options = (
        "--model.init_args.personal_networks", "[mlp, lenet5]", "--loop.rounds", "2",
        "--loop.clients_per_round", "8", "--loop.plots", "false", "--loop.progress_bar", "false",
    )  # fmt: skip
    auto_rows = run_cli(tmp_path / "auto", *options, config="fml_tiny.yaml")
    err = capsys.readouterr().err
    assert "backend: auto chose CohortBackend" in err
    assert "backend: auto falls back to SequentialBackend (" in err and "personal" in err, err
    plain = run_cli(
        tmp_path / "seq", *options, "--loop.backend", "SequentialBackend", config="fml_tiny.yaml"
    )
    assert (tmp_path / "auto/global.pt").read_bytes() == (tmp_path / "seq/global.pt").read_bytes()
    drop = ("round_time_s", "time_to_target_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in auto_rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in plain
    ]


def test_a_client_that_fails_inside_the_cohort_fails_alone_after_a_fallback(
    tmp_path, cohort_on_cpu, capsys
):
    """A client's fit that raises inside the cohort would fail every client trained with it:
    auto goes on sequentially from that round, where the failure is that client's (the loop's
    failure policy counts one failed client and aggregates the others)."""
    from conftest import run_cli

    rows = run_cli(
        tmp_path, "--model", "user_clients.FailsClientOne", "--loop.rounds", "2",
        "--loop.clients_per_round", "8", "--loop.plots", "false", "--loop.progress_bar", "false",
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "backend: auto falls back to SequentialBackend (a client's fit raised" in err, err
    assert [int(r["clients_failed"]) for r in rows] == [1, 1]  # client 1, every round
