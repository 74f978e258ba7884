"""Every number a run logs is its saved models' (docs/algorithms.md section 6.1; issue 30 item 1).

For every config under configs/ that ``fit`` runs on the bundled data (CoFED's have no rounds,
configs/experiments/ needs CIFAR), shrunk to 2 rounds of 2 local steps, on the sequential and the
cohort backends: every logged ``test_acc``/``test_loss`` (the global model's and each deployable's,
``<name>/test_acc``) and ``group_mean_acc`` equals the run's ``models.pt`` re-scored by an
independent scorer (tests/rescorer.py): a fresh network from the registry, ``load_state_dict``,
``eval()``, a plain loop over the test set. Likewise every logged ``personal_acc`` (with its
distribution and ``personal_clients``): each client's deployed model of the last evaluation, as
``personal.pt`` keeps it (fine-tuned, for FedBABU), scored on the client's own split and the
distribution recomputed by the same scorer (issue 39 item 1). The heterogeneous BatchNorm configs
(ResNet groups) are the ones the old evaluation got wrong (groups scored in train mode).
``fedlightning test RUN_DIR`` prints the same numbers, from ``models.pt`` and from
``last.ckpt``, and refuses what is not a run in one line.
"""

from __future__ import annotations

import csv
import importlib
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fedlightning.cli import main
from fedlightning.fit import trainer_reason
from rescorer import rescore

ROOT = Path(__file__).parents[1]
CONFIGS = sorted(
    p
    for p in [*(ROOT / "configs").glob("*.yaml"), *(ROOT / "configs/inco_baselines").glob("*.yaml")]
    if not p.name.startswith("cofed")
)
BACKENDS = ("SequentialBackend", "CohortBackend")
#: the default suite's share: a heterogeneous BatchNorm run on both backends, FML's adaptor heads
#: (a scoring module of its own) and a homogeneous run; the rest is slow
FAST = {
    ("heteroavg_resnet", "SequentialBackend"),
    ("heteroavg_resnet", "CohortBackend"),
    ("fml_heads", "SequentialBackend"),
    ("fedavg", "CohortBackend"),
    ("fedbabu", "SequentialBackend"),  # personal models fine-tuned before scoring
    ("fedper", "CohortBackend"),
}
TINY = [
    "--loop.rounds", "2", "--loop.local_steps", "2", "--loop.eval_every", "2",
    "--loop.progress_bar", "false", "--loop.plots", "false", "--loop.num_threads", "1",
]  # fmt: skip
#: fewer clients for the ResNet groups (one per group and round is enough to train every group)
HETERO = ["--loop.clients_per_round", "5", "--data.num_clients", "10"]


def _fit(config: Path, backend: str, run_dir: Path) -> None:
    extra = HETERO if "networks" in config.read_text() else []
    sys.argv = ["fedlightning"]
    main(["fit", "-c", str(config), "--loop.run_dir", str(run_dir), "--loop.backend", backend,
          *TINY, *extra])  # fmt: skip


