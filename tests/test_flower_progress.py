"""The Flower backend's round progress (issue 34 item 7): a node's clients count as done when its
reply arrives, not all together at the end of the round (the slow-round line said ``0/10 clients
done`` for a whole Flower round). A SuperNode fits its clients of a round in one message, so its
reply is the finest step; through the relay ServerApp a progress frame carries it."""

from __future__ import annotations

import threading
from multiprocessing import Pipe
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr", reason="the Flower extra: pip install 'fedlightning[flower]'")

from fedlightning.backends.flower import FlowerBackend  # noqa: E402
from fedlightning.flower_app.connect import RelayTransport  # noqa: E402
from fedlightning.flower_app.envelope import recv_frame, send_frame, wrap  # noqa: E402
from fedlightning.flower_app.relay import answer  # noqa: E402
from fedlightning.flower_app.transport import GridTransport  # noqa: E402
from fedlightning.protocol import ClientJob, FitConfig, Payload  # noqa: E402


class TwoPullGrid:
    """A Grid whose replies arrive over two pulls: node 20's first, then node 10's."""

    def __init__(self, events: list) -> None:
        self.events, self.pulls = events, 0

    def push_messages(self, messages):
        return [f"m{i}" for i in range(len(messages))]

    def pull_messages(self, ids):
        self.pulls += 1
        self.events.append(("pull", self.pulls))
        order = {1: ["m1"], 2: ["m0"]}.get(self.pulls, [])
        return [
            SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=mid),
                has_error=lambda: False,
                content=wrap(mid.encode()),
            )  # fmt: skip
            for mid in order
            if mid in ids
        ]


def test_the_grid_transport_reports_each_reply_as_it_arrives(monkeypatch):
    monkeypatch.setattr(  # a Message outside a running ServerApp (which would set its run id)
        "fedlightning.flower_app.transport.Message", lambda content, **metadata: content
    )
    events: list = []
    transport = GridTransport(TwoPullGrid(events), poll=0.0)
    replies = transport.exchange(
        "train", "0", [(10, b"a"), (20, b"b")], timeout=5.0,
        on_reply=lambda node: events.append(("reply", node)),
    )  # fmt: skip
    assert [blob for blob, _ in replies] == [b"m0", b"m1"]
    assert events == [("pull", 1), ("reply", 20), ("pull", 2), ("reply", 10)]


class ReplyingTransport:
    """The relay end's GridTransport: each node replies, in the order given."""

    def exchange(self, message_type, group_id, requests, timeout, on_reply=None):
        for node, _ in reversed(requests):
            on_reply(node)
        return [(b"ok", {"sent": 0.0}) for _ in requests]


def test_the_relay_forwards_each_reply_as_a_progress_frame_before_its_answer():
    backend_end, relay_end = Pipe()

    def relay() -> None:
        call, blobs = recv_frame(relay_end)
        progress = lambda node: send_frame(relay_end, {"status": "progress", "node": node})  # noqa: E731
        header, out = answer(ReplyingTransport(), call, blobs, progress)
        send_frame(relay_end, {"status": "ok", **header}, out)

    thread = threading.Thread(target=relay)
    thread.start()
    seen: list[int] = []
    replies = RelayTransport(backend_end, timeout=5.0).exchange(
        "train", "0", [(10, b"a"), (20, b"b"), (30, b"c")], 5.0, seen.append
    )
    thread.join()
    assert seen == [30, 20, 10]
    assert [blob for blob, _ in replies] == [b"ok"] * 3


class OneNodeRepliesTransport:
    """Node 1 replies (its clients are then done); node 2 never does."""

    def __init__(self, events):
        self.events = events

    def node_ids(self):
        return [1, 2]

    def exchange(self, message_type, group_id, requests, timeout, on_reply=None):
        on_reply(1)
        self.events.append("node 1 replied")
        return [("node 1: Flower error 0: test", {}), ("no reply", {})]


def test_the_backend_counts_a_nodes_clients_done_when_its_reply_arrives():
    events: list = []
    backend = FlowerBackend(address="127.0.0.1:9")
    backend.transport = OneNodeRepliesTransport(events)
    backend.served = {1: [0, 1], 2: [2, 3]}
    backend.config, backend.spec = FitConfig(), {}
    backend.on_client_done = lambda cid: events.append(cid)
    payload = Payload(weights={})
    jobs = [ClientJob(0, cid, payload, None) for cid in (0, 1, 2, 3)]
    results = backend.run(0, jobs)
    assert set(results) == {0, 1, 2, 3}
    assert events == [0, 1, "node 1 replied", 2, 3]  # node 2's clients at the round's end
