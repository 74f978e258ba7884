"""The ``>>>`` examples in the docstrings of the pure modules run as tests.

An explicit list rather than pytest's ``--doctest-modules`` over ``src/fedlightning``, which would
import every module (Ray, the CoFED tasks, the CLI) just to collect examples.
"""

import doctest
import importlib

import pytest

MODULES = [
    "fedlightning.server.functional",
    "fedlightning.clients.sgd_steps",
    "fedlightning.clients.worker_momentum",
    "fedlightning.data.partition",
    "fedlightning.data.ragged",
    "fedlightning.data.val_split",
    "fedlightning.data.writers",
    "fedlightning.seeding",
    "fedlightning.server.fedcross_maths",
    "fedlightning.server.inco",
    "fedlightning.server.inco_pairs",
    "fedlightning.server.summation",
    "fedlightning.cofed.voting",
    "fedlightning.cofed.torch_participants",
    "fedlightning.privacy.client_dp_maths",
    "fedlightning.attacks.maths",
    "fedlightning.server.breakdown",
    "fedlightning.server.statistics.bucketing",
    "fedlightning.server.statistics.bulyan",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
