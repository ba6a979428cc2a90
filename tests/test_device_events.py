"""A conversation's events on the device: live INPUT receipts in input order, the
event floor under retirement, rights, foreign views, the runtime's own read and
its survival across recovery (tests/test_device.py's rig)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aotx_trio.native import device as D
from tests.test_device import ALL, A, B, C, Rig, recover_from, refused


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.dev.close()


def _room(rig: Rig) -> tuple[str, str]:
    rig.register(A, B, C)
    space = rig.space(A, "room")
    conv = rig.conversation(A, space)
    rig.do(A, D.Kind.MEMBER_SET, space=space, participant=B, permissions=("read", "write"))
    return space, conv


def test_inputs_list_in_input_order_with_pages(rig: Rig) -> None:
    _space, conv = _room(rig)
    ops = [rig.input(A if i % 2 == 0 else B, conv, text=f"turn {i}").op_id for i in range(5)]
    rows, nxt, floor = rig.dev.conversation_inputs(ALL, A, conv)
    assert [r.op_id for r in rows] == ops
    assert [r.input_index for r in rows] == [1, 2, 3, 4, 5]
    assert (nxt, floor) == (0, 0)
    # B's inputs are foreign to A: no sequence, no key
    assert [r.sequence is None for r in rows] == [False, True, False, True, False]
    page, nxt, _ = rig.dev.conversation_inputs(ALL, B, conv, cursor=1, limit=2)
    assert [r.input_index for r in page] == [2, 3] and nxt == 3
    page, nxt, _ = rig.dev.conversation_inputs(ALL, B, conv, cursor=nxt, limit=2)
    assert [r.input_index for r in page] == [4, 5] and nxt == 0
    assert rig.dev.conversation_inputs(ALL, A, conv, cursor=5) == ([], 0, 0)
    refused("cursor_invalid", rig.dev.conversation_inputs, ALL, A, conv, 6)
    # the receipt read carries the same index
    assert rig.dev.receipt(ALL, A, ops[2]).input_index == 3
    # other kinds have none
    assert rig.dev.receipt(ALL, A, rig.do(A, D.Kind.SPACE_CREATE).op_id).input_index == 0


def test_inputs_need_read_rights(rig: Rig) -> None:
    space, conv = _room(rig)
    rig.input(A, conv)
    refused("conversation_not_found", rig.dev.conversation_inputs, ALL, C, conv)   # no member
    refused("grant_forbidden", rig.dev.conversation_inputs, 0, A, conv)
    rig.do(A, D.Kind.MEMBER_SET, space=space, participant=B, permissions=("write",))
    refused("forbidden", rig.dev.conversation_inputs, ALL, B, conv)
    refused("conversation_not_found", rig.dev.conversation_inputs, ALL, A, "77" * 16)
    # the runtime's own read needs no actor
    rows, _, _ = rig.dev.conversation_inputs(0, None, conv)
    assert len(rows) == 1 and rows[0].sequence is not None
    text = D.decode_canonical(rig.dev.canonical(rows[0].op_id)).text
    assert text in ("hello", b"hello")


def test_retired_inputs_raise_the_event_floor(rig: Rig) -> None:
    _space, conv = _room(rig)
    first = rig.input(A, conv, text="one")          # A's seq 5 (after the member row)
    rig.input(B, conv, text="two")
    third = rig.input(A, conv, text="three")        # A's seq 6
    rig.journal.save()
    rig.dev.complete(first.op_id, "succeeded", b"out one", 3, 2)
    rig.journal.save()
    rig.do(A, D.Kind.RETIRE, retry_floor=6)         # retires A's seq 1-5: input 1
    rows, _, floor = rig.dev.conversation_inputs(ALL, B, conv)
    assert floor == 1 and [r.input_index for r in rows] == [2, 3]
    # a cursor below the floor lists from the floor on
    rows, _, floor = rig.dev.conversation_inputs(ALL, B, conv, cursor=0)
    assert rows[0].input_index == 2
    assert rig.dev.receipt(ALL, A, third.op_id).input_index == 3


def test_indices_survive_recovery(rig: Rig) -> None:
    _space, conv = _room(rig)
    for i in range(3):
        rig.input(B if i == 1 else A, conv, text=f"t{i}")
    rig.journal.save()
    _j, dev2, _r = recover_from(bytes(rig.journal.file))
    try:
        before = rig.dev.conversation_inputs(ALL, A, conv)[0]
        after = dev2.conversation_inputs(ALL, A, conv)[0]
        assert [(r.op_id, r.input_index) for r in after] == \
               [(r.op_id, r.input_index) for r in before]
        assert [dev2.canonical(r.op_id) for r in after] == \
               [rig.dev.canonical(r.op_id) for r in before]
    finally:
        dev2.close()


def test_finish_is_journaled_and_checked(rig: Rig) -> None:
    _space, conv = _room(rig)
    a, b, c, d = (rig.input(A, conv, text=f"t{i}") for i in range(4))
    rig.journal.save()
    assert rig.dev.receipt(ALL, A, a.op_id).finish is None          # not terminal yet
    rig.dev.complete(a.op_id, "succeeded", b"x", 1, 1, finish="length")
    rig.dev.complete(b.op_id, "succeeded", b"y", 1, 1, finish="stop")
    refused("status_invalid", rig.dev.complete, c.op_id, "failed", b"", 0, 0, "stop")
    rig.dev.complete(c.op_id, "failed")
    rig.journal.save()
    want = {a.op_id: "length", b.op_id: "stop", c.op_id: "error", d.op_id: "interrupted"}
    _j, dev2, _r = recover_from(bytes(rig.journal.file))
    try:
        assert {op: dev2.receipt(ALL, A, op).finish for op in want} == want
    finally:
        dev2.close()
