"""A conversation's history, read from the device: the context of an input is every
live earlier input of its conversation in input order, with its output.

The device is the one source (no copy in memory): the same history before and
after a restart, and retired inputs (under their actors' retry floors) leave the
context exactly when they leave the tables.  Each turn is labelled with
:func:`label_of` the participant's key, never a principal name (the device keeps
keys only, so a name could not be rebuilt after a restart).  An output is the
model's bytes of a ``succeeded``, ``cancelled`` or ``deadline_exceeded`` input;
``failed`` and ``interrupted`` ones and inputs still running contribute their
text only.  Each turn carries the revision of its input's execution lease
(:func:`recorded_revision`): a context is rendered with the conversation's recorded
revision family, also after a restart (runtime/prompt.py, "Revisions").
"""

from __future__ import annotations

from aotx_trio.native.device import Device
from aotx_trio.native.device_codec import Receipt, decode_canonical
from aotx_trio.runtime.prompt import Turn
from aotx_trio.vocab import ALL_GRANTS

#: statuses whose result bytes are model output
OUTPUT_STATUSES = frozenset({"succeeded", "cancelled", "deadline_exceeded"})
PAGE = 128
#: A token stands for at most this many bytes (a bound on vocabulary pieces), so
#: turns holding ``budget * BYTES_PER_TOKEN`` bytes hold at least ``budget`` tokens:
#: older turns cannot fit in the context and are not read at all.
BYTES_PER_TOKEN = 64


def label_of(participant_key: str) -> str:
    """A participant's label in model contexts: ``p`` + the first 8 hex digits of its
    key (stable across restarts; reveals no principal name)."""
    return "p" + participant_key[:8]


def turn_of(device: Device, receipt: Receipt, result_cap: int) -> Turn:
    """The turn of one INPUT receipt: its text and, when it has one, its output."""
    text = decode_canonical(device.canonical(receipt.op_id)).text
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    turn = Turn(label_of(receipt.participant), data,
                revision=receipt.lease_revision if receipt.leased else None)
    if receipt.status in OUTPUT_STATUSES:
        turn.output = device.result(ALL_GRANTS, receipt.participant, receipt.op_id, 0,
                                    result_cap)[0]
    return turn


def recorded_revision(turns: list[Turn]) -> int | None:
    """The lease revision the conversation's newest leased earlier input recorded
    (None when none was leased): a restored history keeps rendering as it was leased."""
    return next((t.revision for t in reversed(turns) if t.revision is not None), None)


def _rows(device: Device, conversation: str, input_index: int) -> list[Receipt]:
    """The live INPUT receipts of ``conversation`` before ``input_index``, oldest first."""
    rows: list[Receipt] = []
    cursor = 0
    while True:
        page, nxt, _floor = device.conversation_inputs(0, None, conversation, cursor, PAGE)
        rows += [r for r in page if r.input_index < input_index]
        if not nxt or (page and page[-1].input_index >= input_index):
            break
        cursor = nxt
    return rows


def _held(turn: Turn) -> int:
    """The bytes a turn counts toward the window (:func:`before`)."""
    return len(turn.text) + len(turn.output or b"") + len(turn.label) + 8


def _limit(budget_tokens: int | None) -> int | None:
    return None if budget_tokens is None else budget_tokens * BYTES_PER_TOKEN


def before(device: Device, conversation: str, input_index: int, result_cap: int,
           budget_tokens: int | None = None) -> list[Turn]:
    """The live inputs of ``conversation`` before ``input_index``, oldest first; with
    ``budget_tokens``, only the newest ones that could still fit that many tokens
    (their bytes are read newest first until they pass ``budget * BYTES_PER_TOKEN``)."""
    limit = _limit(budget_tokens)
    turns: list[Turn] = []
    held = 0
    for row in reversed(_rows(device, conversation, input_index)):
        if limit is not None and held >= limit:
            break
        turn = turn_of(device, row, result_cap)
        held += _held(turn)
        turns.append(turn)
    turns.reverse()
    return turns


def revision_before(device: Device, conversation: str, input_index: int, result_cap: int,
                    budget_tokens: int | None = None) -> int | None:
    """``recorded_revision(before(...))`` from the receipts, without reading the texts
    and outputs of leased turns: the newest leased input inside the same window, or
    None.  Only the turns newer than it that were never leased (cancelled, failed or
    interrupted before their lease, or leased in the same round) are read, since
    their bytes decide whether the window reaches it (docs/decisions.md, "The lease
    revision reads receipts")."""
    limit = _limit(budget_tokens)
    held = 0
    for row in reversed(_rows(device, conversation, input_index)):
        if limit is not None and held >= limit:
            return None
        if row.leased:
            return row.lease_revision
        held += _held(turn_of(device, row, result_cap))
    return None
