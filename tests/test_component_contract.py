"""The round component protocol keeps its word (issue 40 item 2; docs/algorithms.md section 6.2):
every hook of :class:`~fedlightning.round_components.RoundComponent` sees exactly the fields of
the round its docstring promises (the others still empty), on the sequential and the cohort
backend; ``on_results`` sees the uploads as the clients sent them and ``admits`` as the
aggregator receives them (after the adversary); every built-in component declares the state it
checkpoints; a user's component with a running mean (number state) resumes bit for bit."""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch

import user_components
from fedlightning import FederatedLoop
from fedlightning.attacks import SignFlip
from fedlightning.backends import SequentialBackend
from fedlightning.errors import ConfigurationError
from fedlightning.loop import components
from fedlightning.loop.components.watch import ComponentWatch
from fedlightning.loop.sampling import sample_clients
from fedlightning.round_components import Round, RoundComponent

SEQUENTIAL = "fedlightning.backends.SequentialBackend"
COHORT = "fedlightning.backends.CohortBackend"
PROBE = ["--loop.components+", "user_components.Probe", "--loop.plots", "false"]


def hooks() -> dict[str, frozenset[str]]:
    """Each hook of the protocol that sees the round, and the fields its docstring promises."""
    promised = {}
    for name, method in inspect.getmembers(RoundComponent, inspect.isfunction):
        if "round" not in inspect.signature(method).parameters:
            continue
        doc = inspect.getdoc(method) or ""
        sees = doc.split("Sees:", 1)
        assert len(sees) == 2, f"RoundComponent.{name}'s docstring does not say what it sees"
        promised[name] = frozenset(re.findall(r"``round\.(\w+)``", sees[1]))
    return promised


def test_every_hook_that_sees_the_round_says_what_it_sees():
    every = set(user_components.ROUND_FIELDS)
    assert set(Round.__dataclass_fields__) == every  # the probe checks every field
    promised = hooks()
    assert set(promised) == {
        "on_round_start", "select_clients", "configure_jobs", "on_results", "transform_uploads", "admits", "on_aggregating",
        "on_aggregated", "on_evaluated", "on_round_end",
    }  # fmt: skip
    assert all(fields <= every for fields in promised.values())
    probed = {name for name in vars(user_components.Probe) if not name.startswith("_")}
    assert set(promised) <= probed  # the probe overrides every such hook


@pytest.mark.parametrize("backend", [SEQUENTIAL, COHORT], ids=["sequential", "cohort"])
def test_every_hook_sees_exactly_what_its_docstring_promises(backend, cli, tmp_path):
    cli(tmp_path, *PROBE, "--loop.backend", backend, "--loop.rounds", "2")
    promised = hooks()
    seen = user_components.SEEN
    assert {hook for hook, _, _ in seen} == set(promised)  # every hook was called
    for hook, index, fields in seen:
        assert fields == promised[hook], (hook, index)
    order = [hook for hook, index, _ in seen if index == 0]
    assert order == [
        "on_round_start", "select_clients", "configure_jobs", "on_results", "transform_uploads", "admits", "on_aggregating",
        "on_aggregated", "on_evaluated", "on_round_end",
    ]  # fmt: skip


