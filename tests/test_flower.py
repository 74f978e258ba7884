"""The Flower backend: the wire format, the node mapping, the exported app, and (slow) a real
localhost federation started with Flower's own commands, byte-compared with the sequential backend.
"""

from __future__ import annotations

import logging
import tomllib

import pytest
import torch

pytest.importorskip(
    "flwr", reason="the Flower extra is not installed: pip install 'fedlightning[flower]'"
)

from conftest import CONF, run_cli  # noqa: E402
from fedlightning.backends.base import WorkerLost  # noqa: E402
from fedlightning.backends.flower import FlowerBackend  # noqa: E402
from fedlightning.cli import main  # noqa: E402
from fedlightning.errors import ConfigurationError  # noqa: E402
from fedlightning.flower_app.client import served_clients  # noqa: E402
from fedlightning.flower_app.export import main as export_main  # noqa: E402
from fedlightning.flower_app.local import LocalFederation  # noqa: E402
from fedlightning.flower_app.records import (  # noqa: E402
    jobs_blob,
    missing,
    read_jobs,
    read_results,
    result_of,
    results_blob,
)
from fedlightning.protocol import ClientJob, FitConfig, FitResult, Payload, Upload  # noqa: E402


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_jobs_and_results_cross_the_wire_bit_exact():
    g = torch.Generator().manual_seed(0)
    weights = {"w": torch.randn(4, 3, generator=g), "bn.num_batches_tracked": torch.tensor(7)}
    extras = {
        "c": torch.randn(3, generator=g),
        "nested": {"k": torch.ones(2)},
        "h": torch.ones(2, dtype=torch.bfloat16),
    }
    job = ClientJob(
        3, 5, Payload(weights, extras, model_index=2), {"c_i": torch.randn(3, generator=g)}
    )
    other = ClientJob(3, 1, Payload({"w": torch.zeros(4, 3)}, {}, model_index=0), {})
    config = FitConfig(local_steps=3, seed=11, num_threads=1)
    jobs, back_config, spec, secure = read_jobs(
        jobs_blob([job, other], config, {"model": {"x": 1}})
    )
    assert back_config == config and spec == {"model": {"x": 1}} and secure is None
    back = jobs[0]
    assert [j.client_id for j in jobs] == [5, 1] and jobs[1].payload.model_index == 0
    assert _same(jobs[1].payload.weights, other.payload.weights) and jobs[1].state == {}
    assert (back.round_index, back.client_id, back.payload.model_index) == (3, 5, 2)
    assert _same(back.payload.weights, weights) and _same(back.state, job.state)
    assert _same(back.payload.extras, extras)
    upload = Upload(
        5,
        {"w": torch.randn(4, 3, generator=g)},
        40,
        6,
        {"delta_c": torch.randn(3, generator=g)},
        2,
        {"train_loss": 0.25},
    )
    reply = read_results(
        results_blob(
            {5: FitResult(upload, {"c_i": torch.ones(3)}), 1: (ValueError("bad batch"), "tb text")}
        )
    )
    result = result_of(reply[5], ["w"])
    assert isinstance(result, FitResult)
    assert _same(result.upload.weights, upload.weights) and _same(
        result.upload.extras, upload.extras
    )
    assert (result.upload.num_samples, result.upload.num_steps, result.upload.model_index) == (
        40,
        6,
        2,
    )
    assert result.upload.metrics == {"train_loss": 0.25} and _same(
        result.state, {"c_i": torch.ones(3)}
    )
    assert result_of(reply[1], ["w"]) == {
        "type": "ValueError",
        "message": "bad batch",
        "traceback": "tb text",
    }
    assert 7 not in reply and missing(7)["type"] == "LookupError"  # a client the reply lacks


