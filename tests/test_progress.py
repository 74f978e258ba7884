"""The slow-round progress line (``round r: k/n clients done``) counts clients as they finish on
every backend (issue 26 item 8): the default AutoBackend passes the loop's ``on_client_done`` to
the backend it chose (the sequential backend said ``0/10 clients done`` for a whole round), the
sequential backend reports each client right after its fit, the cohort backend reports a cohort's
clients when their one vectorized fit ends, and Ray reports each client as its actor finishes.
The printed line itself: tests/test_loud_failures.py::test_a_slow_round_reports_its_clients_as_they_finish."""

import pytest

from fedlightning.backends import CohortBackend, RayBackend
from fedlightning.clients import ClientModule
from fedlightning.loop.reporting import Reporter
from objective_helpers import SYNTHETIC, synthetic_run

EVENTS: list[tuple[str, int]] = []


class Recorded(ClientModule):
    """Records ``("fit", client)`` when a client's fit ends (its upload is built)."""

    def end_client(self, num_steps):
        EVENTS.append(("fit", self.client_id))
        return super().end_client(num_steps)


@pytest.fixture
def events(monkeypatch):
    EVENTS.clear()
    monkeypatch.setattr(
        Reporter, "client_done", lambda self, cid: EVENTS.append(("done", cid)), raising=True
    )
    return EVENTS


def test_auto_and_sequential_report_each_client_right_after_its_fit(tmp_path, events):
    synthetic_run(Recorded(**SYNTHETIC), rounds=2, tmp_path=tmp_path, plots=False)
    fits = [cid for kind, cid in events if kind == "fit"]
    assert len(fits) == 4  # 2 rounds x 2 clients
    assert events == [event for cid in fits for event in (("fit", cid), ("done", cid))]


def test_the_cohort_reports_its_clients_when_their_fit_ends(tmp_path, events):
    synthetic_run(
        Recorded(**SYNTHETIC), rounds=2, tmp_path=tmp_path, plots=False, backend=CohortBackend()
    )
    for start in (0, 4):  # per round: both fits end, then both are reported
        round_events = events[start : start + 4]
        assert [kind for kind, _ in round_events] == ["fit", "fit", "done", "done"]
        assert {cid for _, cid in round_events[:2]} == {cid for _, cid in round_events[2:]}


@pytest.mark.slow  # Ray's start-up
def test_ray_reports_each_client_as_its_actor_finishes(tmp_path, events, local_ray):
    loop = synthetic_run(
        ClientModule(**SYNTHETIC), rounds=2, tmp_path=tmp_path, plots=False,
        backend=RayBackend(num_workers=2),
    )  # fmt: skip
    done = [cid for kind, cid in events if kind == "done"]
    assert len(done) == 4 and len(loop.history) == 2
    assert len(set(done[:2])) == 2 and len(set(done[2:])) == 2  # each round: both clients
