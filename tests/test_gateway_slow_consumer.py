"""The slow-consumer drop over real HTTP, in both deployments (the gateway calling the
runtime in process, or over the service socket's push frames): a hypercorn server on
loopback, a conversation event subscriber whose TCP connection stops reading while
events keep coming, and two subscribers that keep reading.  The slow one is dropped
(docs/api.md: more than ``limits.sse_queue_depth`` events behind) and, once it reads
again, gets the final ``dropped`` event naming ``slow_consumer`` and the end of the
response; the others get every event in order and stay subscribed; the runtime keeps
no follower for the dropped one.  Bounded: a small queue depth, a receive window of a
few KB, a fixed number of events, and timeouts."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import trio
from _gateway_env import (
    ALL,
    TINY_MODEL,
    Served,
    served,
    token_for,
)
from test_gateway_events import BASE, _body, _events, _manual_executor, _setup

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (?!_events ):"
        "pytest.PytestUnraisableExceptionWarning"),
]
DEPTH = 8            # limits.sse_queue_depth
# inputs posted while the slow subscriber does not read (~1 KB each; the kernel's
# buffers at a 4 KB receive window hold a few dozen; the receipt quota allows 117)
EVENTS = 100
HEALTHY = 2


class RawSubscriber:
    """An SSE request on a raw TCP socket with a small receive buffer: it reads only
    when told to, so the server's sends block once the window and buffers are full."""

    def __init__(self, url: str, path: str, token: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.addr = (host, int(port))
        self.request = h11.Request(method="GET", target=path, headers=[
            ("Host", host), ("Authorization", f"Bearer {token}"),
            ("Accept", "text/event-stream")])
        self.conn = h11.Connection(our_role=h11.CLIENT)
        self.body = bytearray()
        self.status = 0
        self.ended = False
        self.stream: trio.SocketStream | None = None

    async def open(self) -> None:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect(self.addr)
        self.stream = trio.SocketStream(sock)
        await self.stream.send_all(self.conn.send(self.request) +
                                   self.conn.send(h11.EndOfMessage()))

    async def read_until(self, marker: bytes) -> None:
        """Read until ``marker`` is in the body (or the response ended)."""
        assert self.stream is not None
        while marker not in self.body and not self.ended:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(4096))
            elif isinstance(event, h11.Response):
                self.status = event.status_code
            elif isinstance(event, h11.Data):
                self.body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                self.ended = True

    async def read_to_end(self) -> None:
        await self.read_until(b"\x00")     # never in an SSE body: reads until the end

    def events(self) -> list[tuple[str, Any]]:
        out = []
        for block in bytes(self.body).decode("utf-8").split("\n\n"):
            lines = block.split("\n")
            kind = next((x[7:] for x in lines if x.startswith("event: ")), "message")
            data = [x[6:] for x in lines if x.startswith("data: ")]
            if data:
                out.append((kind, json.loads("\n".join(data))))
        return out


@pytest.mark.parametrize("mode", ["embedded", "split"])
async def test_a_subscriber_that_stops_reading_is_dropped_with_a_final_event(
        tmp_path: Path, mode: str) -> None:
    limits = {"sse_queue_depth": DEPTH, "max_connections": 64, "requests_per_second": 0}
    async with served(tmp_path, {"alice": ALL}, limits=limits,
                      socket=mode == "split") as srv, httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {token_for('alice')}"},
            timeout=30) as http:
        con = await _setup(srv, http)
        _manual_executor(srv)            # inputs are saved (events) but never run
        path = f"{BASE}/conversations/{con}/events?stream=true"
        slow = RawSubscriber(srv.url, path, token_for("alice"))
        try:
            with trio.fail_after(90):
                await _drop(srv, http, con, path, slow)
        finally:                   # a connection nobody reads would hold the shutdown
            if slow.stream is not None:
                await slow.stream.aclose()
        events = slow.events()
        kinds = [k for k, _ in events]
        assert kinds[-1] == "dropped" and events[-1][1] == {"reason": "slow_consumer"}
        assert set(kinds[:-1]) <= {"input"}
        cursors = [int(d["cursor"]) for k, d in events if k == "input"]
        assert cursors == list(range(1, len(cursors) + 1))     # in order, no gap
        assert len(cursors) < EVENTS - DEPTH                   # dropped, not just late
        metrics = srv.app.config["AOTX_METRICS"]
        assert metrics.registry.get_sample_value(
            "aotx_sse_dropped_total", {"reason": "slow_consumer"}) == 1


async def _drop(srv: Served, http: httpx.AsyncClient, con: str, path: str,
                slow: RawSubscriber) -> None:
    """The slow subscriber opens, stops reading, EVENTS inputs are posted while two
    healthy subscribers read along; then it reads to the end of its response."""
    fanout = srv.handler.fanout
    assert fanout is not None
    got: dict[int, list[int]] = {k: [] for k in range(HEALTHY)}
    ended: dict[int, str] = {}
    done = trio.Event()

    async def healthy(k: int, task_status: trio.TaskStatus[None]) -> None:
        async with http.stream("GET", path) as resp, \
                contextlib.aclosing(_events(resp)) as stream:
            assert resp.status_code == 200
            task_status.started()
            async for _, kind, data in stream:
                if kind == "comment":
                    continue
                if kind != "input":
                    ended[k] = kind
                    return
                got[k].append(int(data["cursor"]))
                if len(got[k]) == EVENTS:
                    await done.wait()        # still subscribed until the checks
                    return

    await slow.open()
    await slow.read_until(b": aotx conversation events\n\n")
    assert slow.status == 200
    async with trio.open_nursery() as nursery:
        for k in range(HEALTHY):
            await nursery.start(healthy, k)
        while fanout.followers() < HEALTHY + 1:      # all three follow the topic
            await trio.sleep(0.01)
        # the slow one stops reading now; the events keep coming
        for i in range(EVENTS):
            r = await http.post(f"{BASE}/conversations/{con}/inputs",
                                json=_body(10 + i, 4 + i, text=f"event {i}",
                                           model=TINY_MODEL))
            assert r.status_code == 202, r.text
        while any(len(g) < EVENTS for g in got.values()) and not ended:
            await trio.sleep(0.01)
        # the dropped one no longer follows the topic; the two others still do
        assert fanout.followers() == HEALTHY
        done.set()
    # the healthy subscribers got every event, in order, and were never dropped
    assert ended == {}
    assert got == {k: list(range(1, EVENTS + 1)) for k in range(HEALTHY)}
    # it reads again: what was queued for it, then the final event, then the end
    await slow.read_to_end()
    assert slow.ended