def test_on_results_sees_the_uploads_sent_and_admits_those_the_aggregator_receives(cli, tmp_path):
    """Under a sign-flipping attack (the adversary runs before the user's components): at
    ``on_results`` every upload is the client's own fit, the same as an unattacked run's; at
    ``admits`` the malicious clients' uploads are ``-u`` around the model they received."""
    attack = ["--loop.attack", "fedlightning.attacks.SignFlip", "--loop.attack.init_args.clients",
              "[2, 4, 6]", "--loop.attack.init_args.scale", "1", "--loop.backend", SEQUENTIAL,
              "--loop.rounds", "1"]  # fmt: skip
    cli(tmp_path / "honest", *PROBE, "--loop.backend", SEQUENTIAL, "--loop.rounds", "1")
    honest = {u.client_id: u for u in user_components.UPLOADS["on_results", 0]}
    cli(tmp_path / "attacked", *PROBE, *attack)
    sent = user_components.UPLOADS["on_results", 0]
    received = {u.client_id: u for u in user_components.UPLOADS["admits", 0]}
    malicious = {u.client_id for u in sent} & {2, 4, 6}
    assert malicious and len(sent) == 4
    assert sorted(u.client_id for u in sent) == sorted(sample_clients(0, 0, 8, 4))
    keys = list(torch.load(tmp_path / "attacked" / "global.pt", weights_only=True))
    for upload in sent:
        cid = upload.client_id
        for key in keys:
            assert torch.equal(upload.weights[key], honest[cid].weights[key]), (cid, key)
            if cid not in malicious or not upload.weights[key].is_floating_point():
                assert torch.equal(received[cid].weights[key], upload.weights[key]), (cid, key)
    # SignFlip with scale 1: w - (w_i - w), w the model client i received; its sum with the honest
    # upload is twice that model, the same for every malicious client
    twice = [
        {k: received[c].weights[k] + sent_c.weights[k] for k in keys}
        for c, sent_c in ((u.client_id, u) for u in sent) if c in malicious
    ]  # fmt: skip
    for other in twice[1:]:
        for key, value in other.items():
            torch.testing.assert_close(value, twice[0][key])


def built_ins() -> list[type[RoundComponent]]:
    """Every component class the library exports but the checkpoint writer (start-up builds it
    with the run's parts; it keeps no state of its own)."""
    kinds = [getattr(components, name) for name in components.__all__]
    return [
        kind for kind in kinds
        if isinstance(kind, type) and issubclass(kind, RoundComponent)
        and kind is not components.CheckpointSaver
    ]  # fmt: skip


def made(kind: type[RoundComponent]) -> RoundComponent:
    """``kind`` with example options (the run's path: with the parts start-up gives it)."""
    if kind is components.RunPath:
        return kind(SequentialBackend(), {}, torch.device("cpu"))
    return kind(SignFlip(fraction=0.2)) if kind is components.Adversary else kind()


@pytest.mark.parametrize("kind", built_ins(), ids=lambda kind: kind.__name__)
def test_a_built_in_checkpoints_exactly_its_declared_state(kind):
    component = made(kind)
    component.build_state()
    state = component.state_dict()
    assert set(state) == set(component.declared_states())
    restored = made(kind)
    restored.build_state()
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    if state:
        broken = {**state, next(iter(state)): object()}
        with pytest.raises(Exception, match="does not fit its declarations"):
            restored.load_state_dict(broken)


def test_a_users_running_mean_resumes_bit_for_bit_on_either_backend(cli, tmp_path):
    """The issue's meter (a running mean of the update norms, number state), written from the
    docs: its column is a real norm every round (not NaN: ``on_results`` sees the uploads), its
    running mean is the mean of the column, and a resumed run logs the same numbers."""
    meter = ["--loop.components+", "user_components.UpdateNormMeter", "--loop.plots", "false"]
    for backend in (SEQUENTIAL, COHORT):
        straight = cli(tmp_path / backend / "straight", *meter, "--loop.backend", backend,
                       "--loop.rounds", "3")  # fmt: skip
        norms = [float(row["update_norm"]) for row in straight]
        assert all(math.isfinite(n) and n > 0 for n in norms)
        for r, row in enumerate(straight):
            assert float(row["update_norm_mean"]) == pytest.approx(sum(norms[: r + 1]) / (r + 1))
        run = tmp_path / backend / "resumed"
        cli(run, *meter, "--loop.backend", backend, "--loop.rounds", "2")
        resumed = cli(run, *meter, "--loop.backend", backend, "--loop.rounds", "3",
                      "--ckpt_path", str(run / "last.ckpt"))  # fmt: skip
        for column in ("update_norm", "update_norm_mean"):
            assert [r[column] for r in resumed] == [r[column] for r in straight], column
        state = torch.load(run / "last.ckpt", weights_only=True)["components"]["update_norm"]
        assert state["rounds"] == 3 and state["mean"] == float(straight[-1]["update_norm_mean"])


class _Meter(RoundComponent):
    transient_attributes = frozenset({"last"})

    def __init__(self):
        self.add_state("total", 0)
        self.count = 0
        self.last = 0.0


