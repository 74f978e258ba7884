"""The plug-in contract, over every exported objective (``clients.__all__``) and aggregator
(``server.__all__``), and the user-written aggregators of ``PLUGINS`` (server updates on the
documented ``server_update`` hook with ``add_state``, as the README shows): a new plug-in is
covered here without editing a test, by adding it to its list.

Each plug-in is paired with the first registered partner that fits it (the loop's own pairing
rules, :func:`~fedlightning.loop.pairing.pairing_refusal`; every other pair is refused naming both
sides), then: two rounds on tiny data, during which the state contract holds (every round checks
that no undeclared attribute of the aggregator changed and no objective keeps per-client data on
the module: docs/algorithms.md sections 1 and 2.6); the aggregator's ``state_dict`` round-trips;
the guard's ``snapshot``/``restore`` puts back every declared state; 2 rounds + resume equals 3
rounds straight, bitwise; heterogeneous clients (``networks``) either train or are refused
with a ConfigurationError before anything is written; the cohort backend equals the sequential
one up to float rounding for every objective and every aggregator, and for the user-written
objectives of :data:`PLUGIN_OBJECTIVES` (round context derived, nothing declared); it refuses those
of :data:`COHORT_REFUSALS`, naming the attribute, while the sequential backend trains them; (slow)
every user-written aggregator of :data:`PLUGINS` gives the same bits on Ray as sequentially.
"""

import inspect

import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop, clients, server
from fedlightning.backends import CohortBackend, RayBackend, SequentialBackend
from fedlightning.errors import ConfigurationError
from fedlightning.loop.pairing import pairing_refusal
from user_clients import (
    AdamDeclaredCounter,
    FedDynReadingState,
    FedDynServer,
    MemoryInState,
    PerClientSmoothing,
    ServerNesterov,
    UserFedDynClient,
)

#: a tiny ResNet, so that every rule (InCo's ResNet layer pairs, MOON's features) applies
NETWORK = dict(network="resnet14", network_kwargs={"width": 4, "stem": "small"}, num_classes=3,
               in_channels=1, image_size=8, lr=0.05)  # fmt: skip
OBJECTIVES = [getattr(clients, n) for n in clients.__all__]
#: user-written aggregators on the server_update hook, held to the built-ins' contract
PLUGINS = [ServerNesterov, AdamDeclaredCounter, FedDynServer]
AGGREGATORS = [
    getattr(server, n) for n in server.__all__ if not inspect.isabstract(getattr(server, n))
] + PLUGINS
#: user-written objectives (tests/user_clients.py) with per-client round context of their own
PLUGIN_OBJECTIVES = [UserFedDynClient, MemoryInState]
#: user-written objectives the cohort cannot train, and what its refusal names
COHORT_REFUSALS = [(FedDynReadingState, "self.state"), (PerClientSmoothing, "self._smoothing")]


def _objective(cls, **kwargs):
    return cls(**{**NETWORK, **kwargs})


def _aggregator(cls, objective_cls):
    """``cls()`` adapted to the objective's weighting rule, or None if the two do not pair."""
    aggregator = cls()
    required = objective_cls.required_weighting
    if required is not None and getattr(aggregator, "weighting", required) != required:
        aggregator = cls(weighting=required)
    return aggregator if pairing_refusal(objective_cls, aggregator) is None else None


def _partner_aggregator(objective_cls):
    for cls in AGGREGATORS:
        aggregator = _aggregator(cls, objective_cls)
        if aggregator is not None:
            return aggregator
    raise AssertionError(f"no registered aggregator pairs with {objective_cls.__name__}")


def _partner_objective(aggregator_cls):
    for cls in OBJECTIVES:
        aggregator = _aggregator(aggregator_cls, cls)
        if aggregator is not None:
            return cls, aggregator
    raise AssertionError(f"no registered objective pairs with {aggregator_cls.__name__}")


def _data(**kwargs):
    return FederatedDataModule(
        dataset="synthetic", num_samples=160, num_test=40, num_classes=3, sample_shape=(1, 8, 8),
        num_clients=4, partition="iid", batch_size=16, seed=0, **kwargs,
    )  # fmt: skip


def _run(objective, aggregator, run_dir, rounds, ckpt_path=None, **loop_kwargs):
    loop = FederatedLoop(
        rounds=rounds, clients_per_round=2, aggregator=aggregator, run_dir=str(run_dir),
        progress_bar=False, plots=False, **loop_kwargs,
    )  # fmt: skip
    loop.fit(objective, datamodule=_data(), ckpt_path=ckpt_path)
    return loop