def test_a_nodes_message_and_reply_are_a_constant_number_of_flower_objects():
    """One node's jobs (1 or 6 clients, a BatchNorm ResNet: 98 tensors each) and its reply travel
    as the same few Flower objects (besides the message: the record dict, one ArrayRecord, one
    Array, its chunk; the reply's timing record): Flower pushes and pulls each on its own."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from fedlightning.clients import ClientModule
    from fedlightning.flower_app.envelope import unwrap, wrap

    net = ClientModule(network="resnet14", network_kwargs={"width": 4, "stem": "small"}).network
    weights = dict(net.state_dict())
    counts, sizes = [], []
    for clients in (1, 6):
        jobs = [ClientJob(0, c, Payload(weights), {}) for c in range(clients)]
        blob = jobs_blob(jobs, FitConfig(), {})
        upload = Upload(0, weights, 10, 2)
        reply = results_blob({c: FitResult(upload, {}) for c in range(clients)})
        message, answer = wrap(blob), wrap(reply, {"replied": 1.0})
        counts.append((len(get_all_nested_objects(message)), len(get_all_nested_objects(answer))))
        sizes.append(len(blob))
        assert unwrap(message) == blob and unwrap(answer) == reply
    assert counts == [(4, 5), (4, 5)]
    assert sizes[1] < 1.2 * sizes[0]  # clients of a payload share its tensors in the blob


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_cross_the_wire_as_cpu_tensors():
    """With ``--accelerator cuda`` the server state, payloads and uploads live on the GPU: the
    wire carries them as CPU tensors, bit for bit, each shared tensor once."""
    weights = {"w": torch.randn(4, 3, device="cuda"), "n": torch.tensor(7, device="cuda")}
    job = ClientJob(
        0, 1, Payload(weights, {"c": weights["w"]}), {"s": torch.ones(2, device="cuda")}
    )
    (back,), config, _, _ = read_jobs(jobs_blob([job], FitConfig(accelerator="cuda"), {}))
    assert config.accelerator == "cuda" and back.payload.weights["w"].device.type == "cpu"
    assert _same(back.payload.weights, {k: v.cpu() for k, v in weights.items()})
    assert back.payload.extras["c"] is back.payload.weights["w"]
    reply = read_results(results_blob({1: FitResult(Upload(1, weights, 3, 1), {})}))
    result = result_of(reply[1], ["w", "n"])
    assert _same(result.upload.weights, {k: v.cpu() for k, v in weights.items()})


def test_node_config_selects_the_clients_a_node_serves():
    assert served_clients({"partition-id": 1, "num-partitions": 3}, 8) == [1, 4, 7]
    assert served_clients({"client-ids": "0, 5,9"}, 8) == [0, 5]
    assert served_clients({}, 3) == [0, 1, 2]


def test_bad_backend_options_are_configuration_errors():
    with pytest.raises(ConfigurationError, match="round_timeout"):
        FlowerBackend(round_timeout=0)
    with pytest.raises(ConfigurationError, match="host:port"):
        FlowerBackend(address="localhost")


class _EmptyGrid:
    """A Flower Grid with no SuperNode connected."""

    def get_node_ids(self):
        return []


def test_the_server_apps_grid_reaches_the_backend_through_the_cli(tmp_path, capsys, monkeypatch):
    """``address: null`` fits on the Grid the ServerApp passes to ``fedlightning.cli.main``; it
    has no nodes here, so the run stops at start-up naming the clients nobody serves (without a
    Grid: that none runs here)."""
    args = [
        "fit", "--config", str(CONF / "tiny.yaml"), "--loop.run_dir", str(tmp_path / "run"),
        "--loop.backend", "fedlightning.backends.flower.FlowerBackend",
        "--loop.backend.init_args.address", "null",
        "--loop.backend.init_args.connect_timeout", "0.5",
    ]  # fmt: skip
    monkeypatch.setattr("sys.argv", ["fedlightning"])  # the arguments are `args`
    for grid, message in (
        (_EmptyGrid(), "no SuperNode serves client(s) [0, 1"),
        (None, "none runs"),
    ):
        with pytest.raises(SystemExit) as stopped:
            main(args, grid=grid)
        assert stopped.value.code == 2
        assert message in capsys.readouterr().err
    with pytest.raises(ConfigurationError, match="address='127.0.0.1:9'.*ServerApp"):
        FlowerBackend(address="127.0.0.1:9").use_grid(_EmptyGrid())


def test_flower_app_export_writes_a_flower_app(tmp_path):
    export_main(["--config", str(CONF / "scaffold_tiny.yaml"), "--out", str(tmp_path / "app")])
    project = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]
    assert app["components"] == {
        "serverapp": "fedlightning_app.server_app:app",
        "clientapp": "fedlightning_app.client_app:app",
    }
    assert app["config"]["fedlightning-config"] == (CONF / "scaffold_tiny.yaml").read_text()
    assert project["project"]["name"] and app["publisher"]
    assert (tmp_path / "app" / "fedlightning_app" / "server_app.py").is_file()
    # the ClientApp a flwr-clientapp process loads for every message imports neither torch nor
    # Lightning (the node's warm worker holds them)
    import subprocess
    import sys

    probe = (
        "import sys; from fedlightning_app.client_app import app; "
        "print(sorted(m for m in ('torch', 'lightning', 'fedlightning') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path / "app", capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- a real federation on 127.0.0.1 ------------------------------------------------------------


def _flower_args(fed: LocalFederation, round_timeout: float = 240) -> list[str]:
    args = [
        "--loop.backend", "fedlightning.backends.flower.FlowerBackend",
        "--loop.backend.init_args.address", fed.address,
        "--loop.backend.init_args.round_timeout", str(round_timeout),
        "--loop.backend.init_args.connect_timeout", "240",
    ]  # fmt: skip
    if fed.root_certificates is None:
        return [*args, "--loop.backend.init_args.insecure", "true"]
    return [*args, "--loop.backend.init_args.root_certificates", fed.root_certificates]


@pytest.mark.slow
def test_localhost_federation_is_byte_identical_to_sequential(tmp_path):
    """FedAvg (with a resume), SCAFFOLD and FedCross, two rounds each, two SuperNodes."""
    with LocalFederation(num_nodes=2) as fed:
        for config in ("tiny.yaml", "scaffold_tiny.yaml", "fedcross_tiny.yaml"):
            name = config.removesuffix(".yaml")
            run_cli(tmp_path / f"{name}-seq", "--loop.rounds", "2", config=config)
            flower = tmp_path / f"{name}-flower"
            if config == "tiny.yaml":  # one round, then resume from its checkpoint
                run_cli(flower, "--loop.rounds", "1", *_flower_args(fed), config=config)
                rows = run_cli(
                    flower, "--loop.rounds", "2", "--ckpt_path", str(flower / "last.ckpt"),
                    *_flower_args(fed), config=config,
                )  # fmt: skip
            else:
                rows = run_cli(flower, "--loop.rounds", "2", *_flower_args(fed), config=config)
            assert [int(r["round"]) for r in rows] == [1, 2]
            assert (flower / "global.pt").read_bytes() == (
                tmp_path / f"{name}-seq" / "global.pt"
            ).read_bytes(), config
        assert "train message" in fed.node_log(0) and "train message" in fed.node_log(1)


@pytest.mark.slow
def test_the_exported_app_runs_with_flwr_run(tmp_path):
    """``fedlightning flower-app`` output, submitted with ``flwr run`` to a local SuperLink, trains
    and writes global.pt equal to the sequential run's."""
    import os
    import subprocess
    import sys
    import time

    config = tmp_path / "one_round.yaml"
    config.write_text((CONF / "tiny.yaml").read_text().replace("rounds: 4", "rounds: 1"))
    run_cli(tmp_path / "seq", config=str(config))
    run_dir = tmp_path / "exported"
    export_main(
        ["--config", str(config), "--out", str(tmp_path / "app"), "--run-dir", str(run_dir)]
    )
    with LocalFederation(num_nodes=2) as fed:
        home = fed.write_flwr_home(tmp_path / "flwr-home")
        flwr = os.path.join(os.path.dirname(sys.executable), "flwr")
        subprocess.run(
            [flwr, "run", str(tmp_path / "app"), "local"],
            env={**fed.env, "FLWR_HOME": str(home)}, check=True, timeout=240,
        )  # fmt: skip
        deadline = time.monotonic() + 400
        while not (run_dir / "global.pt").exists() and time.monotonic() < deadline:
            time.sleep(1)
        if not (run_dir / "global.pt").exists():
            pytest.fail(
                f"the exported app wrote no {run_dir / 'global.pt'} within 400 s of `flwr run`; "
                f"SuperLink log:\n{fed.logs[0].read_text()[-3000:]}"
            )
    assert (run_dir / "global.pt").read_bytes() == (tmp_path / "seq" / "global.pt").read_bytes()


