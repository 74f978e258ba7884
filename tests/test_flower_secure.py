"""Secure aggregation on the Flower backend (Flower's SecAgg+): the node's vector and the server's
stand-ins against the plain aggregate within the quantisation bound of docs/algorithms.md section
2.7 (fast: Flower's own quantisation and unmasking arithmetic, without the network), the refusals
(aggregators that need individual uploads, upload attacks, bad SecAgg+ options) before anything
is written, and
(slow) a localhost federation with two SuperNodes, round 1 against the sequential backend and
round 2 against a plain Flower round resumed from the same checkpoint.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

pytest.importorskip(
    "flwr", reason="the Flower extra is not installed: pip install 'fedlightning[flower]'"
)

from conftest import CONF, run_cli  # noqa: E402
from fedlightning.backends.flower import FlowerBackend  # noqa: E402
from fedlightning.cli import main  # noqa: E402
from fedlightning.clients import ClientModule  # noqa: E402
from fedlightning.errors import ConfigurationError  # noqa: E402
from fedlightning.flower_app.local import LocalFederation  # noqa: E402
from fedlightning.flower_app.secure import node_vector, plan_round, stand_ins  # noqa: E402
from fedlightning.flower_app.secure_options import check_nodes, secure_options  # noqa: E402
from fedlightning.protocol import ClientJob, FitResult, Upload  # noqa: E402
from fedlightning.server import FedAdam, FedAvg  # noqa: E402

C, T = 8.0, 2**22


def flower_sum(vectors: list[bytes], clipping: float = C, target: int = T) -> bytes:
    """What Flower's SecAgg+ hands the strategy for these node vectors: each quantised as
    ``secaggplus_mod`` does (weight 1 = max_weight), summed (the masks cancel exactly modulo the
    modulus), dequantised as ``SecAggPlusWorkflow.unmask_stage`` does."""
    from flwr.common import bytes_to_ndarray, ndarray_to_bytes
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        factor_combine,
        factor_extract,
        parameters_addition,
    )
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    quantised = [
        factor_combine(target, quantize([bytes_to_ndarray(v)], clipping, target)) for v in vectors
    ]
    total = quantised[0]
    for other in quantised[1:]:
        total = parameters_addition(total, other)
    q_total, rest = factor_extract(total)
    (aggregate,) = dequantize(rest, clipping, target)
    aggregate += -(len(vectors) - 1) * clipping
    aggregate *= target / q_total
    return ndarray_to_bytes(aggregate)


def _model(heterogeneous: bool) -> ClientModule:
    kwargs = {"network_kwargs": {"width": 4, "stem": "small"}, "num_classes": 3,
              "in_channels": 1, "image_size": 8}  # fmt: skip
    if heterogeneous:
        return ClientModule(networks=["resnet10", "resnet14"], **kwargs)
    return ClientModule(network="resnet14", **kwargs)


def _round(aggregator, heterogeneous: bool, num_clients: int = 6):
    """An aggregator set up on a BatchNorm ResNet, round 0's jobs for clients 0..4 and their
    uploads (trained weights: payload + noise; counters: payload + steps), client 3 failing."""
    model = _model(heterogeneous)
    initial = {k: v.detach().clone() for k, v in model.network.state_dict().items()}
    aggregator.setup(
        initial, num_clients, client_keys=model.client_key_sets(num_clients),
        parameters=model.server_parameter_names(),
    )  # fmt: skip
    ids = [0, 1, 2, 3, 4]
    payloads = aggregator.configure_round(0, ids)
    jobs = [ClientJob(0, cid, payloads[cid], {}) for cid in ids]
    g = torch.Generator().manual_seed(0)
    outcomes = {}
    for job in jobs:
        if job.client_id == 3:
            outcomes[3] = (RuntimeError("out of memory"), "traceback text")
            continue
        weights = {
            k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v + 7
            for k, v in job.payload.weights.items()
        }
        upload = Upload(job.client_id, weights, 20 + 9 * job.client_id, 7, {}, 0,
                        {"train_loss": 1.0 + job.client_id / 10})  # fmt: skip
        outcomes[job.client_id] = FitResult(upload, {})
    return jobs, outcomes


def _secure_uploads(jobs, outcomes, weighting="samples"):
    batches = {
        10: [j for j in jobs if j.client_id % 2 == 0],
        11: [j for j in jobs if j.client_id % 2],
    }
    samples = {j.client_id: 20 + 9 * j.client_id for j in jobs}  # the server's n_i
    plans, layout = plan_round(batches, weighting, samples, C)
    plain, vectors = {}, []
    for node, batch in batches.items():
        part, vector = node_vector(batch, {j.client_id: outcomes[j.client_id] for j in batch},
                                   plans[node])  # fmt: skip
        assert part["refused"] is None
        plain.update({e["client"]: e for e in part["results"]})
        vectors.append(vector)
    results = stand_ins(jobs, layout, flower_sum(vectors), len(vectors), plain)
    assert set(results) == {0, 1, 2, 4} and plain[3]["error"]["type"] == "RuntimeError"
    return [results[cid].upload for cid in (0, 1, 2, 4)], layout


def _bound(layout, jobs, aggregator, nodes: int = 2) -> dict[str, float]:
    """Per server key, J (2C/T) / m_p with m_p the succeeding owners' share of the round's
    weight (with ``within_groups``, the owners in the key's group)."""
    total, mass = layout["total_weight"], {}
    for job in jobs:
        if job.client_id == 3:
            continue
        group = aggregator.client_keys[job.client_id].group if aggregator.client_keys else ""
        for key in job.payload.weights:
            if job.payload.weights[key].is_floating_point():
                name = f"{group}/{key}" if getattr(aggregator, "grouped", False) else key
                mass[name] = mass.get(name, 0.0) + (20 + 9 * job.client_id) / total
    return {k: nodes * (2 * C / T) / m for k, m in mass.items()}


def _within(secure: dict, plain: dict, bound: dict[str, float]) -> float:
    """Assert every entry within its bound (plus one ulp); the largest error in bounds."""
    worst = 0.0
    for key, value in plain.items():
        if not value.is_floating_point():
            assert torch.equal(secure[key], value), key  # counters: the first owner's, exact
            continue
        big = torch.maximum(secure[key].abs(), value.abs())
        ulp = torch.nextafter(big, torch.tensor(float("inf"))) - big
        error = (secure[key].double() - value.double()).abs()
        assert bool((error <= bound[key] + ulp.double()).all()), key
        worst = max(worst, float((error / bound[key]).max()))
    return worst


@pytest.mark.parametrize(
    "make, heterogeneous",
    [
        (FedAvg, False),
        (lambda: FedAdam(server_lr=0.5), False),
        (FedAvg, True),
        (lambda: FedAvg(within_groups=True), True),
    ],  # fmt: skip
    ids=["fedavg", "fedadam", "heteroavg", "within_groups"],
)
def test_secure_stand_ins_give_the_plain_aggregate_within_the_bound(make, heterogeneous):
    """The owner-aware mean from SecAgg+'s sum equals the mean of the real uploads within
    J (2C/T) / m_p + 1 ulp per entry (BatchNorm statistics included; counters exact), for FedAvg,
    a server optimizer (the mean its step receives), clients owning different keys, and one model
    per group."""
    plain_agg = make()
    jobs, outcomes = _round(plain_agg, heterogeneous)
    secure_agg = copy.deepcopy(plain_agg)
    means = {}
    for name, agg in (("plain", plain_agg), ("secure", secure_agg)):
        hook = agg.server_update
        agg.server_update = lambda r, hook=hook, name=name: (
            means.setdefault(name, r.mean) and hook(r)
        )
    plain_agg.aggregate(0, [outcomes[c].upload for c in (0, 1, 2, 4)])
    uploads, layout = _secure_uploads(jobs, outcomes)
    secure_agg.aggregate(0, uploads)
    bound = _bound(layout, jobs, plain_agg)
    worst = _within(means["secure"], means["plain"], bound)
    assert 0 < worst < 1  # quantisation happened, and stayed inside the bound
    if type(plain_agg) is FedAvg:  # the new server state is the mean
        _within(secure_agg.weights, plain_agg.weights, bound)
    losses = [outcomes[c].upload.metrics["train_loss"] for c in (0, 1, 2, 4)]
    loss_bound = 2 * (2 * C / T) * 5 * C / 4
    assert abs(uploads[0].metrics["train_loss"] - sum(losses) / 4) < loss_bound


def test_a_node_refuses_values_beyond_the_clipping_range_and_client_state():
    agg = FedAvg()
    jobs, outcomes = _round(agg, False)
    batch = [j for j in jobs if j.client_id in (0, 2)]
    plans, _ = plan_round({0: batch}, "samples", {0: 20, 2: 38}, clipping_range=1e-3)
    plain, vector = node_vector(batch, outcomes, plans[0])
    assert "clipping_range" in plain["refused"] and "[-0.001, 0.001]" in plain["refused"]
    assert "(for the train loss slot)" in plain["refused"]  # sum of losses / (K C) > C
    silent = {c: FitResult(Upload(c, o.upload.weights, o.upload.num_samples, 7), {})
              for c, o in outcomes.items() if c in (0, 2)}  # fmt: skip
    plain, _ = node_vector(batch, silent, plans[0])
    sums = {  # the node's sum per key, sum_i alpha_i (w_i - x), alpha_i = n_i / (20 + 38)
        k: sum((silent[c].upload.weights[k] - x) * silent[c].upload.num_samples / 58
               for c in (0, 2)).abs().max()
        for k, x in batch[0].payload.weights.items() if x.is_floating_point()
    }  # fmt: skip
    assert f"(for {max(sums, key=lambda k: sums[k])})" in plain["refused"]
    from flwr.common import bytes_to_ndarray

    assert not bytes_to_ndarray(vector).any()  # the node takes part adding nothing
    stateful = {0: FitResult(outcomes[0].upload, {"c_i": torch.zeros(2)}), 2: outcomes[2]}
    plans, _ = plan_round({0: batch}, "samples", {0: 20, 2: 38}, clipping_range=C)
    plain, _ = node_vector(batch, stateful, plans[0])
    assert "per-client state" in plain["refused"] and "c_i" in plain["refused"]
    nan = outcomes[2].upload
    bad = Upload(2, {k: v * float("nan") if v.is_floating_point() else v
                     for k, v in nan.weights.items()}, 38, 7)  # fmt: skip
    plain, _ = node_vector(batch, {0: outcomes[0], 2: FitResult(bad, {})}, plans[0])
    assert plain["refused"] is None and plain["results"][1]["error"]["type"] == "NonFiniteUpload"


@pytest.mark.parametrize(
    "options, match",
    [
        ({"num_shares": 2}, "num_shares=2"),
        ({"num_shares": 1.5}, "num_shares=1.5"),
        ({"num_shares": 3, "reconstruction_threshold": 3}, "reconstruction_threshold=3"),
        ({"reconstruction_threshold": 1}, "reconstruction_threshold=1"),
        ({"clipping_range": 0.0}, "clipping_range=0.0"),
        ({"clipping_range": float("inf")}, "clipping_range=inf"),
        ({"quantization_range": 2**31}, "quantization_range=2147483648"),
        ({"modulus_range": 3 * 2**22}, "modulus_range=12582912"),
        ({"modulus_range": 2**22}, "modulus_range=4194304"),
        ({"modulus_range": 2**33}, "modulus_range=8589934592"),
    ],
)
def test_bad_secagg_options_are_configuration_errors(options, match):
    with pytest.raises(ConfigurationError, match=match):
        FlowerBackend(secure_aggregation=True, **options)


def test_secagg_options_without_secure_aggregation_are_refused():
    with pytest.raises(ConfigurationError, match="clipping_range=4.0.*secure_aggregation is true"):
        FlowerBackend(clipping_range=4.0)


def test_secagg_options_must_fit_the_number_of_supernodes():
    options = secure_options(True, num_shares=1.0, reconstruction_threshold=0.75,
                             clipping_range=C, quantization_range=T, modulus_range=2**32)  # fmt: skip
    check_nodes(options, 2)
    with pytest.raises(ConfigurationError, match="at least 2 SuperNodes"):
        check_nodes(options, 1)
    with pytest.raises(ConfigurationError, match="modulus_range=4294967296.*1024 SuperNodes"):
        check_nodes(options, 1024)  # 1024 x 2**22 = 2**32 wraps around to 0
    with pytest.raises(ConfigurationError, match="num_shares=5.*at most the 4 SuperNodes"):
        check_nodes({**options, "num_shares": 5}, 4)
    with pytest.raises(ConfigurationError, match="reconstruction_threshold=4.*at most the 3"):
        check_nodes({**options, "num_shares": 3, "reconstruction_threshold": 4}, 5)


@pytest.mark.parametrize(
    "config, aggregator, match",
    [
        ("fedcross_tiny.yaml", [], "FedCross cannot run on it: its cross-aggregation"),
        ("scaffold_tiny.yaml", [], "Scaffold cannot run on it: its clients keep c_i"),
        (
            "tiny.yaml",
            ["--loop.aggregator", "FedNova", "--model", "FedNovaClient"],
            "FedNova cannot run on it",
        ),
        (
            "tiny.yaml",
            ["--loop.aggregator", "FedAvg", "--loop.aggregator.init_args.aggregation", "median"],
            "aggregation='median'",
        ),  # fmt: skip
        (
            "tiny.yaml",
            ["--loop.aggregator", "FedAvgM", "--loop.aggregator.init_args.clip_norm", "1.0"],
            "clip_norm=1.0",
        ),  # fmt: skip
        (
            "tiny.yaml",
            ["--loop.aggregator", "fedlightning.server.Krum"],
            "Krum cannot run on it: its statistic Krum (loop.aggregator=Krum) reads each client",
        ),  # fmt: skip
    ],
    ids=["fedcross", "scaffold", "fednova", "median", "clip_norm", "krum"],
)
def test_aggregators_that_need_individual_uploads_are_refused_before_anything_is_written(
    tmp_path, capsys, monkeypatch, config, aggregator, match
):
    """Through the CLI, as a user runs it: exit 2 naming the reason, before any connection to
    a SuperLink (none listens on port 9) and before the run directory exists."""
    monkeypatch.setattr("sys.argv", ["fedlightning"])
    with pytest.raises(SystemExit) as stopped:
        main([
            "fit", "--config", str(CONF / config), "--loop.run_dir", str(tmp_path / "run"),
            "--loop.backend", "FlowerBackend", "--loop.backend.init_args.address", "127.0.0.1:9",
            "--loop.backend.init_args.secure_aggregation", "true", *aggregator,
        ])  # fmt: skip
    assert stopped.value.code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("attack", ["SignFlip", "ALIE"])
def test_an_upload_attack_is_refused_under_secure_aggregation(
    tmp_path, capsys, monkeypatch, attack
):
    """SecAgg+ hands the server only the sum: the uploads the loop sees are stand-ins, and an
    attack that replaced them after the secure sum changed the model by 0.048 against the
    sequential backend's same attack (the bound is 7.6e-6). Refused at start-up (exit 2),
    before any connection and before the run directory exists."""
    monkeypatch.setattr("sys.argv", ["fedlightning"])
    with pytest.raises(SystemExit) as stopped:
        main([
            "fit", "--config", str(CONF / "tiny.yaml"), "--loop.run_dir", str(tmp_path / "run"),
            "--loop.backend", "FlowerBackend", "--loop.backend.init_args.address", "127.0.0.1:9",
            "--loop.backend.init_args.secure_aggregation", "true",
            "--loop.attack", f"fedlightning.attacks.{attack}",
            "--loop.attack.init_args.fraction", "0.25",
        ])  # fmt: skip
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"fedlightning: error: loop.attack={attack} replaces the malicious clients' uploads on "
        "the server, but FlowerBackend delivers the server only the sum of the uploads (secure "
        "aggregation), so there is no upload to replace: use LabelFlip (the malicious clients "
        "train on flipped labels, before the masking), or turn off "
        "loop.backend.init_args.secure_aggregation"
    )
    assert not (tmp_path / "run").exists()


