"""``loop.backend: auto`` chooses by measurement (issue 31 item 2): the cohort only where it
applies and its measured step is clearly faster, both times printed in one line, the measurement
cached and side-effect free, and a resumed run kept on its checkpoint's path. Timings are injected
where a test asserts a choice: no test depends on this machine's speed."""

import warnings

import pytest
import torch

from fedlightning import FedAvg, FederatedDataModule, FederatedLoop
from fedlightning.backends import AutoBackend, CohortBackend, SequentialBackend
from fedlightning.backends.auto import MARGIN
from fedlightning.backends.auto_probe import Timing, measure
from fedlightning.clients import ClientModule, ScaffoldClient
from fedlightning.compute import Compute
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


@pytest.fixture
def timings(monkeypatch):
    """``measure`` replaced: each call takes the next of the given timings and is counted."""
    calls = []

    def install(*given: Timing):
        def fake(model, batch, clients, compute, capture=True):
            calls.append(clients)
            return given[len(calls) - 1]

        monkeypatch.setattr("fedlightning.backends.auto.measure", fake)
        monkeypatch.setattr("fedlightning.backends.auto._MEASURED", {})
        return calls

    return install


@pytest.mark.parametrize(
    ("make", "candidate", "reason"),
    [
        (lambda: ScaffoldClient(**SYNTHETIC), CohortBackend, ""),
        (lambda: Manual(**SYNTHETIC), SequentialBackend, "manual optimization"),
        (lambda: Scheduled(**SYNTHETIC), SequentialBackend, "LR schedulers"),
    ],
)
def test_the_cohort_is_a_candidate_only_where_it_applies(make, candidate, reason, capsys):
    from fedlightning.protocol import FitConfig

    backend = AutoBackend()
    backend.check(make(), FitConfig(accelerator="cpu"), Compute.resolve("cpu", "32-true"))
    assert type(backend.candidate) is candidate and reason in backend.reason
    assert (backend.chosen is None) == (candidate is CohortBackend)  # measured at decide
    assert capsys.readouterr().err == ""  # said when the run starts


@pytest.mark.parametrize(
    ("cohort_ms", "chosen"),
    [
        (1.0, CohortBackend),
        (4.9, CohortBackend),
        (5.5, SequentialBackend),
        (30.0, SequentialBackend),
    ],
)
def test_the_choice_is_the_measured_faster_path_by_a_clear_margin(
    cohort_ms, chosen, tmp_path, timings, capsys
):
    """On the CPU the cohort must take at most half the sequential step's time."""
    calls = timings(Timing(4, 10e-3, cohort_ms * 1e-3))
    loop = _fit(tmp_path, rounds=1)
    assert type(loop.backend.chosen) is chosen and calls == [4]
    line = next(x for x in capsys.readouterr().err.splitlines() if "backend: auto chose" in x)
    assert f"backend: auto chose {chosen.__name__}" in line
    assert f"cohort {cohort_ms:.3g} ms, sequential 10 ms" in line
    identity = torch.load(tmp_path / "last.ckpt", weights_only=False)["identity"]
    assert identity["backend_results"] == ("cohort" if chosen is CohortBackend else "sequential")


def test_a_measurement_is_cached_for_the_process(tmp_path, timings):
    calls = timings(Timing(4, 10e-3, 1e-3))
    _fit(tmp_path / "a", rounds=1)
    _fit(tmp_path / "b", rounds=1)
    assert calls == [4]  # the same model, device, precision, batch shape and clients


def test_a_resume_keeps_the_checkpoints_path_whatever_the_measurement_says(tmp_path, timings):
    calls = timings(Timing(4, 10e-3, 1e-3), Timing(4, 10e-3, 1e-3))
    straight = _fit(tmp_path / "straight", rounds=2)
    assert isinstance(straight.backend.chosen, CohortBackend)
    _fit(tmp_path / "resumed", rounds=1)
    timings(Timing(4, 1e-3, 10e-3))  # the cohort now measures slower: the resume ignores it
    resumed = _fit(
        tmp_path / "resumed", rounds=2, ckpt_path=str(tmp_path / "resumed" / "last.ckpt")
    )
    assert isinstance(resumed.backend.chosen, CohortBackend)
    assert "resumed checkpoint" in resumed.backend.reason
    assert (tmp_path / "resumed" / "global.pt").read_bytes() == (
        tmp_path / "straight" / "global.pt"
    ).read_bytes()
    assert len(calls) == 1


