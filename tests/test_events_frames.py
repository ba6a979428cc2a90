"""gateway/events.py's frames: an event the runtime pushed to many subscribers (Pushed)
is rendered to its SSE bytes once and every subscriber gets those same bytes; any other
value is rendered each time, with the same framing."""

from __future__ import annotations

import json

from aotx_trio.gateway.events import _event, _shared
from aotx_trio.service.pushed import Pushed


def test_a_pushed_event_is_rendered_once_and_its_bytes_shared() -> None:
    item = Pushed({"cursor": "7", "receipt": {"sequence": None}})
    first = _shared(item, "input", "con_x/7")
    again = _shared(item, "input", "con_x/7")
    assert again is first                          # the same bytes object: rendered once
    head, data = first.split(b"\ndata: ")
    assert head == b"id: con_x/7\nevent: input" and data.endswith(b"\n\n")
    assert json.loads(data) == {"cursor": "7", "receipt": {"sequence": None}}
    assert first == _event("input", dict(item), "con_x/7")   # as an unshared value frames


def test_a_plain_value_frames_the_same_each_time() -> None:
    value = {"next_offset": 3, "text": "abc"}
    one, two = _shared(value, "output", "op_x/3"), _shared(value, "output", "op_x/3")
    assert one == two == _event("output", value, "op_x/3")
    assert one.startswith(b"id: op_x/3\nevent: output\ndata: ")
