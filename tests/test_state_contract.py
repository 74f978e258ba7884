"""State either declared or refused (docs/algorithms.md sections 1 and 2.6): an aggregator declares
what it keeps across rounds, numbers and tensors included, and gets checkpoints, resume, the
guard's restore and the identity for free; an attribute that changes outside the declaration,
a declared state whose layout changes, and a client objective's per-client data kept on the
module are refused at the round where they happen, naming the class and the attribute, on every
backend. Held-out plug-ins as users write them live in tests/user_clients.py."""

import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend, RayBackend, SequentialBackend
from fedlightning.errors import ConfigurationError
from fedlightning.server import FedAvg, FedAvgM
from fedlightning.server.state_watch import StateWatch
from user_clients import AdamDeclaredCounter, AdamPlainCounter, MemoryInState, MemoryOnModule

MLP = dict(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)


def _data():
    return FederatedDataModule(
        dataset="synthetic", num_samples=240, num_test=60, num_classes=3, sample_shape=(6,),
        num_clients=4, partition="iid",
    )  # fmt: skip


def _run(model_cls, aggregator, run_dir, rounds, ckpt_path=None, **kwargs):
    """``rounds`` rounds of ``model_cls`` (seeded: the same initial model every time)."""
    torch.manual_seed(0)
    model = model_cls(**MLP)
    loop = FederatedLoop(rounds=rounds, clients_per_round=2, aggregator=aggregator,
                         run_dir=str(run_dir), progress_bar=False, plots=False, **kwargs)  # fmt: skip
    loop.fit(model, datamodule=_data(), ckpt_path=ckpt_path)
    return loop


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def _straight_and_resumed(model_cls, aggregator_cls, tmp_path, **kwargs):
    """3 rounds straight, and 2 rounds resumed to 3: the two loops."""
    straight = _run(model_cls, aggregator_cls(), tmp_path / "straight", 3, **kwargs)
    _run(model_cls, aggregator_cls(), tmp_path / "resumed", 2, **kwargs)
    resumed = _run(model_cls, aggregator_cls(), tmp_path / "resumed", 3,
                   ckpt_path=str(tmp_path / "resumed" / "last.ckpt"), **kwargs)  # fmt: skip
    return straight, resumed


# -- declared numbers, tensors, lists -------------------------------------------------------------
class Counters(FedAvg):
    def __init__(self):
        super().__init__()
        self.add_state("t", 0)
        self.add_state("steps", torch.tensor(0.0))
        self.add_state("history", [])
        self.add_state("spent", [], rollback=False)


def _setup(aggregator):
    aggregator.setup({"w": torch.zeros(2), "b": torch.zeros(1)}, num_clients=2)
    return aggregator


def test_numbers_tensors_and_lists_are_declared_built_and_checkpointed():
    agg = _setup(Counters())
    assert agg.t == 0 and agg.history == [] and torch.equal(agg.steps, torch.tensor(0.0))
    assert agg.declared_states()["t"] == "the number 0"
    assert agg.declared_states()["spent"] == "an empty list (kept when a round is undone)"
    agg.t, agg.steps, agg.history, agg.spent = 3, agg.steps + 2, [[1.0, 2.0]], [1]
    clone = _setup(Counters())
    clone.load_state_dict(agg.state_dict())
    assert clone.t == 3 and clone.steps.item() == 2.0 and clone.history == [[1.0, 2.0]]
    assert clone.history is not agg.history  # copies: later in-place updates cannot reach them


def test_restore_puts_back_every_declared_state_but_what_a_round_spent():
    agg = _setup(Counters())
    agg.t = 1
    snapshot = agg.snapshot()
    agg.t, agg.history, agg.spent = 2, [[5.0]], [7]
    agg.steps.add_(1.0)  # in place: the snapshot holds a copy
    agg.weights["w"].add_(1.0)
    agg.restore(snapshot)
    assert agg.t == 1 and agg.history == [] and agg.steps.item() == 0.0
    assert agg.weights["w"].tolist() == [0.0, 0.0]
    assert agg.spent == [7]  # rollback=False: kept


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: setattr(a, "t", torch.tensor(1)), r"Counters.t is a Tensor, declared a Python number"),
        (lambda a: setattr(a, "steps", torch.zeros(2)),
         r"Counters.steps is float32 \(2,\) on cpu, declared float32 \(\) on cpu"),
        (lambda a: a.weights.pop("b"), r"Counters.weights\['b'\] is missing"),
        (lambda a: a.weights.update(w=torch.zeros(3)),
         r"Counters.weights\['w'\] is float32 \(3,\) on cpu, declared float32 \(2,\) on cpu"),
        (lambda a: a.weights.update(w=torch.zeros(2, dtype=torch.float64)),
         r"Counters.weights\['w'\] is float64 \(2,\)"),
        (lambda a: setattr(a, "history", ()), r"Counters.history is a tuple, declared a list"),
    ],
    ids=["number", "tensor", "key", "shape", "dtype", "list"],
)  # fmt: skip
def test_a_declared_state_that_changes_layout_is_named_at_the_round(change, message):
    agg = _setup(Counters())
    watch = StateWatch(agg)
    change(agg)
    with pytest.raises(ConfigurationError, match="round 3: " + message) as refused:
        watch.check(2)
    assert "\n" not in str(refused.value)


class Cached(FedAvg):
    transient_attributes = frozenset({"last_norm"})

    def __init__(self):
        super().__init__()
        self.last_norm = None
        self.table = {}

    def server_update(self, server_round):
        self.last_norm = float(server_round.mean["w"].norm())
        return {}


