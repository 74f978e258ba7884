"""The README as written, top to bottom, as a new user runs it after ``make demo`` (issue 26 item 7).

Every shell command of the README's ```bash blocks runs in the README's order, as written, from the
root of a fresh copy of this checkout (its tracked and unignored files). That copy gets a
``.venv`` of its own that sees the installed packages of this checkout's ``.venv`` and the copy's
``src`` (what ``make install`` would make of the copy: an editable install), so ``make``,
``source .venv/bin/activate``, ``fedlightning``, ``python`` and Flower's commands are the copy's;
``make`` is checked with a dry run first never to install anything. Each command must exit 0.

Left out (:data:`SKIP`, with the reason and where their work is tested instead): commands that need
data not on this machine (CIFAR, Hugging Face data sets on disk) or a GPU, ``make test`` (the
default suite, run on its own) and the CPU benchmarks, which repeat their timings for minutes (each
is run tiny by a test of its own: tests/test_startup_bench.py, test_scale_bench.py, test_flower.py). Long commands are shortened only with options the README
documents for them (:data:`SHORTEN`; each must appear in the README). The Flower servers are
started in the background as the README's one-host note says (127.0.0.1 for both machines) and
stopped after the block. No command may print a third-party warning (tests/stderr_noise.py).
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stderr_noise import third_party_warnings

pytestmark = pytest.mark.slow  # the whole README but the CPU benchmarks (run by their own tests)

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()

#: command prefix -> why it is not run here (and where what it does is tested)
SKIP = {
    "make test": "the default test suite: `make test` runs it on its own (this test is part of "
    "the slow suite, `make test-all`)",
    "make notebooks-open": "a JupyterLab server that runs until Ctrl-C; "
    "tests/test_notebooks.py starts it as this target does and opens a notebook through it",
    "make notebooks": "every notebook at full size; tests/test_notebooks.py executes the same "
    "notebooks at tiny size",
    "fedlightning fit -c configs/quickstart.yaml --data.dataset huggingface": "needs Hugging "
    "Face data sets saved under data/ (none on this machine); tests/test_readme_hf.py runs these "
    "commands on the folders the README's save_to_disk lines make from tiny stand-ins, "
    "tests/test_hf_data.py trains the same options, tests/test_readme_commands.py parses these",
    "fedlightning fit --config configs/experiments/": "needs CIFAR-10 under data/; "
    "tests/test_readme_commands.py resolves these commands and configs",
    "fedlightning cofed --config configs/experiments/cofed_cifar100.yaml": "needs CIFAR-100 and "
    "CIFAR-10 under data/; tests/test_readme_commands.py resolves it, tests/test_cofed*.py run "
    "CoFED's pipeline on the digits",
    "fedlightning fit -c configs/experiments/fedcross_cifar10_cnn.yaml --seeds": "needs CIFAR-10 "
    "under data/ (the paper-table recipe); the seed sweep recipe below runs --seeds on the digits",
    'python -c "from datasets import load_dataset;': "downloads from the Hugging Face Hub (no "
    "internet here); tests/test_readme_hf.py runs these lines with load_dataset answering from "
    "tiny data sets of the same columns and splits, then the commands that read their folders",
    "python benchmarks/overhead.py --accelerator cuda": "needs a GPU",
    "python benchmarks/scaling.py --accelerator cuda": "needs a GPU",
    "python benchmarks/gpu_check.py": "needs a GPU",
    "python benchmarks/gpu_all.py": "needs a GPU; tests/test_gpu_all.py runs it tiny on the CPU",
    "python benchmarks/yardstick.py": "needs a GPU at its size; tests/test_yardstick_bench.py "
    "runs it tiny on the CPU and checks its table",
    # the CPU benchmarks time their paths over several repeats (the walk's longest commands);
    # each is run tiny by a test of its own, which checks what it prints
    ".venv/bin/python benchmarks/overhead.py": "a benchmark; tests/test_startup_bench.py runs "
    "it tiny (one case, one repeat) and checks its table",
    "python benchmarks/flower_overhead.py": "a benchmark; tests/test_flower.py runs it for one "
    "round and one repeat and checks its Flower run equals the sequential",
    "nice -n 15 .venv/bin/python benchmarks/scale.py": "a benchmark; tests/test_scale_bench.py "
    "runs its table at small sizes",
    ".venv/bin/python benchmarks/cohort.py": "a benchmark; tests/test_startup_bench.py runs "
    "`--quick` with one repeat",
    ".venv/bin/python benchmarks/startup.py": "a benchmark; tests/test_startup_bench.py runs it "
    "for one round and one repeat",
    ".venv/bin/python benchmarks/defaults.py": "a benchmark; tests/test_startup_bench.py runs it "
    "on the quickstart for one round and one repeat",
    "python experiments/time_effects.py": "its `--quick` smoke test is what this walk would run; "
    "tests/test_time_effects_experiment.py runs that and checks both of its tables",
    "fedlightning fit --config configs/quickstart.yaml --loop.backend FlowerBackend "
    "--loop.backend.init_args.address 127.0.0.1:8000 --loop.backend.init_args.insecure true "
    "--loop.backend.init_args.secure_aggregation true": "needs the SuperLink and the two "
    "SuperNodes of the deployment block above, which this walk stops after their block; "
    "tests/test_flower_secure.py runs the same options through the CLI on a localhost federation",
}
#: command -> options appended to make it short; each string is documented in the README
SHORTEN = {
    "python experiments/objectives.py": "--rounds 3 --seeds 0",
    "python experiments/fedcross.py": "--rounds 2 --seeds 1 --no-ablation",
    "python experiments/cofed.py": "--seeds 1",
    "python experiments/hetero.py": "--rounds 3 --seeds 0",
    "python experiments/personalized.py": "--rounds 1 --seeds 0 --datasets digits --splits "
    "pathological --methods FedAvg-FT Ditto",
    # `--loop.rounds` (README, *Running*): the configs' 30 and 60 rounds teach nothing more here
    "fedlightning fit --config configs/fedavg.yaml": "--loop.rounds 4",
    "fedlightning fit --config configs/fedcross.yaml": "--loop.rounds 4",
    "fedlightning fit -c configs/fedavg.yaml": "--loop.rounds 4",
    "fedlightning fit -c configs/fedper.yaml": "--loop.rounds 4",
    # 60 server updates each; tests/test_config_accuracy.py runs both configs whole
    "fedlightning fit --config configs/fedbuff.yaml": "--loop.rounds 10",
    "fedlightning fit --config configs/fedasync.yaml": "--loop.rounds 10",
    "fedlightning fit -c configs/quickstart.yaml --loop.backend RayBackend": "--loop.rounds 3",
    # 30 rounds at about 10 s a round on one machine (README: Flower's per-round cost)
    "fedlightning fit --config configs/quickstart.yaml --loop.backend FlowerBackend": "--loop.rounds 2",
}
#: long-running servers: started in the background and stopped after their block
SERVERS = ("flower-superlink", "flower-supernode")


def readme_blocks() -> list[list[str]]:
    """The README's ```bash blocks, each as its commands: continuation lines joined, comments
    dropped, a ``for ... done`` loop one command."""
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        commands, loop = [], []
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if not line or line.startswith("#"):
                continue
            if loop or line.startswith("for "):
                loop.append(line)
                depth = sum(w.startswith("for ") for w in loop) - sum(w == "done" for w in loop)
                if depth == 0:
                    commands.append("\n".join(loop))
                    loop = []
                continue
            commands.append(re.sub(r"\s+", " ", line))
        blocks.append(commands)
    return blocks


def skip_reason(command: str) -> str | None:
    return next((why for prefix, why in SKIP.items() if command.startswith(prefix)), None)


def fresh_checkout(target: Path) -> Path:
    """This checkout's tracked and unignored files, copied to ``target``, with a ``.venv`` that
    runs the copy's sources with this checkout's installed packages."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    installed = Path(sys.prefix).resolve()  # this checkout's .venv (its scripts name it so)
    venv = target / ".venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python*/site-packages")
    (installed_site,) = (installed / "lib").glob("python*/site-packages")
    (site / "_readme_walk.pth").write_text(
        f"{target / 'src'}\nimport site; site.addsitedir({str(installed_site)!r})\n"
    )
    python = venv / "bin" / "python"
    for script in (installed / "bin").iterdir():  # console scripts, on the copy's python
        text = script.read_text(errors="replace") if script.is_file() else ""
        if (
            text.startswith(f"#!{installed}/bin/python")
            and not (venv / "bin" / script.name).exists()
        ):
            (venv / "bin" / script.name).write_text(f"#!{python}\n" + text.split("\n", 1)[1])
            (venv / "bin" / script.name).chmod(0o755)
    (venv / ".installed").touch()  # make's stamp: installed, newer than pyproject.toml
    return target


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _port(command: list[str]) -> int:
    return int(command[command.index("--port") + 1])