@pytest.mark.slow
def test_a_node_killed_mid_round_follows_the_failure_policy_over_tls_with_node_auth(
    tmp_path, caplog, monkeypatch
):
    """On a SuperLink serving TLS with a throwaway CA (made here, offline) and accepting only
    SuperNodes whose public keys were registered with ``flwr supernode register``, the backend
    connects with ``root_certificates``. Node 1 (odd client ids) dies while it fits; its clients
    fail as lost workers, the run aggregates the others and finishes. A SuperNode with an
    unregistered key is refused."""
    import threading

    with LocalFederation(num_nodes=2, tls=True, node_auth=True) as fed:
        assert fed.root_certificates and "--loop.backend.init_args.insecure" not in _flower_args(
            fed
        )

        def kill_when_training() -> None:
            for _ in range(1200):
                if "train message" in fed.node_log(1):
                    fed.kill_node(1)
                    return
                threading.Event().wait(0.1)

        killer = threading.Thread(target=kill_when_training, daemon=True)
        killer.start()
        seen: list[dict] = []
        original = FlowerBackend.run

        def spy(self, round_index, jobs):
            results = original(self, round_index, jobs)
            seen.append(results)
            return results

        monkeypatch.setattr(FlowerBackend, "run", spy)
        with caplog.at_level(logging.ERROR, logger="fedlightning"):
            rows = run_cli(
                tmp_path / "run", "--loop.rounds", "2", "--loop.min_clients", "1",
                *_flower_args(fed, round_timeout=120),
            )  # fmt: skip
        killer.join(timeout=5)
        stranger = fed.refused_node()
    assert "Failed to initialize the connection to the SuperLink" in stranger
    assert [int(r["round"]) for r in rows] == [1, 2]
    lost = {cid for results in seen for cid, r in results.items() if isinstance(r, WorkerLost)}
    ok = {cid for results in seen for cid, r in results.items() if isinstance(r, FitResult)}
    assert lost and all(cid % 2 == 1 for cid in lost)  # only node 1's clients were lost
    assert ok and all(cid % 2 == 0 for cid in ok)
    assert "failed and are left out" in caplog.text