def test_the_watch_passes_configuration_setup_data_and_transients_and_refuses_the_rest():
    agg = _setup(Cached())
    watch = StateWatch(agg)
    agg.last_norm = 1.0  # transient: a cache or this round's metric
    agg.weights = {k: v + 1 for k, v in agg.weights.items()}  # declared
    watch.check(0)
    agg.table["client 3"] = torch.ones(1)  # in place, undeclared
    with pytest.raises(
        ConfigurationError, match=r"round 2: Cached.table changed but is not declared state"
    ):
        watch.check(1)
    agg.load_state_dict(agg.state_dict())
    assert agg.last_norm is None  # transients go back to their value after set-up


def test_under_64_true_the_server_state_is_float64_from_the_start_and_resumes(tmp_path):
    """The fits train in float64, so the server model and the state built from it start there:
    a declared state keeps its dtype across rounds, and a resume loads into the same layout."""
    straight, resumed = _straight_and_resumed(MemoryInState, FedAvgM, tmp_path, precision="64-true")
    for loop in (straight, resumed):
        state = loop.aggregator.state_dict()
        dtypes = {v.dtype for s in (state["weights"], state["momentum"]) for v in s.values()}
        assert dtypes == {torch.float64}


# -- the held-out server plug-in: an Adam-style step counter -------------------------------------
def test_a_plain_step_counter_is_refused_at_the_round_that_changes_it(tmp_path):
    with pytest.raises(ConfigurationError) as refused:
        _run(MemoryInState, AdamPlainCounter(), tmp_path, 3)
    message = str(refused.value)
    assert message.startswith("round 1: AdamPlainCounter.t changed (now 1) but is not declared")
    assert "self.add_state('t', <initial value>)" in message and "\n" not in message
    assert not (tmp_path / "last.ckpt").exists()  # refused before round 1's checkpoint


def test_a_declared_step_counter_resumes_bitwise(tmp_path):
    straight, resumed = _straight_and_resumed(MemoryInState, AdamDeclaredCounter, tmp_path)
    assert straight.aggregator.t == resumed.aggregator.t == 3
    assert _equal(straight.aggregator.state_dict(), resumed.aggregator.state_dict())
    assert (tmp_path / "straight" / "global.pt").read_bytes() == (
        tmp_path / "resumed" / "global.pt"
    ).read_bytes()


class AdamNaNInRound2(AdamDeclaredCounter):
    def server_update(self, server_round):
        new = super().server_update(server_round)
        if server_round.index == 1:
            key = server_round.parameter_keys[0]
            new[key] = torch.full_like(new[key], float("nan"))
        return new


def test_the_guard_restores_a_declared_counter_after_a_nan_round(tmp_path):
    loop = _run(MemoryInState, AdamNaNInRound2(), tmp_path, 3)
    assert loop.summary.rounds_skipped == 1  # round 2 undone
    assert loop.aggregator.t == 2  # rounds 1 and 3: round 2's step was restored away


# -- the held-out client objective: per-client memory --------------------------------------------
@pytest.mark.parametrize("backend", [SequentialBackend, CohortBackend], ids=lambda b: b.__name__)
def test_per_client_memory_on_the_module_is_refused(backend, tmp_path):
    with pytest.raises(ConfigurationError) as refused:
        _run(MemoryOnModule, FedAvg(), tmp_path, 2, backend=backend())
    message = str(refused.value)
    assert message.startswith("MemoryOnModule.memory changed in place outside begin_client during")
    assert "return it in end_client's state" in message and "\n" not in message


class CarriesLastUpload(MemoryInState):
    """Hands each client's trained weights to the next client through an attribute that
    ``end_client`` assigns: order-dependent data outside the ClientStore."""

    def end_client(self, num_steps):
        weights, extras, state = super().end_client(num_steps)
        self.previous = weights
        return weights, extras, state


def test_an_attribute_assigned_outside_begin_client_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match=r"CarriesLastUpload.previous appeared outside "
                       r"begin_client during client \d+'s round"):  # fmt: skip
        _run(CarriesLastUpload, FedAvg(), tmp_path, 1)


def test_per_client_memory_in_the_state_resumes_exactly(tmp_path):
    straight, resumed = _straight_and_resumed(MemoryInState, FedAvg, tmp_path)
    assert _equal(straight.store.state_dict(), resumed.store.state_dict())
    assert (tmp_path / "straight" / "global.pt").read_bytes() == (
        tmp_path / "resumed" / "global.pt"
    ).read_bytes()


def test_per_client_memory_in_the_state_is_the_same_under_the_cohort(tmp_path):
    models = []
    for backend in (SequentialBackend(), CohortBackend()):
        loop = _run(MemoryInState, FedAvg(), tmp_path / type(backend).__name__, 3,
                    backend=backend)  # fmt: skip
        models.append((loop.aggregator.global_state(), loop.store.state_dict()))
    (seq, seq_store), (cohort, cohort_store) = models
    for key, value in seq.items():
        torch.testing.assert_close(cohort[key], value, rtol=1e-4, atol=1e-5)
    assert seq_store.keys() == cohort_store.keys()


@pytest.mark.slow  # Ray's start-up and actors
def test_per_client_memory_on_the_module_is_refused_on_ray(local_ray, tmp_path):
    with pytest.raises(ConfigurationError, match=r"MemoryOnModule.memory changed in place"):
        _run(MemoryOnModule, FedAvg(), tmp_path, 2, backend=RayBackend(num_workers=2))
