"""The first mistakes at the command line (issue 34 item 1): each is one line on stderr naming what
was given and what fits there, exit status 2, no traceback, nothing written; and the front door
(``--version``, ``--help``, ``list`` and the refusals that need no class) imports no Lightning
and no torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from fedlightning.cli import main

ROOT = Path(__file__).parents[1]
QUICKSTART = ["fit", "-c", "configs/quickstart.yaml"]

CASES = {
    "misplaced objective": (
        [*QUICKSTART, "--loop.aggregator", "FedProx"],
        "loop.aggregator: FedProx is a client objective: --model FedProx, or -c "
        "configs/fedprox.yaml; the closest aggregators: ",
    ),
    "misplaced aggregator": (
        [*QUICKSTART, "--model", "Krum"],
        "model: Krum is an aggregator: --loop.aggregator Krum, or -c configs/byzantine.yaml; "
        "all: fedlightning list objectives",
    ),
    "misplaced by class path": (
        [*QUICKSTART, "--loop.attack", "fedlightning.server.FedAvg"],
        "FedAvg is an aggregator: --loop.aggregator FedAvg, or -c configs/fedavg.yaml",
    ),
    "data set as an aggregator": (
        [*QUICKSTART, "--loop.aggregator", "cifar10"],
        "loop.aggregator: cifar10 is a data set: --data.dataset cifar10",
    ),
    "unknown name": (
        [*QUICKSTART, "--loop.aggregator", "FedAvgg"],
        "loop.aggregator: no aggregator is called FedAvgg; the closest aggregators: FedAvg, "
        "FedAvgM (all: fedlightning list aggregators; yours: its class path)",
    ),
    "a name in other case": (  # the exact match, case ignored, first (issue 38 item 3)
        [*QUICKSTART, "--loop.aggregator", "fedavg"],
        "loop.aggregator: no aggregator is called fedavg; the closest aggregators: FedAvg, "
        "FedAvgM, ",
    ),
    "unknown backend": (
        [*QUICKSTART, "--loop.backend", "Cohort"],
        "the closest backends: CohortBackend",
    ),
    "class path that does not import": (
        [*QUICKSTART, "--loop.aggregator", "fedlightning.server.FedAvgg"],
        "loop.aggregator: fedlightning.server.FedAvgg cannot be imported (module "
        "'fedlightning.server' has no attribute 'FedAvgg'); the closest aggregators: FedAvg",
    ),
    "nested class": (
        ["fit", "-c", "configs/inco_resnet.yaml", "--loop.aggregator.init_args.inner", "MOON"],
        "loop.aggregator.init_args.inner: MOON is a client objective: --model MOON, or -c "
        "configs/moon.yaml",
    ),
    "option of another objective": (
        [*QUICKSTART, "--model.init_args.mu", "0.1"],
        "model.init_args.mu: ClientModule takes no option mu; the objectives that take mu: "
        "FedProx, MOON (--model FedProx, or -c configs/fedprox.yaml)",
    ),
    "misspelt option of the class": (
        [*QUICKSTART, "--model.init_args.lrr", "0.1"],
        "model.init_args.lrr: ClientModule takes no option lrr; the closest: lr",
    ),
    "aggregator option": (
        [*QUICKSTART, "--loop.aggregator", "FedAvgM", "--loop.aggregator.server_momentumm", "0"],
        "loop.aggregator.init_args.server_momentumm: FedAvgM takes no option server_momentumm; "
        "the closest: server_momentum",
    ),
    "unrecognized option": (
        [*QUICKSTART, "--loop.aggregatorr", "FedAvg"],
        "unrecognized arguments: --loop.aggregatorr FedAvg; the closest: --loop.aggregator",
    ),
    "value outside its choices": (
        [*QUICKSTART, "--loop.precision", "bf16"],
        "loop.precision='bf16' is not allowed: choose one of 32-true, 32, bf16-mixed, 16-mixed, "
        "64-true; the closest: bf16-mixed",
    ),
    "value of another type": (
        [*QUICKSTART, "--loop.rounds", "ten"],
        "loop.rounds='ten' is not allowed: expected int",
    ),
    "unknown model": (
        [*QUICKSTART, "--model.init_args.network", "resnet2"],
        "unknown model 'resnet2': choose one of cnn,",
    ),
    "unknown data set": (
        [*QUICKSTART, "--data.dataset", "cifar"],
        "; the closest: cifar10, cifar100",
    ),
    "missing config": (
        ["fit", "-c", "configs/quickstart.yml"],
        "-c 'configs/quickstart.yml' does not exist; the closest: configs/quickstart.yaml",
    ),
    "seeds and fast_dev_run": (
        [*QUICKSTART, "--seeds", "0", "1", "--fast_dev_run"],
        "--fast_dev_run is a run of its own: it takes no --seeds and no --ckpt_path",
    ),
    "seeds and a seed": (
        [*QUICKSTART, "--seeds", "0", "1", "--loop.seed", "3"],
        "--seeds starts one run per seed: it takes no --loop.seed and no --ckpt_path",
    ),
    "seeds that are no integers": (
        [*QUICKSTART, "--seeds", "a", "b"],
        "--seeds takes integers, got 'a b'",
    ),
    "repeated seeds": (
        [*QUICKSTART, "--seeds", "1", "1"],
        "--seeds takes distinct integers >= 0 (--seeds 0 1 2), got ['1', '1']",
    ),
    "unknown subcommand": (
        ["fitt", "-c", "configs/quickstart.yaml"],
        "'fitt' is not a subcommand; the closest: fit (all: fit, cofed, plot, test, flower-app, list",
    ),
}


@pytest.mark.parametrize(("args", "expected"), list(CASES.values()), ids=list(CASES))
def test_a_mistake_is_one_line_naming_what_fits(args, expected, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # configs/ is where the hints look
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--loop.run_dir", str(tmp_path / "run")] if args[0] == "fit" else args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("fedlightning: error: "), err
    assert expected in err, err
    assert not (tmp_path / "run").exists()


def test_the_front_door_imports_no_lightning_and_no_torch():
    """``--version``, ``--help``, ``list`` and each refusal before a class is parsed, in one fresh
    process: afterwards neither Lightning nor torch has been imported."""
    calls = [
        ["--version"], ["--help"], [], ["list"], ["list", "models"], ["fit"], ["fitt"],
        ["fit", "-c", "configs/missing.yaml"], ["list", "nothing"],
    ]  # fmt: skip
    code = (
        "import sys\n"
        "from fedlightning.cli import main\n"
        f"for args in {calls!r}:\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as stop:\n"
        "        print('exit', stop.code, file=sys.stderr)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torch', 'numpy'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.stdout.splitlines()[-1] == "[]", done.stdout[-500:]
    assert [line for line in done.stderr.splitlines() if line.startswith("exit")] == [
        "exit 0", "exit 0", "exit 2", "exit 0", "exit 0", "exit 2", "exit 2", "exit 2", "exit 2",
    ]  # fmt: skip
    assert "Traceback" not in done.stderr