def _in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_readme_runs_top_to_bottom_after_make_demo(tmp_path):
    from fedlightning.flower_app.local import LocalFederation, wait_listening

    for command, options in SHORTEN.items():  # the README documents every shortening
        names = [word for word in options.split() if word.startswith("--")]
        assert options in README or (
            command.startswith("fedlightning fit") and all(f"{n} " in README for n in names)
        ), f"{command}: {options!r} is not documented in the README"
    checkout = fresh_checkout(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # one intra-op thread, as the whole suite (conftest): on shared cores torch's default of one
    # thread per core spins and slows every round tenfold; the result does not depend on it
    # (Ray's byte identity with the default thread count: tests/test_ray_threads.py)
    env["OMP_NUM_THREADS"] = "1"
    paths = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)  # a shell without .venv
    venvs = (sys.prefix, str(Path(sys.prefix).resolve()))
    env["PATH"] = os.pathsep.join(p for p in paths if not p.startswith(venvs))
    activated, ran, skipped = False, [], []
    noise: list[str] = []  # third-party warnings a command printed (issue 38 item 3)

    def run(command: str) -> None:
        script = f"set -e\n{'source .venv/bin/activate' if activated else ''}\n{command}"
        started, cpu = time.monotonic(), _children_cpu()
        done = subprocess.run(
            ["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True,
            timeout=3600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        ran.append((command, time.monotonic() - started, _children_cpu() - cpu))
        noise.extend(f"{command}: {line}" for line in third_party_warnings(done.stderr))

    blocks = readme_blocks()
    assert blocks[0][:3] == ["make demo", "make test", "source .venv/bin/activate"]
    for commands in blocks:
        federation = None
        try:
            for command in commands:
                why = skip_reason(command)
                if why is not None:
                    skipped.append((command, why))
                    continue
                for prefix, options in SHORTEN.items():
                    if command.startswith(prefix) and options not in command:
                        command = f"{command} {options}"
                if command == "source .venv/bin/activate":
                    assert (checkout / ".venv" / "bin" / "activate").is_file()
                    activated = True
                    continue
                if command.startswith("make "):  # never an install: dry run first
                    dry = subprocess.run(
                        ["make", "-n", *command.split()[1:]], cwd=checkout, env=env,
                        capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    assert "pip install" not in dry.stdout, dry.stdout
                if command.split()[0] in SERVERS:  # 127.0.0.1 for both machines (README)
                    words = [w.replace("10.0.0.1", "127.0.0.1").replace("10.0.0.2", "127.0.0.1")
                             for w in shlex.split(command)]  # fmt: skip
                    if _in_use(_port(words)):
                        pytest.skip(
                            f"port {_port(words)} of the README's Flower commands is in use"
                        )
                    if federation is None:  # the nodes start the copy's flwr-clientapp
                        federation = LocalFederation(start_flower=False)
                        federation.env["PATH"] = f"{checkout / '.venv' / 'bin'}:{env['PATH']}"
                    process, log = federation.start(words[0], [
                        str(checkout / ".venv" / "bin" / words[0]), *words[1:]
                    ])  # fmt: skip
                    wait_listening(_port(words), federation.timeout, process, log)
                    ran.append((command, 0.0, 0.0))
                    continue
                run(command)
        finally:
            if federation is not None:
                federation.__exit__(None, None, None)
    print("\nran (wall, CPU):", *(f"{t:7.1f} s {u:7.1f} s  {c}" for c, t, u in ran), sep="\n  ")
    print("skipped:", *(f"{c}: {why}" for c, why in skipped), sep="\n  ")
    # what later commands of the README read was made by earlier ones
    for made in ("runs/quickstart", "runs/fedavg", "runs/fedcross", "runs/resume", "runs/ray",
                 "runs/flower", "runs/cofed", "runs/cofed_iid", "runs/plugins"):  # fmt: skip
        assert (checkout / made / "config.yaml").is_file(), made
    assert list((checkout / "runs" / "tb").rglob("events.out.tfevents.*"))  # TensorBoard wrote
    for image in ("compare.png", "sweep.png"):
        assert (checkout / image).read_bytes()[:4] == b"\x89PNG"
    assert {c for c, _ in skipped} <= {c for block in blocks for c in block}
    assert noise == [], "\n".join(noise)  # no third-party warning reaches the user
