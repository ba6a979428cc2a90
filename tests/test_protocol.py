"""The service socket's sans-IO protocol: the bytes of docs/formats/socket.md's worked
examples, the same events however the bytes are split, the events one end sends are
the events the other reads, one shared item frame for a pushed item queued for several
streams, one decoded value per item bytes, and FrameError for broken framing."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest

from aotx_trio import errors
from aotx_trio.service import protocol, wire
from aotx_trio.service.protocol import (
    CLIENT,
    SERVER,
    BadRequest,
    Cancel,
    Connection,
    End,
    Event,
    Item,
    Request,
    Response,
    Signal,
)
from aotx_trio.service.pushed import Pushed


def _events(role: protocol.Role, chunks: list[bytes]) -> list[Event | Signal]:
    """Every event of ``chunks`` fed one by one (b"" skipped: it is the end), then the end
    of the stream."""
    conn = Connection(role)
    out: list[Event | Signal] = []
    for chunk in [*filter(None, chunks), b""]:
        conn.receive_data(chunk)
        while (event := conn.next_event()) is not Signal.NEED_DATA:
            out.append(event)
            if event is Signal.CLOSED:
                return out
    raise AssertionError("no end")


def _view(events: list[Event] | list[Event | Signal]) -> list[Any]:
    """The events with their errors as (class name, envelope): comparable by value."""
    def field(v: Any) -> Any:
        return (type(v).__name__, v.envelope()) if isinstance(v, errors.AotxError) else v
    return [e if isinstance(e, Signal) else
            (type(e).__name__, *[field(getattr(e, f.name)) for f in dataclasses.fields(e)])
            for e in events]


def _sent(role: protocol.Role, events: list[Event]) -> bytes:
    conn = Connection(role)
    for event in events:
        conn.send(event)
    data = conn.data_to_send()
    assert conn.data_to_send() == b""
    return data


def test_the_worked_examples_are_byte_exact() -> None:
    """docs/formats/socket.md: ping and its answer, a save.watch open, end, cancel."""
    ping = _sent(CLIENT, [Request(1, "ping", {})])
    assert ping == bytes.fromhex("24000000") + b'{"id":1,"method":"ping","params":{}}'
    assert len(ping) == 40
    lineage = "0123456789abcdef0123456789abcdef"
    answer = _sent(SERVER, [Response(1, {"lineage": lineage})])
    assert answer == bytes.fromhex("4a000000") + \
        b'{"id":1,"ok":true,"result":{"lineage":"%s"}}' % lineage.encode()
    watch = _sent(CLIENT, [Request(2, "save.watch", {"limit": 1}, stream=True)])
    assert len(watch) == 69 and watch[:4] == bytes.fromhex("41000000")
    assert watch[4:] == b'{"id":2,"method":"save.watch","params":{"limit":1},"stream":true}'
    assert _sent(SERVER, [Response(2, {"saved": 1}, stream=True)])[4:] == \
        b'{"id":2,"ok":true,"result":{"saved":1},"stream":true}'
    assert _sent(SERVER, [End(2, wire.END_COMPLETE)]) == \
        bytes.fromhex("19000000") + b'{"id":2,"end":"complete"}'
    assert _sent(CLIENT, [Cancel(2)]) == bytes.fromhex("16000000") + b'{"id":2,"cancel":true}'


def test_each_event_is_the_frame_of_wire_s_shapes() -> None:
    exc = errors.JournalHold("hold", code="journal_hold", hold=["disk"])
    pairs: list[tuple[Event, dict[str, Any]]] = [
        (Request(3, "m", {"a": "é"}), wire.request(3, "m", {"a": "é"})),
        (Response(4, [1, None]), wire.success(4, [1, None])),
        (Response(5, error=exc), wire.failure(5, exc)),
        (Response(5, error=exc, stream=True), wire.failure(5, exc)),
        (Item((6,), {"x": 1}), wire.item(6, {"x": 1})),
        (Item((6,), Pushed({"x": 1})), wire.item(6, {"x": 1})),
        (End(7, wire.END_ERROR, exc), wire.end(7, wire.END_ERROR, exc)),
        (End(7, wire.END_SHUTDOWN), wire.end(7, wire.END_SHUTDOWN)),
        (Cancel(8), wire.cancel(8)),
    ]
    for event, shape in pairs:
        assert protocol.encode(event) == wire.encode_frame(shape), event
        assert _sent(SERVER, [event]) == wire.encode_frame(shape), event


CLIENT_FRAMES: list[Event] = [
    Request(1, "ping", {}),
    Request(2, "save.watch", {"limit": 1}, stream=True),
    Cancel(2),
    Request(3, "naïve ☃", {"s": "x" * 300}),
]


@pytest.mark.parametrize(("role", "frames"), [
    (SERVER, CLIENT_FRAMES),
    (CLIENT, [Response(1, {"ok": "é"}), Response(2, {"s": 1}, stream=True),
              Item((2,), {"n": 1}), Item((2, 5), {"n": 2}),
              End(2, wire.END_ERROR, errors.OverCapacity("x", code="slow_consumer")),
              Response(3, error=errors.NotFound("no", code="method_not_found"))]),
])
def test_the_same_events_however_the_bytes_are_split(role: protocol.Role,
                                                     frames: list[Event]) -> None:
    data = b"".join(protocol.encode(f) for f in frames)
    whole = _view(_events(role, [data]))
    assert whole == _view([*frames, Signal.CLOSED])
    for cut in range(len(data) + 1):
        assert _view(_events(role, [data[:cut], data[cut:]])) == whole, cut
    assert _view(_events(role, [data[i:i + 1] for i in range(len(data))])) == whole


def test_a_client_reads_what_the_runtime_sent() -> None:
    exc = errors.BelowRetryFloor("below", code="below_retry_floor", retry_floor="5")
    sent: list[Event] = [Response(1, {"a": [1, 2]}), Response(2, error=exc),
                         Response(3, {"open": True}, stream=True), Item((3,), "text"),
                         Item((3, 4), {"k": "v"}), End(3, wire.END_CANCELLED),
                         End(4, wire.END_ERROR, exc)]
    got = _events(CLIENT, [_sent(SERVER, sent)])
    assert _view(got) == _view([*sent, Signal.CLOSED])
    assert isinstance(got[1], Response) and type(got[1].error) is errors.BelowRetryFloor


def test_a_pushed_item_queued_for_streams_next_to_each_other_is_one_shared_frame() -> None:
    first, second = Pushed({"cursor": "7", "text": "naïve"}), Pushed({"cursor": "8"})
    conn = Connection(SERVER)
    for sid in (3, 5, 9):
        conn.send(Item((sid,), first))
    conn.send(Item((9,), {"own": 9}))             # a plain item: its own frame
    conn.send(Item((3,), second))                 # a lone stream: the plain item frame
    conn.send(Item((5,), first))                  # not next to its kin: a new frame
    conn.send(Item((7,), first))
    raw = wire.compact(first)
    assert conn.data_to_send() == b"".join(wire.prefixed(b) for b in (
        b'{"ids":[3,5,9],"item":' + raw + b"}",
        b'{"id":9,"item":{"own":9}}',
        b'{"id":3,"item":{"cursor":"8"}}',
        b'{"ids":[5,7],"item":' + raw + b"}"))
    # read back: every stream gets its items, the shared value decoded once
    events = _events(CLIENT, [_sent(SERVER, [Item((1,), first), Item((2,), first)]),
                              protocol.encode(Item((4,), first))])
    assert events[0] == Item((1, 2), dict(first))
    assert isinstance(events[0], Item) and isinstance(events[1], Item)
    assert events[1].value is events[0].value and isinstance(events[0].value, Pushed)


def test_an_item_too_big_to_share_or_to_send() -> None:
    conn = Connection(SERVER)
    big = Pushed({"s": "x" * (wire.MAX_FRAME - protocol._IDS_ROOM)})
    conn.send(Item((1,), big))
    conn.send(Item((2,), big))                    # too big to share: one frame each
    data = conn.data_to_send()
    (n,) = struct.unpack_from("<I", data)
    assert data[4:4 + n].startswith(b'{"id":1,"item":')
    assert data[8 + n:].startswith(b'{"id":2,"item":')
    conn.send(Response(1, "queued"))
    with pytest.raises(errors.FrameError):
        conn.send(Item((1,), {"s": "x" * wire.MAX_FRAME}))
    assert conn.data_to_send() == protocol.encode(Response(1, "queued"))   # kept whole


def test_requests_the_runtime_cannot_run_are_events_not_framing_errors() -> None:
    frames = [{"id": 9, "params": {}}, {"method": "m", "params": {}},
              {"id": 4, "method": "m", "params": [], "stream": True},
              {"id": 5, "method": "m"},                     # params default to {}
              {"id": "x", "cancel": True},                  # ignored
              {"id": 6, "cancel": True}]
    events = _events(SERVER, [b"".join(wire.encode_frame(f) for f in frames)])
    assert [(type(e), getattr(e, "id", None)) for e in events[:3]] == \
        [(BadRequest, 9), (BadRequest, 0), (BadRequest, 4)]
    assert isinstance(events[2], BadRequest) and events[2].stream
    assert isinstance(events[0], BadRequest) and events[0].error.code == "frame_invalid"
    assert events[3:] == [Request(5, "m", {}), Cancel(6), Signal.CLOSED]


@pytest.mark.parametrize(("data", "fragment"), [
    (struct.pack("<I", 0), "outside 1.."),
    (struct.pack("<I", 65), "outside 1.."),
    (struct.pack("<I", 2) + b"\xff\xfe", "not UTF-8 at byte offset 0"),
    (struct.pack("<I", 3) + b"[1]", "not a JSON object"),
    (struct.pack("<I", 3) + b"{x}", "not JSON at byte offset 1"),
    (struct.pack("<I", 10) + b"{}", "inside a frame (6 of 14 bytes)"),
    (b"\x01\x00", "inside a frame (2 of 4 bytes)"),
])
@pytest.mark.parametrize("role", [CLIENT, SERVER])
def test_broken_framing_raises_frame_error(data: bytes, fragment: str,
                                           role: protocol.Role) -> None:
    ok = wire.encode_frame(wire.request(1, "m", {}))
    for cut in range(len(data) + 1):
        conn = Connection(role, max_frame=64)
        with pytest.raises(errors.FrameError) as info:
            for chunk in (ok + data[:cut], data[cut:], b""):
                conn.receive_data(chunk)
                while conn.next_event() not in (Signal.NEED_DATA, Signal.CLOSED):
                    pass
        assert fragment in info.value.message and info.value.code == "frame_invalid"
        assert "offset" in info.value.fields


def test_a_client_skips_a_frame_without_an_id_and_never_sends_a_bad_request() -> None:
    events = _events(CLIENT, [wire.encode_frame({"ok": True, "result": 1}),
                              wire.encode_frame({"id": 2, "ok": True, "result": 2})])
    assert events == [Response(2, 2), Signal.CLOSED]
    with pytest.raises(TypeError):
        Connection(SERVER).send(BadRequest(1, errors.FrameError("x")))
