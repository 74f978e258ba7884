"""Sending client jobs through a Flower ``Grid`` (the SuperLink's view of the SuperNodes).

:class:`GridTransport` is used where a ``Grid`` lives: inside a ServerApp (the exported app's, or
the relay ServerApp through which a ``fedlightning fit`` process reaches a SuperLink,
:mod:`fedlightning.flower_app.relay`). A request is a node and a wire blob
(:mod:`fedlightning.flower_app.envelope`); the answer is the reply's blob, or why there is none,
and the timestamps of its way (:data:`Timing`). It pushes messages and pulls replies itself
(polling every ``poll`` seconds) instead of ``Grid.send_and_receive``, whose fixed 3 s sleep
between pulls would dominate short rounds. :meth:`GridTransport.secure_exchange` runs a round
under Flower's SecAgg+ (:mod:`fedlightning.flower_app.secure_grid`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedlightning.flower_app.envelope import timing_of, unwrap, wrap

#: the reply's blob, or why there is none
Reply = bytes | str
#: per request: when it was pushed (``sent``), when its reply arrived (``received``) and the
#: node's own timestamps (:mod:`fedlightning.flower_app.warm_client`), seconds since the epoch
Timing = dict[str, float]


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
        messages = [
            Message(
                RecordDict({"query": ConfigRecord({"num_clients": num_clients})}),
                dst_node_id=node,
                message_type=MessageType.QUERY,
                group_id="query",
            )  # fmt: skip
            for node in node_ids
        ]
        served: dict[int, list[int]] = {}
        for node, (reply, _) in zip(node_ids, self.send_and_pull(messages, timeout), strict=True):
            if isinstance(reply, Message) and not reply.has_error():
                ids = reply.content.config_records["served"]["client_ids"]
                served[node] = [int(c) for c in ids if int(c) >= 0]  # type: ignore[union-attr]
        return served

    def exchange(
        self,
        message_type: str,
        group_id: str,
        requests: Sequence[tuple[int, bytes]],
        timeout: float,
        on_reply: Callable[[int], None] | None = None,
    ) -> list[tuple[Reply, Timing]]:
        """Send each ``(node_id, blob)``; per request, the reply's blob or the reason there is
        none (the node's error, or no reply within ``timeout`` seconds), and its timing.
        ``on_reply(node_id)`` is called as each node's reply arrives (the round's progress)."""
        messages = [
            Message(wrap(blob), dst_node_id=node, message_type=message_type, group_id=group_id)
            for node, blob in requests
        ]
        arrived = None if on_reply is None else (lambda i: on_reply(requests[i][0]))
        out: list[tuple[Reply, Timing]] = []
        for (node, _), (reply, timing) in zip(
            requests, self.send_and_pull(messages, timeout, arrived), strict=True
        ):
            if reply is None:
                out.append((f"node {node} did not reply within {timeout:g} s", timing))
            elif reply.has_error():
                reason = f"node {node}: Flower error {reply.error.code}: {reply.error.reason}"
                out.append((reason, timing))
            else:
                out.append((unwrap(reply.content), {**timing_of(reply.content), **timing}))
        return out

    def send_and_pull(
        self,
        messages: Sequence[Message],
        timeout: float | None,
        on_reply: Callable[[int], None] | None = None,
    ) -> list[tuple[Message | None, Timing]]:
        """Push ``messages`` and pull their replies until all came or ``timeout`` seconds
        (``None``: no limit) passed; per message its reply (``None``: none) and its timing.
        ``on_reply(i)`` is called when message ``i``'s reply arrives."""
        sent = time.time()
        ids = list(self.grid.push_messages(messages))
        waiting = {mid: i for i, mid in enumerate(ids)}
        out: list[tuple[Message | None, Timing]] = [(None, {"sent": sent}) for _ in messages]
        deadline = None if timeout is None else time.monotonic() + timeout
        while waiting and (deadline is None or time.monotonic() < deadline):
            for reply in self.grid.pull_messages(list(waiting)):
                i = waiting.pop(reply.metadata.reply_to_message_id, None)
                if i is not None:
                    out[i] = (reply, {"sent": sent, "received": time.time()})
                    if on_reply is not None:
                        on_reply(i)
            if waiting:
                time.sleep(self.poll)
        return out

    def secure_exchange(
        self, group_id: str, requests: Sequence[tuple[int, bytes]], options: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:  # fmt: skip
        """One round under Flower's SecAgg+ (:func:`fedlightning.flower_app.secure_grid.run`)."""
        from fedlightning.flower_app.secure_grid import run

        return run(_PollingGrid(self), int(group_id), requests, options, timeout)


class _PollingGrid:
    """The ``Grid`` the SecAgg+ workflow drives: ``send_and_receive`` polls every ``poll``
    seconds (Flower's sleeps 3 s between pulls); anything else is the Grid's."""

    def __init__(self, transport: GridTransport) -> None:
        self._transport = transport

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        replies = self._transport.send_and_pull(list(messages), timeout)
        return [reply for reply, _ in replies if reply is not None]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport.grid, name)
