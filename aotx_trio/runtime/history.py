"""A conversation's history, read from the device: the context of an input is every
live earlier input of its conversation in input order, with its output.

The device is the one source (no copy in memory): the same history before and
after a restart, and retired inputs (under their actors' retry floors) leave the
context exactly when they leave the tables.  Each turn is labelled with
:func:`label_of` the participant's key, never a principal name (the device keeps
keys only, so a name could not be rebuilt after a restart).  An output is the
model's bytes of a ``succeeded``, ``cancelled`` or ``deadline_exceeded`` input;
``failed`` and ``interrupted`` ones and inputs still running contribute their
text only.
"""

from __future__ import annotations

from aotx_trio.device import Device, Receipt, decode_canonical
from aotx_trio.runtime.prompt import Turn
from aotx_trio.vocab import ALL_GRANTS

#: statuses whose result bytes are model output
OUTPUT_STATUSES = frozenset({"succeeded", "cancelled", "deadline_exceeded"})
PAGE = 128


def label_of(participant_key: str) -> str:
    """A participant's label in model contexts: ``p`` + the first 8 hex digits of its
    key (stable across restarts; reveals no principal name)."""
    return "p" + participant_key[:8]


def turn_of(device: Device, receipt: Receipt, result_cap: int) -> Turn:
    """The turn of one INPUT receipt: its text and, when it has one, its output."""
    text = decode_canonical(device.canonical(receipt.op_id)).text
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    turn = Turn(label_of(receipt.participant), data)
    if receipt.status in OUTPUT_STATUSES:
        turn.output = device.result(ALL_GRANTS, receipt.participant, receipt.op_id, 0,
                                    result_cap)[0]
    return turn


def before(device: Device, conversation: str, input_index: int, result_cap: int,
           ) -> list[Turn]:
    """The live inputs of ``conversation`` before ``input_index``, oldest first."""
    turns: list[Turn] = []
    cursor = 0
    while True:
        rows, nxt, _floor = device.conversation_inputs(0, None, conversation, cursor, PAGE)
        for row in rows:
            if row.input_index >= input_index:
                return turns
            turns.append(turn_of(device, row, result_cap))
        if not nxt:
            return turns
        cursor = nxt