def test_a_secure_round_loses_its_clients_with_one_node_left_and_stops_past_the_modulus():
    """Mid-run: one SuperNode left cannot run SecAgg+ (it would reveal that node's vector): its
    clients are lost workers for the failure policy; nodes that joined until nodes x T reaches
    the modulus would wrap the sum around: the run stops naming the option."""
    from fedlightning.backends.flower_rounds import secure_round
    from fedlightning.errors import WorkerLost
    from fedlightning.protocol import Payload

    backend = FlowerBackend(secure_aggregation=True)
    job = ClientJob(0, 0, Payload({"w": torch.zeros(2)}), {})
    backend.served = {7: [0, 1]}
    (result,) = secure_round(backend, 0, {7: [job]}).values()
    assert isinstance(result, WorkerLost) and "needs 2 SuperNodes" in str(result)
    backend.served = {node: [0] for node in range(1024)}
    with pytest.raises(ConfigurationError, match="modulus_range=4294967296"):
        secure_round(backend, 0, {0: [job]})


# -- a real federation on 127.0.0.1 ------------------------------------------------------------
#: a BatchNorm ResNet on equal clients (162 samples: no one-sample batch, which BatchNorm refuses),
#: trained gently (its running variances still move by up to ~5 per round; at lr 0.1 with momentum
#: they jump by thousands in some rounds, and the run stops naming clipping_range)
BN_MODEL = ["--model.init_args.network", "resnet14",
            "--model.init_args.network_kwargs", '{"width": 4, "stem": "small"}',
            "--data.partition", "iid", "--model.init_args.lr", "0.01",
            "--model.init_args.momentum", "0.0", "--loop.local_epochs", "1"]  # fmt: skip
