"""Service-socket framing: frames round-trip, split anywhere, and bad frames are named."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from aotx_trio import errors
from aotx_trio.service import wire
from aotx_trio.service.pushed import Pushed


def test_frame_layout_is_length_prefixed_json() -> None:
    frame = wire.encode_frame(wire.request(7, "ping", {}))
    body = b'{"id":7,"method":"ping","params":{}}'
    assert frame == struct.pack("<I", len(body)) + body
    assert frame[:4] == bytes([len(body), 0, 0, 0])


def test_non_ascii_is_utf8_not_escaped() -> None:
    frame = wire.encode_frame({"id": 1, "s": "é"})
    assert "é".encode() in frame


async def _feed(data: bytes, chunk: int) -> list[dict[str, object]]:
    """Write ``data`` in ``chunk``-byte pieces into a buffered memory stream, then read."""
    send, recv = trio.testing.memory_stream_one_way_pair()
    for i in range(0, len(data), chunk):
        await send.send_all(data[i:i + chunk])
    await send.aclose()
    reader = wire.FrameReader(recv)
    out: list[dict[str, object]] = []
    while (frame := await reader.read()) is not None:
        out.append(frame)
    return out


@pytest.mark.parametrize("chunk", [1, 3, 5, 1000])
async def test_reader_reassembles_frames_split_anywhere(chunk: int) -> None:
    frames = [wire.request(i, "m", {"n": i, "s": "x" * i}) for i in range(1, 6)]
    data = b"".join(wire.encode_frame(f) for f in frames)
    # Lockstep: each receive_some returns exactly one send_all's bytes.
    send, recv = trio.testing.lockstep_stream_one_way_pair()
    reader = wire.FrameReader(recv)
    got: list[dict[str, object]] = []

    async def writer() -> None:
        for i in range(0, len(data), chunk):
            await send.send_all(data[i:i + chunk])
        await send.aclose()

    async with trio.open_nursery() as n:
        n.start_soon(writer)
        while (frame := await reader.read()) is not None:
            got.append(frame)
    assert got == frames


@pytest.mark.parametrize(("data", "fragment"), [
    (struct.pack("<I", 0), "outside 1.."),
    (struct.pack("<I", wire.MAX_FRAME + 1), "outside 1.."),
    (struct.pack("<I", 2) + b"\xff\xfe", "not UTF-8 at byte offset 0"),
    (struct.pack("<I", 3) + b"[1]", "not a JSON object"),
    (struct.pack("<I", 3) + b"{x}", "not JSON at byte offset 1"),
    (struct.pack("<I", 10) + b"{}", "inside a frame"),
    (b"\x01\x00", "inside a frame"),
])
async def test_bad_frames_raise_frame_error(data: bytes, fragment: str) -> None:
    with pytest.raises(wire.FrameError) as info:
        await _feed(data, 1000)
    assert fragment in info.value.message
    assert info.value.code == "frame_invalid"


def test_oversize_frame_is_refused_on_encode() -> None:
    with pytest.raises(wire.FrameError):
        wire.encode_frame({"s": "x" * (wire.MAX_FRAME + 1)})


def test_error_round_trip_keeps_class_code_and_fields() -> None:
    exc = errors.BelowRetryFloor("sequence 3 is below the retry floor 5", code="below_retry_floor",
                                 retry_floor="5")
    frame = wire.decode_body(wire.encode_frame(wire.failure(9, exc))[4:])
    assert frame == {"id": 9, "ok": False, "kind": "BelowRetryFloor",
                     "error": {"code": "below_retry_floor",
                               "message": "sequence 3 is below the retry floor 5",
                               "retry_floor": "5"}}
    back = wire.error_from_frame(frame)
    assert type(back) is errors.BelowRetryFloor
    assert back.envelope() == exc.envelope()


def test_unknown_kind_falls_back_to_base_class() -> None:
    back = wire.error_from_frame({"id": 1, "ok": False, "kind": "os",
                                  "error": {"code": "x", "message": "m"}})
    assert type(back) is errors.AotxError
    assert back.code == "x"


def test_a_pushed_item_frame_is_the_plain_frame_encoded_once() -> None:
    """item_frame writes the bytes of encode_frame(item(...)); a shared item frame is
    the ids, then the item's JSON once."""
    item = Pushed({"cursor": "7", "text": "naïve ☃", "data": None, "n": [1, 2.5]})
    for sid in (1, 12345678901):
        assert wire.item_frame((sid,), item) == wire.encode_frame(wire.item(sid, dict(item)))
    assert wire.item_frame((3,), {"plain": True}) == \
        wire.encode_frame(wire.item(3, {"plain": True}))
    calls = []
    item.encoded("probe", lambda v: calls.append(v) or b"x")
    item.encoded("probe", lambda v: calls.append(v) or b"y")
    assert calls == [item] and item.encoded("probe", bytes) == b"x"
    assert wire.item_frame((3, 5, 12345678901), item) == wire.prefixed(
        b'{"ids":[3,5,12345678901],"item":' + wire.compact(item) + b"}")
    assert wire.item_frame((3, 5), [1]) == wire.prefixed(b'{"ids":[3,5],"item":[1]}')


def test_frame_buffer_refuses_a_bad_length_before_its_body() -> None:
    frames = wire.FrameBuffer(max_frame=8)
    frames.feed(struct.pack("<I", 3) + b"{}")
    assert frames.next_body() is None and not frames.closed
    frames.feed(b" " + struct.pack("<I", 9))
    assert frames.next_body() == b"{} "
    with pytest.raises(wire.FrameError, match=r"outside 1\.\.8"):
        frames.next_body()