def test_undeclared_state_is_refused_naming_it_and_parts_and_transients_pass():
    """The watch (:mod:`fedlightning.loop.components.watch`): declared state, transient values
    and the run's parts held by the component may change; any other attribute that changes is
    refused at the end of its round, also when its new value equals a number of the run."""

    class Part:
        calls = 0

    meter, part = _Meter(), Part()
    meter.build_state()
    meter.run = part
    watch = ComponentWatch([meter], parts=[part, 8])
    meter.total += 5
    meter.last = 1.5
    part.calls += 1  # the run's, not the component's
    watch.check(0)
    meter.count = 8
    with pytest.raises(ConfigurationError) as refused:
        watch.check(1)
    assert str(refused.value) == (
        "round 2: the round component _Meter.count changed (now 8) but is not declared state, so "
        "a resumed run would restart it: declare it in __init__ with self.add_state('count', "
        "<initial value>) (docs/algorithms.md section 6.2), or, if no later round reads it, list "
        "it in _Meter.transient_attributes"
    )


def test_an_undeclared_counter_stops_a_cli_run_naming_it(cli, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path, "--loop.components+", "user_components.Counter", "--loop.rounds", "2")
    assert exit_info.value.code == 2
    assert "round 1: the round component Counter.count changed (now 1)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_acc": 0.5, "components": [components.TargetTracker(0.6)]},
         r"^loop.target_acc and loop.components\[0\] \(TargetTracker\) both configure the "
         r"TargetTracker: give one of them$"),
        ({"attack": SignFlip(fraction=0.2), "components": [components.Adversary(SignFlip())]},
         r"^loop.attack and loop.components\[0\] \(Adversary\)"),
        ({"components": [components.TargetTracker(), components.TargetTracker(0.5)]},
         r"^loop.components\[1\] is a second TargetTracker \(loop.components\[0\] is one\)"),
        ({"components": [components.ServerGuard()]},
         r"^loop.components\[0\]=ServerGuard is a built-in round component that every run has, "
         r"in its place \(loop.on_round_failure is its option\): leave it out"),
        ({"components": [user_components.UpdateNormMeter(), user_components.UpdateNormMeter("b")]},
         r"^loop.components: UpdateNormMeter keeps its state under 'update_norm', as "
         r"UpdateNormMeter does"),
        ({"components": [SignFlip()]},
         r"^loop.components\[0\]=SignFlip is an instance of SignFlip \(a class derived from "
         r"fedlightning.attacks.base.UploadAttack\), not a round component"),
        ({"target_acc": 97.0}, r"^loop.target_acc=97.0 is not allowed"),
    ],
    ids=["target-twice", "attack-twice", "two-trackers", "always-on", "one-key", "no-component",
         "bad-target"],
)  # fmt: skip
def test_the_components_option_refuses_in_one_line(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        FederatedLoop(**kwargs)


def test_declared_tables_and_optional_numbers_round_trip_and_are_checked():
    """``{}`` (a table the component fills) and ``None`` (an optional number) as declared state:
    checkpointed as they are, reset at start-up, a value of another kind refused naming it."""

    class Table(RoundComponent):
        def __init__(self):
            self.add_state("by_client", {})
            self.add_state("best", None)

    table = Table()
    table.build_state()
    table.by_client[3], table.best = 0.25, 7
    state = table.state_dict()
    fresh = Table()
    fresh.build_state()
    assert fresh.state_dict() == {"by_client": {}, "best": None}
    fresh.load_state_dict(state)
    assert fresh.state_dict() == {"by_client": {3: 0.25}, "best": 7}
    assert fresh.by_client is not table.by_client  # a copy
    assert fresh.declared_states() == {
        "by_client": "an empty dict",
        "best": "None (an optional number)",
    }
    with pytest.raises(
        ConfigurationError, match=r"best is a str, declared None or a Python number"
    ):
        fresh.load_state_dict({"by_client": {}, "best": "7"})
    with pytest.raises(ConfigurationError, match=r"by_client is a list, declared a dict"):
        fresh.load_state_dict({"by_client": [], "best": None})