#: the slow test's SecAgg+ range: 128 times the default clipping range with 256 times the
#: quantisation range, a finer step (2C/T = 2**-19) over a range that holds the BatchNorm
#: statistics; 2 nodes x 2**30 stays below the modulus 2**32
C_FED, T_FED = 1024.0, 2**30


def _flower(fed: LocalFederation, secure: bool) -> list[str]:
    args = [
        "--loop.backend", "FlowerBackend", "--loop.backend.init_args.address", fed.address,
        "--loop.backend.init_args.insecure", "true",
        "--loop.backend.init_args.round_timeout", "240",
        "--loop.backend.init_args.connect_timeout", "240",
    ]  # fmt: skip
    secure_args = ["--loop.backend.init_args.secure_aggregation", "true",
                   "--loop.backend.init_args.clipping_range", str(C_FED),
                   "--loop.backend.init_args.quantization_range", str(T_FED)]  # fmt: skip
    return [*args, *secure_args] if secure else args


def _assert_within_bound(secure_path, plain_path, nodes: int = 2) -> None:
    secure, plain = torch.load(secure_path), torch.load(plain_path)
    bound = dict.fromkeys(plain, nodes * 2 * C_FED / T_FED)  # every client succeeded: m_p = 1
    worst = _within(secure, plain, bound)
    assert 0 < worst < 1, worst


