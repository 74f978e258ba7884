"""Extension contracts fail in one line naming the plug-in and the fix (issue 43 item 5;
docs/algorithms.md sections 1, "Objectives a backend cannot run", and 2.8): a statistic that
returns numpy, leaves out a key the uploads own (that layer would never train), adds a key or
changes a shape; an objective that raises while the cohort trains its clients together; an
objective holding an attribute that Ray cannot pickle to its workers."""

from __future__ import annotations

import pickle
import re
import threading

import pytest
import torch
from torch import nn

from conftest import cli_fails
from fedlightning.backends.pickling import unpicklable_part
from fedlightning.errors import PluginError
from fedlightning.protocol import Upload
from fedlightning.server import FedAvg
from user_clients import WrongStatistic


def test_a_statistic_returning_numpy_stops_the_run_naming_it_the_key_and_the_fix(
    cli, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    line = cli_fails(cli, capsys, run_dir, "--loop.aggregator", "fedlightning.server.FedAvg",
                  "--loop.aggregator.init_args.statistic",
                  "user_clients.WrongStatistic")  # fmt: skip
    assert re.fullmatch(
        r"fedlightning: stopped: loop.aggregator.init_args.statistic=WrongStatistic: combine "
        r"\(round 1\) returned '(\S+)' as a numpy.ndarray of dtype numpy.float32, shape "
        r"\(64, 64\), but the server model holds a torch.Tensor of dtype torch.float32, shape "
        r"\(64, 64\), on cpu: return a torch tensor like the uploads' \(e.g. torch.as_tensor\("
        r"value, dtype=upload\['\1'\].dtype, device=upload\['\1'\].device\)\)",
        line,
    ), line
    assert not (run_dir / "global.pt").exists()


def _aggregated(how: str):
    """FedAvg over :class:`WrongStatistic` (``how``) after one round of two uploads."""
    initial = {"fc.weight": torch.zeros(2, 3), "fc.bias": torch.zeros(2)}
    aggregator = FedAvg(statistic=WrongStatistic(how))
    aggregator.setup(initial, 2)
    uploads = [
        Upload(i, {k: torch.full_like(v, i + 1.0) for k, v in initial.items()}, 10, 1)
        for i in range(2)
    ]
    aggregator.aggregate(0, uploads)
    return aggregator


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("missing", r"left out 1 key\(s\) the uploads own, first 'fc.weight' \(2 of the 2 uploads "
                    r"own it\): that entry would never train; return the combined value of every "
                    r"key some upload owns"),
        ("extra", r"returned 'extra.weight', which the server model does not have"),
        ("shape", r"returned 'fc.weight' as a torch.Tensor of dtype torch.float32, shape \(6,\), "
                  r"on cpu, but the server model holds a torch.Tensor of dtype torch.float32, "
                  r"shape \(2, 3\)"),
    ],
)  # fmt: skip
def test_a_statistic_breaking_its_contract_is_refused_before_the_state_changes(how, message):
    with pytest.raises(PluginError) as error:
        _aggregated(how)
    assert str(error.value).startswith(
        "loop.aggregator.init_args.statistic=WrongStatistic: combine (round 1) "
    )
    assert re.search(message, str(error.value)), str(error.value)


def test_the_statistic_contract_passes_what_it_allows():
    """The check refuses only a broken contract: a well-formed combination goes through as
    returned (the owner-aware mean 1.5 of uploads 1 and 2)."""
    aggregator = FedAvg(weighting="uniform")
    aggregator.setup({"w": torch.zeros(2)}, 2)
    aggregator.aggregate(0, [Upload(i, {"w": torch.full((2,), i + 1.0)}, 1, 1) for i in range(2)])
    assert torch.equal(aggregator.global_state()["w"], torch.full((2,), 1.5))


def test_an_objective_raising_in_the_cohort_stops_in_one_line_naming_it_and_the_fix(
    cli, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    line = cli_fails(cli, capsys, run_dir, "--model", "user_clients.RaisesInLoss",
                  "--loop.backend", "fedlightning.backends.CohortBackend")  # fmt: skip
    assert re.fullmatch(
        r"fedlightning: stopped: ValueError: no class weights for this batch \(raised at "
        r"\S+user_clients.py:\d+ in local_loss\) while loop.backend=CohortBackend trained "
        r"model=RaisesInLoss's clients \d+, \d+, \d+, \d+ of round 1 together, so it fails them "
        r"all: fix the objective, or use loop.backend=fedlightning.backends.SequentialBackend "
        r"\(or AutoBackend, which goes on sequentially\), where a client whose fit raises is "
        r"left out on its own",
        line,
    ), line
    assert not (run_dir / "global.pt").exists()


def test_an_objective_ray_cannot_pickle_is_refused_before_anything_is_written(
    cli, tmp_path, capsys
):
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    line = cli_fails(cli, capsys, run_dir, "--model", "user_clients.HoldsALock",
                  "--loop.backend", "fedlightning.backends.RayBackend", code=2)  # fmt: skip
    assert line == (
        "fedlightning: error: loop.backend=RayBackend sends the objective to its worker "
        "processes by pickling, and model=HoldsALock's attribute self.cache['guard'] "
        "(_thread.lock) cannot be pickled (cannot pickle '_thread.lock' object): create it "
        "where it is used (begin_client, local_loss), leave it out of __getstate__, or use a "
        "backend that trains in this process (fedlightning.backends.SequentialBackend)"
    )
    assert not run_dir.exists()


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.hooks = [1, threading.Lock()]


def test_the_unpicklable_part_is_found_inside_submodules_lists_and_dicts():
    network = nn.Sequential(nn.Linear(2, 2), _Head())
    path, part, error = unpicklable_part({"net": network}, pickle.dumps, "model")
    assert path == "model['net'].1.hooks[1]" and type(part).__name__ == "lock"
    assert "pickle" in str(error)
    assert unpicklable_part(nn.Linear(2, 2), pickle.dumps) is None
