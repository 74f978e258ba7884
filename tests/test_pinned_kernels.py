"""The suite computes in the CPU kernel family its pinned hashes were recorded with, on any x86-64
machine (tests/pinned_kernels.py): the session, a child process (the CLI runs of the pinned tests)
and both recordings agree, so a hash that fails names a change of the code, not of the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import test_bitwise_configs
import test_statistic_bitwise
from pinned_kernels import CAPABILITY, KERNELS, comparable


def test_this_session_computes_in_the_pinned_family():
    assert {name: os.environ.get(name) for name in KERNELS} == KERNELS
    assert torch.backends.cpu.get_cpu_capability() == CAPABILITY


def test_a_child_process_computes_in_the_pinned_family():
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == CAPABILITY


@pytest.mark.parametrize("module", [test_bitwise_configs, test_statistic_bitwise])
def test_the_hashes_were_recorded_under_the_settings_the_suite_uses(module):
    assert module.RECORDED_UNDER == KERNELS


def test_only_the_accountant_columns_are_rounded():
    assert comparable("dp_epsilon", "0.4552723093673243") == "0.4552723094"
    assert comparable("dp_epsilon", "0.4552723093673267") == "0.4552723094"
    assert comparable("test_loss", "2.227882146835327") == "2.227882146835327"
    assert comparable("dp_epsilon", "") == ""