@pytest.mark.slow
def test_secagg_on_a_localhost_federation_equals_the_plain_run_within_the_bound(tmp_path):
    """Two SuperNodes, a BatchNorm ResNet, SecAgg+ (:data:`C_FED`, :data:`T_FED`): round 1 within
    the bound of the sequential backend's round 1; round 2 (resumed from the secure round 1's
    checkpoint) within the bound of a plain Flower round 2 resumed from that same checkpoint.
    Each node takes part in SecAgg+'s four stages per secure round."""
    args = ["--loop.rounds", "1", "--loop.clients_per_round", "4", *BN_MODEL]
    run_cli(tmp_path / "seq", *args)
    with LocalFederation(num_nodes=2) as fed:
        rows = run_cli(tmp_path / "secure", *args, *_flower(fed, secure=True))
        assert rows[0]["clients_failed"] == "0"
        _assert_within_bound(tmp_path / "secure" / "global.pt", tmp_path / "seq" / "global.pt")
        (tmp_path / "plain").mkdir()
        shutil.copy(tmp_path / "secure" / "last.ckpt", tmp_path / "plain" / "round1.ckpt")
        resume = ["--loop.rounds", "2", "--loop.clients_per_round", "4", *BN_MODEL]
        rows = run_cli(
            tmp_path / "secure", *resume, "--ckpt_path", str(tmp_path / "secure" / "last.ckpt"),
            *_flower(fed, secure=True),
        )  # fmt: skip
        assert [r["clients_failed"] for r in rows] == ["0", "0"]
        run_cli(
            tmp_path / "plain", *resume, "--ckpt_path", str(tmp_path / "plain" / "round1.ckpt"),
            *_flower(fed, secure=False),
        )  # fmt: skip
        messages = [fed.node_log(i).count("Receiving: train message") for i in (0, 1)]
    _assert_within_bound(tmp_path / "secure" / "global.pt", tmp_path / "plain" / "global.pt")
    assert messages == [2 * 4 + 1] * 2  # SecAgg+'s four stages per secure round, one plain
