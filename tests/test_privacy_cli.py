"""Differential privacy through the CLI as a user runs it (docs/algorithms.md section 7): epsilon
in metrics.csv and the summary equal the default accountant's (dp-accounting's PLD called
directly) for the run's real (q, z, rounds) and Opacus's PRV within its error, a resume continues
the accountants exactly, Poisson sampling and its empty rounds, and every bad privacy option
(a delta at or above 1/N, a noise or clipping rate outside its range, an unreachable target, an
accountant that cannot bound the plan) is refused in one line before anything is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("opacus")
pytest.importorskip("dp_accounting")

from conftest import overridden, run_cli  # noqa: E402
from fedlightning.loop.sampling import poisson_sample_clients, sample_clients  # noqa: E402
from fedlightning.privacy import calibrate_noise  # noqa: E402
from privacy_reference import PRV_EPS_ERROR, opacus_epsilon, pld_epsilon  # noqa: E402

CONFIGS = Path(__file__).parents[1] / "configs"
AGG = "--loop.aggregator"
DP = [
    "--loop.client_sampling", "poisson", AGG, "fedlightning.privacy.ClientLevelDP",
    f"{AGG}.init_args.noise_multiplier", "1.2", f"{AGG}.init_args.clip_norm", "0.5",
]  # fmt: skip
SGD = ["--loop.dp_sgd", "fedlightning.privacy.DPSGD", "--loop.dp_sgd.init_args.noise_multiplier", "1.1"]  # fmt: skip


def test_client_level_epsilon_in_metrics_and_summary(tmp_path, capsys):
    rows = run_cli(tmp_path / "run", *DP, "--loop.local_steps", "2")
    # tiny.yaml: 8 clients, clients_per_round 4: Poisson rate q = 4 / 8
    for row in rows:
        plan = [(1.2, 0.5, int(row["round"]))]
        epsilon = float(row["dp_epsilon"])
        assert epsilon == pytest.approx(pld_epsilon(plan, 1e-5), rel=1e-12)
        prv = opacus_epsilon("prv", plan, 1e-5)  # a second accountant, within its stated error
        assert prv - 2 * PRV_EPS_ERROR <= epsilon <= prv
        assert float(row["dp_delta"]) == 1e-5 and float(row["dp_clip_norm"]) == 0.5
    assert float(rows[-1]["dp_epsilon"]) > float(rows[0]["dp_epsilon"]) > 0
    err = capsys.readouterr().err
    last = pld_epsilon([(1.2, 0.5, 4)], 1e-5)
    assert (
        f"privacy: client-level (epsilon={last:.4g}, delta=1e-05) after 4 round(s): Poisson "
        "q=0.5, noise multiplier 1.2, pld accountant (dp-accounting)"
    ) in err


def test_the_accountant_option_and_dp_sgd_summary(tmp_path, capsys):
    """accountant: rdp reports Opacus's RDP, and the summary says so; DP-SGD's line names its
    accountant too."""
    rows = run_cli(tmp_path / "run", *DP, f"{AGG}.init_args.accountant", "rdp", *SGD,
                   "--loop.dp_sgd.init_args.accountant", "rdp", "--loop.local_steps", "1",
                   "--loop.rounds", "2")  # fmt: skip
    last = opacus_epsilon("rdp", [(1.2, 0.5, 2)], 1e-5)
    assert float(rows[-1]["dp_epsilon"]) == pytest.approx(last, rel=1e-12)
    err = capsys.readouterr().err
    assert f"(epsilon={last:.4g}, delta=1e-05) after 2 round(s)" in err
    assert "noise multiplier 1.2, rdp accountant (Opacus)" in err
    assert re.search(
        r"privacy: sample-level DP-SGD, .* delta=1e-05, rdp accountant \(Opacus\)", err
    )


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_resume_continues_the_accountants_exactly(tmp_path):
    """2 rounds + resume + 2 rounds = 4 rounds straight: the same weights bit for bit, the same
    client-level epsilon and adaptive clipping norm, the same per-client DP-SGD accountants."""
    options = [*DP, f"{AGG}.init_args.adaptive_clipping", "true",
               f"{AGG}.init_args.count_noise_std", "2.0", *SGD, "--loop.local_steps", "2"]  # fmt: skip
    straight = run_cli(tmp_path / "straight", *options)
    run_cli(tmp_path / "resumed", *options, "--loop.rounds", "2")
    resumed = run_cli(
        tmp_path / "resumed", *options, "--ckpt_path", str(tmp_path / "resumed" / "last.ckpt")
    )
    assert (tmp_path / "straight" / "global.pt").read_bytes() == (
        tmp_path / "resumed" / "global.pt"
    ).read_bytes()
    a, b = (
        torch.load(tmp_path / d / "last.ckpt", weights_only=True) for d in ("straight", "resumed")
    )
    assert _equal(a["aggregator"], b["aggregator"]) and _equal(a["clients"], b["clients"])
    assert a["aggregator"]["inner"]["statistic"]["privacy_spent"] == [[1.2, 0.5, 4]]
    for column in ("dp_epsilon", "dp_clip_norm", "dp_sgd_epsilon_max", "dp_sgd_epsilon_mean"):
        assert [r[column] for r in straight] == [r[column] for r in resumed]
    assert float(straight[-1]["dp_sgd_epsilon_max"]) > 0


def test_poisson_sampling_is_seeded_and_draws_at_the_rate():
    assert poisson_sample_clients(3, 7, 50, 0.2) == poisson_sample_clients(3, 7, 50, 0.2)
    assert poisson_sample_clients(3, 7, 50, 0.2) != poisson_sample_clients(3, 8, 50, 0.2)
    counts = torch.tensor([len(poisson_sample_clients(0, r, 50, 0.2)) for r in range(2000)])
    # Binomial(50, 0.2): mean 10, variance 8; the mean of 2,000 rounds within 5 standard errors
    assert abs(counts.float().mean().item() - 10) < 5 * (8 / 2000) ** 0.5
    assert abs(counts.float().var().item() - 8) < 1.0
    assert len(sample_clients(0, 1, 50, 10)) == 10  # the fixed rule is unchanged


def test_rounds_that_draw_no_client(tmp_path, capsys):
    """q = 1/8 over 8 clients: some rounds draw none. Without DP they train nothing and are no
    failure; under client-level DP every round still releases (and is accounted)."""
    empty = [r for r in range(12) if not poisson_sample_clients(0, r, 8, 1 / 8)]
    assert empty  # the seed's draw has empty rounds
    common = ["--loop.rounds", "12", "--loop.clients_per_round", "1", "--loop.local_steps", "1"]
    rows = run_cli(tmp_path / "plain", *common, "--loop.client_sampling", "poisson")
    err = capsys.readouterr().err
    assert f"{len(empty)} round(s) drew no client (Poisson sampling)" in err
    assert f"summary: {12 - len(empty)} round(s) aggregated, 0 skipped" in err
    assert len(rows) == 12
    rows = run_cli(tmp_path / "dp", *common, *DP)
    assert float(rows[-1]["dp_epsilon"]) == pytest.approx(pld_epsilon([(1.2, 1 / 8, 12)], 1e-5))
    assert "summary: 12 round(s) aggregated, 0 skipped" in capsys.readouterr().err


AGG_ARGS = f"{AGG}.init_args"
BAD = [
    ([*DP, f"{AGG_ARGS}.noise_multiplier", "0"], r"noise_multiplier=0.0 is not allowed: expected a number in \[0.3, 1e\+06\] \(the range the accountants evaluate; 0 adds no noise"),
    ([*DP, f"{AGG_ARGS}.noise_multiplier", "1e300"], r"noise_multiplier=1e\+300 is not allowed: expected a number in \[0.3, 1e\+06\]"),
    ([*DP, f"{AGG_ARGS}.noise_multiplier", "0.1"], r"noise_multiplier=0.1 is not allowed: expected a number in \[0.3, 1e\+06\]"),
    ([*DP, f"{AGG_ARGS}.delta", "0.5"], r"delta=0.5 is not allowed: expected a number in \(0, 1/8 = 0.125\), below 1 over the 8 clients \(a larger delta allows publishing one of them outright"),
    ([*DP, f"{AGG_ARGS}.delta", "0.125"], r"delta=0.125 is not allowed"),
    ([*DP, f"{AGG_ARGS}.clip_learning_rate", "1e6"], r"clip_learning_rate=1000000.0 is not allowed: expected a number in \(0, 10\] \(Andrew et al. use 0.2\)"),
    ([*DP, f"{AGG_ARGS}.clip_norm", "1e300"], r"clip_norm=1e\+300 is not allowed: expected a number in \[1e-09, 1e\+09\]"),
    ([*DP, f"{AGG_ARGS}.noise_multiplier", "null", f"{AGG_ARGS}.target_epsilon", "1e-9", f"{AGG_ARGS}.accountant", "rdp", "--loop.clients_per_round", "1"],
     r"target_epsilon=1e-09 cannot be reached: the smallest epsilon this run can spend is 0.\d+ \(the rdp accountant at the largest noise multiplier allowed, 1e\+06, with q=0.125, 4 step\(s\), delta=1e-05\)"),
    ([*DP, f"{AGG_ARGS}.accountant", "prv", f"{AGG_ARGS}.delta", "1e-30"],
     r"accountant='prv' cannot bound this run's privacy \(ValueError: Floating point errors will dominate.*\) for 4 step\(s\) at noise multiplier 1.2, q=0.5, delta=1e-30: use another accountant"),
    ([*DP, f"{AGG_ARGS}.delta", "1e-300"], r"accountant='pld' cannot bound this run's privacy \(epsilon is inf\)"),
    ([*DP, f"{AGG_ARGS}.noise_multiplier", "-1"], r"noise_multiplier=-1.0 is not allowed"),
    ([*DP, f"{AGG_ARGS}.target_epsilon", "3"], r"noise_multiplier=1.2 and target_epsilon=3.0: set exactly one"),
    ([*DP, f"{AGG_ARGS}.noise_multiplier", "null"], r"noise_multiplier=None and target_epsilon=None: set exactly one"),
    ([*DP, f"{AGG_ARGS}.noise_multiplier", "null", f"{AGG_ARGS}.target_epsilon", "0"], r"target_epsilon=0.0 is not allowed: expected a finite number > 0"),
    ([*DP, f"{AGG_ARGS}.delta", "0"], r"delta=0.0 is not allowed: expected a number in \(0, 1\)"),
    ([*DP, f"{AGG_ARGS}.delta", "1"], r"delta=1.0 is not allowed"),
    ([*DP, f"{AGG_ARGS}.clip_norm", "0"], r"clip_norm=0.0 is not allowed: expected a number in \[1e-09, 1e\+09\]"),
    ([*DP, f"{AGG_ARGS}.target_quantile", "1.5"], r"target_quantile=1.5 is not allowed: expected a number in \(0, 1\)"),
    ([*DP, f"{AGG_ARGS}.clip_learning_rate", "0"], r"clip_learning_rate=0.0 is not allowed"),
    ([*DP, f"{AGG_ARGS}.count_noise_std", "-2"], r"count_noise_std=-2.0 is not allowed: expected null or a finite number > 0"),
    ([*DP, f"{AGG_ARGS}.adaptive_clipping", "true"], r"count_noise_std=0.2 is not allowed: expected more than noise_multiplier / 2 = 0.6"),
    ([*DP, f"{AGG_ARGS}.accountant", "gdp"], r"accountant.*gdp"),
    ([*DP, f"{AGG_ARGS}.inner", "fedlightning.server.FedNova"], r"inner='FedNova' cannot run under client-level DP: FedNova cannot"),
    ([*DP, f"{AGG_ARGS}.inner", "fedlightning.server.Scaffold"], r"inner='Scaffold' cannot run under client-level DP"),
    ([*DP, f"{AGG_ARGS}.inner", "fedlightning.server.FedCross"], r"inner='FedCross' cannot run under client-level DP: FedCross is not built on FedAvg's statistic and server update"),
    ([*DP, f"{AGG_ARGS}.inner", "fedlightning.server.FedAvg"], r"weighting='samples' weights a client by n_i, which the clipping does not bound: use 'uniform'"),
    ([*DP, f"{AGG_ARGS}.inner", "{class_path: fedlightning.server.FedAvg, init_args: {weighting: uniform, aggregation: median}}"], r"by Median \(loop.aggregator.init_args.aggregation='median'\), a statistic over the individual uploads"),
    ([*DP, "--loop.client_sampling", "fixed"], r"loop.client_sampling='fixed' is not allowed: expected 'poisson' under ClientLevelDP"),
    ([*DP, "--loop.min_clients", "2"], r"loop.min_clients=2 is not allowed: expected 1 under ClientLevelDP"),
    (["--loop.client_sampling", "poisson", AGG, "fedlightning.server.FedCross"], r"loop.client_sampling='poisson' draws a varying number of clients a round, but FedCross needs exactly"),
    (["--loop.client_sampling", "random"], r"client_sampling.*random"),
    ([*SGD, "--loop.dp_sgd.init_args.noise_multiplier", "0"], r"loop.dp_sgd.init_args.noise_multiplier=0.0 is not allowed: expected a number in \[0.3, 1e\+06\]"),
    ([*SGD, "--loop.dp_sgd.init_args.noise_multiplier", "1e300"], r"loop.dp_sgd.init_args.noise_multiplier=1e\+300 is not allowed: expected a number in \[0.3, 1e\+06\]"),
    ([*SGD, "--loop.dp_sgd.init_args.max_grad_norm", "1e300"], r"loop.dp_sgd.init_args.max_grad_norm=1e\+300 is not allowed: expected a number in \[1e-09, 1e\+09\]"),
    ([*SGD, "--loop.dp_sgd.init_args.delta", "0.01"], r"loop.dp_sgd.init_args.delta=0.01 is not allowed: expected a number in \(0, 1/\d+ = [\d.e-]+\), below 1 over the \d+ training samples"),
    ([*SGD, "--loop.dp_sgd.init_args.delta", "1e-300"], r"loop.dp_sgd.init_args.accountant='pld' cannot bound this run's privacy \(epsilon is inf\)"),
    ([*SGD, "--loop.dp_sgd.init_args.max_grad_norm", "0"], r"loop.dp_sgd.init_args.max_grad_norm=0.0 is not allowed"),
    ([*SGD, "--loop.dp_sgd.init_args.delta", "2"], r"loop.dp_sgd.init_args.delta=2.0 is not allowed: expected a number in \(0, 1\)"),
    ([*SGD, "--model.init_args.network", "resnet14", "--model.init_args.network_kwargs", "{width: 4, stem: small}"],
     r"loop.dp_sgd cannot train this model: its layer 'network.bn1' \(BatchNorm2d\) normalises each sample by its batch.*GroupNorm"),
    ([*SGD, "--loop.precision", "bf16-mixed"], r"loop.precision='bf16-mixed' is not allowed with loop.dp_sgd"),
    ([*SGD, "--loop.gradient_clip_val", "1"], r"loop.gradient_clip_val=1.0 is not allowed with loop.dp_sgd"),
    ([*SGD, "--loop.backend", "CohortBackend"], r"loop.backend=CohortBackend cannot train this run: it steps each client on its batch gradient, and loop.dp_sgd needs per-sample ones"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a)[-50:] for a, _ in BAD])
def test_bad_privacy_option_is_refused_before_anything_is_written(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path / "bad", *overridden(args))  # DP's defaults, then the case's value
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err, re.S), err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow  # two calibrations by PLD bisections: about 10 to 20 s each
def test_target_epsilon_calibrates_the_noise_for_the_planned_rounds(tmp_path, capsys):
    """target_epsilon=3 over tiny.yaml's 4 rounds at q = 1/2: the calibrated z is the default
    accountant's, the 4th round's epsilon (dp-accounting's PLD called directly) is at most 3
    (within the bisection's tolerance), the run does not stop early,
    and a resume planned for more rounds (another z) is refused."""
    at = DP.index(f"{AGG}.init_args.noise_multiplier")  # given once: calibrated, not 1.2
    calibrated = [*DP[:at], *DP[at + 2:], f"{AGG}.init_args.noise_multiplier", "null",
                  f"{AGG}.init_args.target_epsilon", "3", "--loop.local_steps", "1"]  # fmt: skip
    rows = run_cli(tmp_path / "run", *calibrated)
    z = calibrate_noise(3.0, 1e-5, 0.5, 4)
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]
    assert all(float(r["dp_noise_multiplier"]) == pytest.approx(z, rel=1e-12) for r in rows)
    assert float(rows[-1]["dp_epsilon"]) == pytest.approx(pld_epsilon([(z, 0.5, 4)], 1e-5))
    assert 2.99 <= float(rows[-1]["dp_epsilon"]) <= 3.0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(tmp_path / "run", *calibrated, "--loop.rounds", "8",
                "--ckpt_path", str(tmp_path / "run" / "last.ckpt"))  # fmt: skip
    assert exit_info.value.code == 2
    assert "resume with the loop.rounds the checkpoint's run was planned for" in (
        capsys.readouterr().err
    )


@pytest.mark.slow  # the whole config: 60 rounds of about 40 clients (a few minutes)
def test_the_dp_fedavg_config_learns_at_its_stated_epsilon(tmp_path):
    config = str(CONFIGS / "dp_fedavg.yaml")
    rows = run_cli(tmp_path / "run", "--loop.eval_every", "10", config=config)
    last = rows[-1]
    assert int(last["round"]) == 60
    assert float(last["dp_epsilon"]) == pytest.approx(pld_epsilon([(1.5, 0.1, 60)], 1e-4))
    assert round(float(last["dp_epsilon"]), 2) == 2.30  # the config's header and docs 7.3
    assert float(last["test_acc"]) > 0.8  # chance is 0.1