def test_a_federation_without_tls_refuses_node_authentication():
    with pytest.raises(ValueError, match="needs TLS"):
        LocalFederation(node_auth=True)


def test_the_warm_worker_answers_refuses_strangers_and_leaves_with_its_owner(tmp_path):
    """The worker a SuperNode's ClientApp forwards to: answers a query with the node's clients,
    reports a failing request with its traceback, refuses a wrong key, and exits (removing its
    socket and key) when the process that owns it is gone."""
    import subprocess
    import sys
    import time
    from multiprocessing.connection import AuthenticationError, Client

    from fedlightning.flower_app.envelope import recv_frame, send_frame

    owner = subprocess.Popen(["sleep", "600"])
    address, key = tmp_path / "w.sock", tmp_path / "w.key"
    key.write_bytes(b"k" * 32)
    worker = subprocess.Popen(
        [sys.executable, "-m", "fedlightning.flower_app.worker", str(address), str(key),
         str(owner.pid)]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not address.exists():
            assert worker.poll() is None and time.monotonic() < deadline, "worker did not listen"
            time.sleep(0.1)
        node_config = {"partition-id": 1, "num-partitions": 2}
        with Client(str(address), family="AF_UNIX", authkey=b"k" * 32) as connection:
            send_frame(connection, {"kind": "query", "num_clients": 5, "node_config": node_config})
            reply, _ = recv_frame(connection)
        assert reply == {"status": "ok", "served": [1, 3]}
        with Client(str(address), family="AF_UNIX", authkey=b"k" * 32) as connection:
            send_frame(connection, {"kind": "evaluate", "node_config": {}})
            reply, _ = recv_frame(connection)
        assert reply["status"] == "error" and "KeyError: 'evaluate'" in reply["traceback"]
        with pytest.raises(AuthenticationError):
            Client(str(address), family="AF_UNIX", authkey=b"x" * 32)
        owner.kill()
        owner.wait()
        assert worker.wait(timeout=30) == 0
        assert not address.exists() and not key.exists()
    finally:
        for process in (owner, worker):
            if process.poll() is None:
                process.kill()
                process.wait()


def _readme_flower_commands() -> list[str]:
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## From simulation to a Flower deployment", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [line.strip() for line in block.splitlines() if line.strip()[:1] not in ("", "#")]


@pytest.mark.slow
def test_the_readme_two_machine_commands_run_on_localhost(tmp_path, monkeypatch):
    """The README's deployment commands, as written but with both machines on 127.0.0.1 (free
    ports, data roots in a temporary directory, one round): the run's global.pt equals the
    sequential backend's."""
    import shlex
    from pathlib import Path

    from fedlightning.cli import main
    from fedlightning.flower_app.local import free_port, wait_listening

    root = Path(__file__).parents[1]
    commands = [shlex.split(c) for c in _readme_flower_commands()]
    assert [c[0] for c in commands] == [
        "flower-superlink", "flower-supernode", "flower-supernode", "fedlightning",
    ]  # fmt: skip
    link_port = free_port()

    def local(words: list[str]) -> list[str]:
        out = []
        for word in words:
            for machine in ("0.0.0.0", "10.0.0.1", "10.0.0.2"):
                word = word.replace(machine, "127.0.0.1")
            word = word.replace("127.0.0.1:8000", f"127.0.0.1:{link_port}")
            out.append(word.replace('data-root="/data/', f'data-root="{tmp_path}/'))
        return out

    monkeypatch.chdir(root)
    with LocalFederation(start_flower=False) as fed:
        link, node_a, node_b, fit = (local(c) for c in commands)
        link[link.index("--port") + 1] = str(link_port)
        process, log = fed.start("superlink", link)
        wait_listening(link_port, fed.timeout, process, log)
        for i, node in enumerate((node_a, node_b)):
            port = free_port()
            node[node.index("--port") + 1] = str(port)
            process, log = fed.start(f"supernode{i}", [*node, "--host", "127.0.0.1"])
            wait_listening(port, fed.timeout, process, log)
        extra = ["--loop.rounds", "1", "--loop.progress_bar", "false"]
        sys_argv = ["fedlightning"]
        monkeypatch.setattr("sys.argv", sys_argv)
        ours = {
            "--loop.rounds": "1",
            "--loop.progress_bar": "false",
            "--loop.run_dir": str(tmp_path / "flower"),
        }
        for option, value in ours.items():  # each option once: the README's value replaced
            if option in fit:
                fit[fit.index(option) + 1] = value
            else:
                fit += [option, value]
        main(fit[1:])
    monkeypatch.setattr("sys.argv", ["fedlightning"])
    main(["fit", "--config", "configs/quickstart.yaml", *extra, "--loop.run_dir",
          str(tmp_path / "seq")])  # fmt: skip
    assert (tmp_path / "flower" / "global.pt").read_bytes() == (
        tmp_path / "seq" / "global.pt"
    ).read_bytes()


@pytest.mark.slow
def test_the_overhead_benchmark_runs_and_checks_equality():
    """``benchmarks/flower_overhead.py`` (README) runs and its Flower run equals the sequential."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    done = subprocess.run(
        [sys.executable, "benchmarks/flower_overhead.py", "--rounds", "1", "--repeats", "1",
         "--threads", "1"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global.pt byte-identical: True" in done.stdout
    assert "flower" in done.stdout and "ratio" in done.stdout and "load average" in done.stdout
    assert "clientapp start" in done.stdout  # the round's phases, from the nodes' timestamps