def _last_row(run_dir: Path) -> dict[str, float]:
    with open(run_dir / "metrics.csv") as handle:
        row = list(csv.DictReader(handle))[-1]
    return {
        k: float(v)
        for k, v in row.items()
        if v and re.search(r"test_(acc|loss)$|group_mean|^personal_(acc|clients)", k)
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each (config, backend) run, fitted once for the module's tests."""
    done: dict[tuple[str, str], Path] = {}

    def get(stem: str, backend: str) -> Path:
        if (stem, backend) not in done:
            config = next(p for p in CONFIGS if p.stem == stem)
            if backend == "CohortBackend" and _cohort_refuses(config):
                pytest.skip(f"{stem}: the cohort refuses an objective that steps a schedule or "
                            "overrides a Trainer hook")  # fmt: skip
            run_dir = tmp_path_factory.mktemp(f"{stem}-{backend}")
            _fit(config, backend, run_dir)
            done[stem, backend] = run_dir
        return done[stem, backend]

    return get


def _cohort_refuses(config: Path) -> bool:
    """Whether the config's objective steps a learning-rate schedule (FedRep's phases) or
    overrides a Trainer hook (APFL), which the cohort backend refuses
    (tests/test_registry_contract.py checks the refusal)."""
    model = yaml.safe_load(config.read_text())["model"]
    module, name = model["class_path"].rsplit(".", 1)
    objective = getattr(importlib.import_module(module), name)(**model.get("init_args", {}))
    optimizers = objective.configure_optimizers()
    schedule = isinstance(optimizers, dict) and "lr_scheduler" in optimizers
    return schedule or trainer_reason(objective, "32-true") is not None


CASES = [
    pytest.param(
        config.stem, backend, marks=() if (config.stem, backend) in FAST else pytest.mark.slow,
        id=f"{config.stem}-{backend}",
    )
    for config in CONFIGS
    for backend in BACKENDS
]  # fmt: skip


@pytest.mark.parametrize(("stem", "backend"), CASES)
def test_logged_test_metrics_are_the_saved_models_rescored(runs, stem, backend):
    run_dir = runs(stem, backend)
    logged, rescored = _last_row(run_dir), rescore(run_dir)
    assert set(logged) == set(rescored), "every scored model is saved (models.pt, personal.pt)"
    for key, value in rescored.items():
        assert logged[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def _test_command(capsys, run_dir: Path) -> tuple[int, str, str]:
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as exit_info:
        main(["test", str(run_dir)])
        raise SystemExit(0)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def _printed(out: str) -> dict[str, float]:
    """The table's numbers as ``metrics.csv`` names them."""
    printed = {}
    for line in out.splitlines():
        if match := re.match(r"^(\S+)\s+\S+\s+(\d\.\d{4})\s+(\d+\.\d{4})$", line):
            prefix = "" if match[1] == "global" else f"{match[1]}/"
            printed[f"{prefix}test_acc"] = float(match[2])
            printed[f"{prefix}test_loss"] = float(match[3])
        elif match := re.match(r"^group_mean_acc (\d\.\d{4})$", line):
            printed["group_mean_acc"] = float(match[1])
    return printed


def test_the_test_command_prints_what_the_run_logged(runs, capsys, tmp_path):
    """On a BatchNorm heterogeneous run: from models.pt, then from last.ckpt alone (a run that
    was stopped before its end), the numbers of metrics.csv's last row."""
    finished = runs("heteroavg_resnet", "SequentialBackend")
    logged = _last_row(finished)
    checkpointed = tmp_path / "checkpointed"
    shutil.copytree(finished, checkpointed)
    (checkpointed / "models.pt").unlink()
    (checkpointed / "global.pt").unlink()
    for run_dir, source in (
        (finished, "models.pt (round 2)"),
        (checkpointed, "last.ckpt (round 2)"),
    ):
        code, out, err = _test_command(capsys, run_dir)
        assert code == 0, err
        assert source in out and "metrics.csv round 2: the same numbers" in out, out
        printed = _printed(out)
        assert set(printed) == set(logged) and "resnet14/test_acc" in printed
        assert all(printed[k] == pytest.approx(v, abs=5e-5) for k, v in logged.items()), out
    (checkpointed / "metrics.csv").write_text("round,test_acc\n2,0.5\n")
    _, out, _ = _test_command(capsys, checkpointed)
    assert "metrics.csv round 2 logged otherwise: test_acc 0.5000 (now " in out


def test_the_test_command_refuses_what_is_not_a_run_in_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--help"])
    assert exit_info.value.code == 0 and "usage: fedlightning test [-h] RUN_DIR" in (
        capsys.readouterr().out
    )
    (tmp_path / "empty").mkdir()
    (tmp_path / "configured").mkdir()
    (tmp_path / "configured" / "config.yaml").write_text("loop: {}\nmodel: {}\ndata: {}\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.yaml").write_text("loop: {}\nmodel: {}\ndata: {}\n")
    (tmp_path / "broken" / "models.pt").write_bytes(b"not a file torch wrote")
    for run_dir, message in (
        (tmp_path / "missing", "is not a directory"),
        (tmp_path / "empty", "holds no config.yaml: not a fedlightning fit run directory"),
        (tmp_path / "configured", "holds neither models.pt (a finished run) nor last.ckpt"),
        (tmp_path / "broken", "models.pt cannot be read"),
    ):
        code, out, err = _test_command(capsys, run_dir)
        assert code == 2 and not out, (out, err)
        assert err.count("\n") == 1 and message in err, err


def test_the_test_command_on_another_size_and_after_an_interrupted_resume(
    cli, capsys, tmp_path, monkeypatch
):
    """A models.pt copied from a run with another network size is one line naming the file, the
    tensor and both shapes (issue 43 item 4; before, load_state_dict's traceback); after a
    resume stopped by Ctrl-C, the table says it scored models.pt's round and that last.ckpt is
    newer."""
    import os
    import signal

    from fedlightning.backends.sequential import SequentialBackend

    sequential = ("--loop.backend", "SequentialBackend", "--loop.plots", "false")
    run, other = tmp_path / "run", tmp_path / "other"
    cli(run, "--loop.rounds", "2", *sequential)
    cli(other, "--loop.rounds", "1", *sequential, "--model.network_kwargs", "{hidden: [32]}")
    copied = tmp_path / "copied"
    shutil.copytree(run, copied)
    shutil.copy(other / "models.pt", copied / "models.pt")
    capsys.readouterr()
    code, out, err = _test_command(capsys, copied)
    assert code == 2 and not out and err.count("\n") == 1, err
    assert err == (
        f"fedlightning: error: {copied / 'models.pt'}: its model 'global' does not fit the "
        f"network {copied / 'config.yaml'} builds: features.1.weight has shape [32, 64] in the "
        "file but [64, 64] in the network; was the file copied from another run?\n"
    )
    real, calls = SequentialBackend.run, []

    def run_then_ctrl_c(self, r, jobs):
        calls.append(r)
        if len(calls) == 2:  # the resume's second round (round 4)
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, r, jobs)

    monkeypatch.setattr(SequentialBackend, "run", run_then_ctrl_c)
    with pytest.raises(SystemExit) as stop:
        cli(run, "--loop.rounds", "6", *sequential, "--ckpt_path", str(run / "last.ckpt"))
    monkeypatch.undo()
    assert stop.value.code == 130
    assert torch.load(run / "last.ckpt", weights_only=True)["round"] == 3
    capsys.readouterr()
    code, out, err = _test_command(capsys, run)
    assert code == 0, err
    assert out.startswith(f"{run}: models.pt (round 2), scored on the digits test set\n")
    assert "metrics.csv round 2: the same numbers" in out  # models.pt's round, not the last row
    assert out.endswith(
        f"note: {run / 'last.ckpt'} is newer (round 3): a resume that stopped before its end; "
        "this table scores models.pt, which holds round 2: resume the run to its end "
        f"(--ckpt_path {run / 'last.ckpt'}) to score its later rounds\n"
    ), out