def _bitwise(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_bitwise(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_bitwise(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def _pairs():
    seen = set()
    for cls in OBJECTIVES:
        pair = (cls, type(_partner_aggregator(cls)))
        seen.add(pair)
        yield pytest.param(cls, lambda c=cls: _partner_aggregator(c), id=f"{cls.__name__}")
    for agg_cls in AGGREGATORS:
        objective_cls, _ = _partner_objective(agg_cls)
        if (objective_cls, agg_cls) not in seen:
            yield pytest.param(
                objective_cls,
                lambda a=agg_cls, o=objective_cls: _aggregator(a, o),
                id=agg_cls.__name__,
            )


def _perturbed(value):
    """``value`` changed everywhere: what an undone round may have written into a state."""
    if isinstance(value, dict):
        return {k: _perturbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [*map(_perturbed, value), 0.0]
    if isinstance(value, torch.Tensor):
        return value + 1
    return value + 1 if isinstance(value, int | float) else value


def _check_restore(aggregator):
    """Every declared state (nested aggregators' too) is put back by the guard's restore, except
    those declared ``rollback=False``."""
    before, snapshot = aggregator.state_dict(), aggregator.snapshot()
    members = [aggregator, *aggregator.children().values()]
    for member in members:
        for name in member.declared_states():
            if "." not in name:
                setattr(member, name, _perturbed(getattr(member, name)))
    aggregator.restore(snapshot)
    kept = {n for m in members for n, d in m.declared_states().items() if "kept when" in d}
    after = aggregator.state_dict()
    for name in set(before) - kept - {"inner"}:
        assert _bitwise(after[name], before[name]), name
    if "inner" in before:
        assert _bitwise(after["inner"], before["inner"])


@pytest.mark.parametrize(("objective_cls", "make_aggregator"), list(_pairs()))
def test_round_state_dict_and_resume(objective_cls, make_aggregator, tmp_path):
    torch.manual_seed(0)
    straight = _run(_objective(objective_cls), make_aggregator(), tmp_path / "straight", 3)
    assert straight.history[-1]["clients_failed"] == 0
    assert all(torch.isfinite(v).all() for v in straight.aggregator.global_state().values()
               if v.is_floating_point())  # fmt: skip
    clone = make_aggregator()
    clone.load_state_dict(straight.aggregator.state_dict())
    assert _bitwise(clone.state_dict(), straight.aggregator.state_dict())
    torch.manual_seed(0)
    _run(_objective(objective_cls), make_aggregator(), tmp_path / "resumed", 2)
    torch.manual_seed(0)
    resumed = _run(
        _objective(objective_cls), make_aggregator(), tmp_path / "resumed", 3,
        ckpt_path=str(tmp_path / "resumed" / "last.ckpt"),
    )  # fmt: skip
    assert _bitwise(resumed.aggregator.state_dict(), straight.aggregator.state_dict())
    assert _bitwise(resumed.store.state_dict(), straight.store.state_dict())
    _check_restore(straight.aggregator)


@pytest.mark.parametrize("objective_cls", OBJECTIVES + PLUGIN_OBJECTIVES, ids=lambda c: c.__name__)
def test_every_pair_is_accepted_or_refused_naming_both_sides(objective_cls):
    """The loop's pairing rules over every registered objective and aggregator: a pair that does
    not fit is refused in one line naming the objective and the aggregator."""
    for aggregator_cls in AGGREGATORS:
        aggregator = aggregator_cls()
        refusal = pairing_refusal(objective_cls, aggregator)
        if refusal is not None:
            assert objective_cls.__name__ in refusal and aggregator_cls.__name__ in refusal
            assert "\n" not in refusal


@pytest.mark.parametrize("objective_cls", OBJECTIVES, ids=lambda c: c.__name__)
def test_every_objective_runs_heterogeneously_or_is_refused(objective_cls, tmp_path):
    torch.manual_seed(0)
    objective = _objective(objective_cls, networks=["resnet14", "resnet18"])
    loop = _run(objective, _partner_aggregator(objective_cls), tmp_path, 1)
    assert {"resnet14/test_acc", "resnet18/test_acc", "group_mean_acc"} <= set(loop.history[-1])
    assert loop.history[-1]["clients_failed"] == 0


@pytest.mark.parametrize("aggregator_cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_every_aggregator_serves_heterogeneous_clients_or_refuses_them(aggregator_cls, tmp_path):
    objective_cls, aggregator = _partner_objective(aggregator_cls)
    objective = _objective(objective_cls, networks=["resnet14", "resnet18"])
    torch.manual_seed(0)
    try:
        loop = _run(objective, aggregator, tmp_path / "run", 1)
    except ConfigurationError as refusal:
        assert "loop.aggregator" in str(refusal) or aggregator_cls.__name__ in str(refusal)
        assert not (tmp_path / "run" / "last.ckpt").exists()
        return
    assert loop.history[-1]["clients_failed"] == 0


def _sequential_and_cohort(objective_cls, aggregator_cls, tmp_path, resnet=False):
    """``None`` when both backends give the same global model, else the cohort's refusal. On the
    MLP for two rounds, or (``resnet``: for aggregators that need ResNet stages, e.g. InCo) on the
    tiny ResNet for one round (BatchNorm over 1x1 maps makes its later rounds chaotic)."""
    mlp = {} if resnet else dict(network="mlp", network_kwargs={"hidden": [16]})
    rounds, tolerance = (1, 1e-4) if resnet else (2, 1e-5)
    results = {}
    for backend in (SequentialBackend(), CohortBackend()):
        torch.manual_seed(0)
        objective = _objective(objective_cls, **mlp)
        aggregator = (
            _aggregator(aggregator_cls, objective_cls)
            if aggregator_cls
            else _partner_aggregator(objective_cls)
        )
        try:
            loop = _run(objective, aggregator, tmp_path / type(backend).__name__, rounds,
                        backend=backend)  # fmt: skip
        except ConfigurationError as refusal:
            if isinstance(backend, SequentialBackend) and not resnet:  # the MLP is not enough
                return _sequential_and_cohort(objective_cls, aggregator_cls, tmp_path, True)
            assert isinstance(backend, CohortBackend), refusal
            return str(refusal)
        results[type(backend)] = loop.aggregator.global_state()
    for key, value in results[SequentialBackend].items():
        torch.testing.assert_close(
            results[CohortBackend][key], value, rtol=10 * tolerance, atol=tolerance
        )
    return None


@pytest.mark.parametrize("objective_cls", OBJECTIVES + PLUGIN_OBJECTIVES, ids=lambda c: c.__name__)
def test_the_cohort_backend_equals_sequential_or_refuses(objective_cls, tmp_path):
    """Every built-in objective and plug-in trains under the cohort with the round context it
    derives (a refusal is a failure here: the refusals are for what cannot be vectorized,
    tests/test_cohort.py and test_the_cohort_refuses_per_client_values_it_cannot_stack)."""
    refusal = _sequential_and_cohort(objective_cls, None, tmp_path)
    assert refusal is None, refusal


@pytest.mark.parametrize(("objective_cls", "attribute"), COHORT_REFUSALS, ids=lambda c: str(c))
def test_the_cohort_refuses_per_client_values_it_cannot_stack(objective_cls, attribute, tmp_path):
    """A plug-in whose local_loss reads per-client values the cohort cannot stack is refused with
    one line naming the attribute (after the sequential backend trained it)."""
    refusal = _sequential_and_cohort(objective_cls, None, tmp_path)
    assert refusal is not None and attribute in refusal and "\n" not in refusal, refusal


@pytest.mark.parametrize("aggregator_cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_the_cohort_backend_equals_sequential_under_every_aggregator(aggregator_cls, tmp_path):
    """Every aggregator's payloads (one model, FedCross's one per client, SCAFFOLD's c...) with
    its first fitting objective give the same global model sequentially and under the cohort."""
    objective_cls = next(o for o in OBJECTIVES if _aggregator(aggregator_cls, o) is not None)
    refusal = _sequential_and_cohort(objective_cls, aggregator_cls, tmp_path)
    assert refusal is None, refusal


@pytest.mark.slow  # Ray's start-up and actors: about half a minute
@pytest.mark.parametrize("aggregator_cls", PLUGINS, ids=lambda c: c.__name__)
def test_every_plugin_aggregator_gives_the_same_bits_on_ray(aggregator_cls, local_ray, tmp_path):
    objective_cls, _ = _partner_objective(aggregator_cls)
    states = []
    for backend in (SequentialBackend(), RayBackend(num_workers=2)):
        torch.manual_seed(0)
        loop = _run(_objective(objective_cls), _aggregator(aggregator_cls, objective_cls),
                    tmp_path / type(backend).__name__, 2, backend=backend)  # fmt: skip
        states.append(loop.aggregator.state_dict())
    assert _bitwise(states[0], states[1])