def test_the_real_measurement_chooses_by_its_own_numbers_and_prints_them(tmp_path, capsys):
    """No timing is asserted: the printed choice follows the printed numbers and the rule."""
    loop = _fit(tmp_path, rounds=1)
    line = next(x for x in capsys.readouterr().err.splitlines() if "backend: auto chose" in x)
    cohort = float(line.split("cohort ")[1].split(" ms")[0])
    sequential = float(line.split("sequential ")[1].split(" ms")[0])
    margin = MARGIN["cpu"]
    faster = cohort <= margin * sequential * (1 + 1e-2)  # the printed values are rounded
    slower = cohort >= margin * sequential * (1 - 1e-2)
    assert (faster and isinstance(loop.backend.chosen, CohortBackend)) or (
        slower and isinstance(loop.backend.chosen, SequentialBackend)
    )


def test_the_probe_leaves_the_model_and_the_rng_as_they_were():
    torch.manual_seed(0)
    model = ClientModule(**SYNTHETIC, momentum=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = (torch.randn(16, 6), torch.randint(0, 3, (16,)))
    rng = torch.random.get_rng_state()
    timing = measure(model, batch, 3, Compute.resolve("cpu", "32-true"))
    assert timing.clients == 3 and timing.sequential > 0 and timing.cohort > 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert torch.equal(rng, torch.random.get_rng_state())


def test_vit_attention_is_batched_under_the_cohort():
    """timm's ViT attention runs on scaled-dot-product attention's math kernel under the cohort,
    which vmap batches: no per-client fallback loop (vmap warns when it falls back)."""
    model = ClientModule(
        network="vit_s8", network_kwargs={"embed_dim": 24, "num_heads": 3, "patch_size": 4},
        num_classes=3, in_channels=1, image_size=8, lr=0.01,
    )  # fmt: skip
    batch = (torch.randn(4, 1, 8, 8), torch.randint(0, 3, (4,)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measure(model, batch, 2, Compute.resolve("cpu", "32-true"))
    fallbacks = [w for w in caught if "batching rule" in str(w.message)]
    assert not fallbacks, fallbacks[0].message


def test_a_cohort_that_refuses_the_clients_at_their_round_falls_back_to_sequential(
    tmp_path, timings, capsys
):
    """FML with personal networks of two architectures measures faster on the cohort, which can
    only tell at the round's begin_client that the clients differ: the run goes on sequentially,
    says so, and logs what a sequential run logs, bit for bit."""
    from conftest import run_cli

    options = (
        "--model.init_args.personal_networks", "[mlp, lenet5]", "--loop.rounds", "2",
        "--loop.clients_per_round", "8", "--loop.plots", "false", "--loop.progress_bar", "false",
    )  # fmt: skip
    timings(Timing(8, 10e-3, 1e-3))  # the cohort measures 10x faster
    auto = run_cli(tmp_path / "auto", *options, config="fml_tiny.yaml")
    err = capsys.readouterr().err
    assert "backend: auto chose CohortBackend" in err
    assert "backend: auto falls back to SequentialBackend (" in err and "personal" in err, err
    plain = run_cli(
        tmp_path / "seq", *options, "--loop.backend", "SequentialBackend", config="fml_tiny.yaml"
    )
    assert (tmp_path / "auto/global.pt").read_bytes() == (tmp_path / "seq/global.pt").read_bytes()
    drop = ("round_time_s", "time_to_target_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in auto] == [
        {k: v for k, v in r.items() if k not in drop} for r in plain
    ]


def test_a_client_that_fails_inside_the_cohort_fails_alone_after_a_fallback(
    tmp_path, timings, capsys
):
    """A client's fit that raises inside the cohort would fail every client trained with it:
    auto goes on sequentially from that round, where the failure is that client's (the loop's
    failure policy counts one failed client and aggregates the others)."""
    from conftest import run_cli

    timings(Timing(8, 10e-3, 1e-3))  # the cohort measures 10x faster
    rows = run_cli(
        tmp_path, "--model", "user_clients.FailsClientOne", "--loop.rounds", "2",
        "--loop.clients_per_round", "8", "--loop.plots", "false", "--loop.progress_bar", "false",
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "backend: auto falls back to SequentialBackend (a client's fit raised" in err, err
    assert [int(r["clients_failed"]) for r in rows] == [1, 1]  # client 1, every round
