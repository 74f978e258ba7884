"""Sending client jobs through a Flower ``Grid`` (the SuperLink's view of the SuperNodes).

:class:`GridTransport` is used where a ``Grid`` lives: inside a ServerApp (the exported app's, or
the relay ServerApp through which a ``fedlightning fit`` process reaches a SuperLink,
:mod:`fedlightning.flower_app.relay`). It pushes messages and pulls replies itself (polling every
``poll`` seconds) instead of ``Grid.send_and_receive``, whose fixed 3 s sleep between pulls would
dominate short rounds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

#: what a request gets back: the reply content, or why there is none
Reply = RecordDict | str


class GridTransport:
    """Messages to SuperNodes through ``grid``."""

    def __init__(self, grid: Grid, poll: float = 0.02) -> None:
        self.grid = grid
        self.poll = poll

    def node_ids(self) -> list[int]:
        """The SuperNodes the SuperLink currently lists."""
        return sorted(int(n) for n in self.grid.get_node_ids())

    def served(
        self, node_ids: Sequence[int], num_clients: int, timeout: float
    ) -> dict[int, list[int]]:
        """Per node that answered within ``timeout``, the client ids it serves."""
        content = lambda: RecordDict({"query": ConfigRecord({"num_clients": num_clients})})  # noqa: E731
        replies = self.exchange(
            MessageType.QUERY, "query", [(n, content()) for n in node_ids], timeout
        )
        served: dict[int, list[int]] = {}
        for node, reply in zip(node_ids, replies, strict=True):
            if isinstance(reply, RecordDict):
                ids = reply.config_records["served"]["client_ids"]
                served[node] = [int(c) for c in ids if int(c) >= 0]  # type: ignore[union-attr]
        return served

    def exchange(
        self,
        message_type: str,
        group_id: str,
        requests: Sequence[tuple[int, RecordDict]],
        timeout: float,
    ) -> list[Reply]:
        """Send each ``(node_id, content)``; per request, the reply's content or the reason there
        is none (the node's error, or no reply within ``timeout`` seconds)."""
        messages = [
            Message(content, dst_node_id=node, message_type=message_type, group_id=group_id)
            for node, content in requests
        ]
        ids = list(self.grid.push_messages(messages))
        waiting = {mid: i for i, mid in enumerate(ids)}
        replies: list[Reply] = [
            f"node {node} did not reply within {timeout:g} s" for node, _ in requests
        ]
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(waiting)):
                i = waiting.pop(reply.metadata.reply_to_message_id, None)
                if i is None:
                    continue
                if reply.has_error():
                    replies[i] = (
                        f"node {requests[i][0]}: Flower error {reply.error.code}: {reply.error.reason}"
                    )
                else:
                    replies[i] = reply.content
            if waiting:
                time.sleep(self.poll)
        return replies
