"""The C device against a small pure-Python model of the spec (hypothesis stateful).

The model knows the spec's rules (sequences, canonical comparison, retry floor,
retirement, rights per scope with member rows and grants, capacities, journal
hold) and the documented operation-id derivation; the state machine drives
both with the same mutations and compares every answer and the whole visible
state after every step, including after a restart that replays the journal.

Capacities come from the loaded library, so the same machine also runs
against the small-capacity build (tests/test_device.py runs it in a child).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from aotx_trio import errors
from aotx_trio.native import device as D
from aotx_trio.native import lib as native
from aotx_trio.native.journal import JournalReader
from aotx_trio.native.lib import ffi, lib

LINEAGE = "0123456789abcdef0123456789abcdef"
OTHER_LINEAGE = "f" * 32
PRINCIPALS = ("a1" * 16, "b2" * 16, "c3" * 16)
CAPS = native.capacities()
M64 = (1 << 64) - 1
TERMINAL = ("succeeded", "failed", "cancelled", "interrupted", "deadline_exceeded")
NOBODY = "00" * 15 + "99"


# ---- the journal, driven by the test (the test is the emitter) ----------


class Journal:
    def __init__(self) -> None:
        p = ffi.new("aotx_journal_params *")
        lib.aotx_journal_default_params(p)
        ffi.memmove(p.lineage, bytes.fromhex(LINEAGE), 16)
        p.file_incarnation = 0x1234
        out = ffi.new("aotx_journal **")
        native.check(lib.aotx_journal_new(p, out))
        self.handle = ffi.gc(out[0], lib.aotx_journal_free)

    def header(self) -> bytes:
        buf = ffi.new("uint8_t[64]")
        n = lib.aotx_journal_header_encode(self.handle, buf, 64)
        assert n == 64
        return bytes(buf)

    def save_into(self, file: bytearray) -> None:
        """Drain every pending record, write it at its offset, ack."""
        buf = ffi.new("uint8_t[]", 192 * 16)
        first = ffi.new("uint64_t *")
        while True:
            n = lib.aotx_journal_drain(self.handle, buf, 192 * 16, 16, first)
            assert n >= 0
            if n == 0:
                return
            off = 64 + first[0] * 192
            if len(file) < off:
                file.extend(b"\0" * (off - len(file)))
            file[off:off + n] = bytes(ffi.buffer(buf, n))
            native.check(lib.aotx_journal_ack(self.handle))

    def set_hold(self, on: bool) -> None:
        lib.aotx_journal_set_hold(self.handle, 2, 1 if on else 0)


def recover(file: bytes) -> tuple[Journal, D.Device, Any]:
    j = Journal()
    dev = D.Device(j, LINEAGE)
    reader = JournalReader(file)
    dev.recover(reader)
    native.check(lib.aotx_journal_begin_boot(j.handle, ffi.NULL))
    return j, dev, reader


# ---- the model -----------------------------------------------------------


def mix64(z: int) -> int:
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def model_op_id(n: int) -> str:
    lb = bytes.fromhex(LINEAGE)
    l0, l1 = int.from_bytes(lb[:8], "little"), int.from_bytes(lb[8:], "little")
    return (mix64(n ^ l0).to_bytes(8, "little")
            + mix64(n ^ l1 ^ 0x6F705F69645F7631).to_bytes(8, "little")).hex()


def canon_len(req: D.Request) -> int:
    body = {D.Kind.REGISTER: 0, D.Kind.SPACE_CREATE: 24, D.Kind.MEMBER_SET: 40,
            D.Kind.CONVERSATION_CREATE: 32, D.Kind.CANCEL: 8, D.Kind.RETIRE: 8}
    if req.kind == D.Kind.INPUT:
        text = req.text.encode() if isinstance(req.text, str) else req.text
        return 48 + 48 + 33 * len(req.media) + len(req.model) + len(text)
    return 48 + body[req.kind]


def norm(req: D.Request) -> tuple[Any, ...]:
    """What the canonical bytes say (defaults and the omitted id resolved)."""
    head = (req.kind, req.lineage, req.operation_key, req.sequence)
    ident = req.id if req.id is not None else req.operation_key
    if req.kind == D.Kind.SPACE_CREATE:
        return (*head, ident, req.scope)
    if req.kind == D.Kind.MEMBER_SET:
        return (*head, req.space, req.participant, D.rights_mask(req.permissions))
    if req.kind == D.Kind.CONVERSATION_CREATE:
        return (*head, req.space, ident)
    if req.kind == D.Kind.INPUT:
        return (*head, req.conversation, req.text, req.model, req.max_output_tokens, req.pages,
                req.temperature + 0.0, req.top_p, req.media)
    if req.kind == D.Kind.CANCEL:
        return (*head, req.target_sequence)
    if req.kind == D.Kind.RETIRE:
        return (*head, req.retry_floor)
    return head


@dataclass
class MReceipt:
    actor: str
    sequence: int
    kind: D.Kind
    key: str
    op_id: str
    norm: tuple[Any, ...]
    status: str
    resource: str
    result: bytes
    admission_saved: bool = False
    terminal_saved: bool = False
    retiring: bool = False
    cancel_requested: bool = False


class Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def rid(prefix: str, ident: str) -> str:
    return f"{prefix}-{LINEAGE}-{ident}"


class Model:
    def __init__(self) -> None:
        self.parts: dict[str, list[int]] = {}          # key -> [next, floor]
        self.spaces: dict[str, tuple[str, str]] = {}   # id -> (owner, scope), creation order
        self.members: dict[tuple[str, str], int] = {}  # (space, key) -> rights
        self.convs: dict[str, list[Any]] = {}          # id -> [space, creator, inputs]
        self.receipts: list[MReceipt] = []             # occupied slots (retiring included)
        self.admissions = 0
        self.hold = False

    # -- rights --
    def resolved(self, space: str, key: str) -> int:
        if key not in self.parts:
            return 0
        if (space, key) in self.members:
            return self.members[(space, key)]
        owner, scope = self.spaces[space]
        if owner == key:
            return 7
        return 3 if scope == "instance" else 0

    def live(self, actor: str) -> list[MReceipt]:
        return [r for r in self.receipts if r.actor == actor and not r.retiring]

    def by_op(self, op_id: str) -> MReceipt | None:
        for r in self.receipts:
            if r.op_id == op_id and not r.retiring:
                return r
        return None

    def _space_access(self, grants: int, actor: str, space: str | None, need: int,
                      not_found: str) -> None:
        if space is None or space not in self.spaces:
            raise Refused(not_found)
        res = self.resolved(space, actor)
        if res == 0:
            raise Refused(not_found)
        if res & grants & need != need:
            raise Refused("forbidden")

    # -- submit --
    def submit(self, grants: int, actor: str, req: D.Request) -> tuple[MReceipt, bool]:
        if req.operation_key == "0" * 32:
            raise Refused("operation_key_invalid")
        if canon_len(req) > CAPS["command_bytes"]:
            raise Refused("command_too_large")
        if req.lineage != LINEAGE:
            raise Refused("lineage_mismatch")
        if not grants & 2:
            raise Refused("grant_forbidden")
        p = self.parts.get(actor)
        nxt, floor = (p[0], p[1]) if p else (1, 1)
        if req.sequence < floor:
            raise Refused("below_retry_floor")
        if req.sequence > nxt:
            raise Refused("future_sequence")
        if req.sequence < nxt:
            (r,) = [r for r in self.live(actor) if r.sequence == req.sequence]
            if r.norm != norm(req):
                raise Refused("sequence_conflict")
            return r, True
        if req.kind == D.Kind.REGISTER:
            if p:
                raise Refused("registration_conflict")
        elif not p:
            raise Refused("participant_not_found")
        if any(r.key == req.operation_key for r in self.live(actor)):
            raise Refused("operation_key_conflict")
        freed = self._check_kind(grants, actor, req)
        n = len(self.receipts)
        if not (n < CAPS["receipts"] or (req.kind == D.Kind.RETIRE and freed > 0
                                         and n < CAPS["receipts"] + 1)):
            raise Refused("receipt_table_full")
        if self.hold:
            raise Refused("journal_hold")
        return self._apply(actor, req), False

    def _check_kind(self, grants: int, actor: str, req: D.Request) -> int:
        k = req.kind
        ident = req.id if req.id is not None else req.operation_key
        if k == D.Kind.REGISTER and len(self.parts) >= CAPS["participants"]:
            raise Refused("participants_full")
        if k == D.Kind.SPACE_CREATE:
            if ident in self.spaces:
                raise Refused("space_id_conflict")
            if len(self.spaces) >= CAPS["spaces"]:
                raise Refused("spaces_full")
        if k == D.Kind.MEMBER_SET:
            self._space_access(grants, actor, req.space, 4, "space_not_found")
            assert req.participant is not None and req.space is not None
            # a row may name an unregistered key: it applies once that key registers
            if req.participant == self.spaces[req.space][0] != actor:
                raise Refused("forbidden")        # the owner's rights are the owner's
            if ((req.space, req.participant) not in self.members
                    and len(self.members) >= CAPS["members"]):
                raise Refused("members_full")
        if k == D.Kind.CONVERSATION_CREATE:
            self._space_access(grants, actor, req.space, 2, "space_not_found")
            if ident in self.convs:
                raise Refused("conversation_id_conflict")
            if len(self.convs) >= CAPS["conversations"]:
                raise Refused("conversations_full")
        if k == D.Kind.INPUT:
            conv = self.convs.get(req.conversation or "")
            self._space_access(grants, actor, conv[0] if conv else None, 2,
                               "conversation_not_found")
        if k == D.Kind.CANCEL:
            if req.target_sequence >= req.sequence or not any(
                    r.sequence == req.target_sequence for r in self.live(actor)):
                raise Refused("target_not_found")
        freed = 0
        if k == D.Kind.RETIRE:
            if req.retry_floor > req.sequence or req.retry_floor < self.parts[actor][1]:
                raise Refused("retry_floor_invalid")
            for r in self.live(actor):
                if r.sequence < req.retry_floor:
                    if not r.terminal_saved:
                        raise Refused("retirement_blocked")
                    freed += 1
        return freed

    def _result(self, actor: str, req: D.Request, ident: str, was_running: bool) -> bytes:
        k = req.kind
        if k == D.Kind.REGISTER:
            return f'{{"participant":"{rid("par", actor)}"}}'.encode()
        if k == D.Kind.SPACE_CREATE:
            return f'{{"space":"{rid("spc", ident)}","scope":"{req.scope}"}}'.encode()
        if k == D.Kind.MEMBER_SET:
            perms = ",".join(f'"{n}"' for n in D.rights_names(D.rights_mask(req.permissions)))
            return (f'{{"space":"{rid("spc", req.space or "")}","participant":'
                    f'"{rid("par", req.participant or "")}","permissions":[{perms}]}}').encode()
        if k == D.Kind.CONVERSATION_CREATE:
            return (f'{{"conversation":"{rid("con", ident)}",'
                    f'"space":"{rid("spc", req.space or "")}"}}').encode()
        if k == D.Kind.CANCEL:
            flag = "true" if was_running else "false"
            return (f'{{"target_sequence":"{req.target_sequence}",'
                    f'"cancel_requested":{flag}}}').encode()
        if k == D.Kind.RETIRE:
            return f'{{"retry_floor":"{req.retry_floor}"}}'.encode()
        return b""

    def _apply(self, actor: str, req: D.Request) -> MReceipt:
        self.admissions += 1
        k = req.kind
        ident = req.id if req.id is not None else req.operation_key
        resource = ident if k in (D.Kind.SPACE_CREATE, D.Kind.CONVERSATION_CREATE) else "0" * 32
        was_running = False
        if k == D.Kind.REGISTER:
            self.parts[actor] = [1, 1]
            resource = actor
        elif k == D.Kind.SPACE_CREATE:
            self.spaces[ident] = (actor, req.scope)
        elif k == D.Kind.MEMBER_SET:
            assert req.space is not None and req.participant is not None
            self.members[(req.space, req.participant)] = D.rights_mask(req.permissions)
            resource = req.space
        elif k == D.Kind.CONVERSATION_CREATE:
            self.convs[ident] = [req.space, actor, 0]
        elif k == D.Kind.INPUT:
            assert req.conversation is not None
            self.convs[req.conversation][2] += 1
            resource = req.conversation
        elif k == D.Kind.CANCEL:
            (t,) = [r for r in self.live(actor) if r.sequence == req.target_sequence]
            was_running = t.status not in TERMINAL
            t.cancel_requested = t.cancel_requested or was_running
            resource = t.op_id
        elif k == D.Kind.RETIRE:
            for r in self.live(actor):
                if r.sequence < req.retry_floor:
                    r.retiring = True
            self.parts[actor][1] = req.retry_floor
        r = MReceipt(actor=actor, sequence=req.sequence, kind=k, key=req.operation_key,
                     op_id=model_op_id(self.admissions), norm=norm(req),
                     status="admitted" if k == D.Kind.INPUT else "succeeded",
                     resource=resource, result=self._result(actor, req, ident, was_running))
        self.receipts.append(r)
        self.parts[actor][0] = req.sequence + 1
        return r

    def complete(self, op_id: str, status: str, result: bytes) -> None:
        r = self.by_op(op_id)
        if r is None:
            raise Refused("operation_not_found")
        if status not in TERMINAL:
            raise Refused("status_invalid")
        if r.status in TERMINAL:
            raise Refused("already_terminal")
        if len(result) > CAPS["result_bytes"]:
            raise Refused("result_too_large")
        if self.hold:
            raise Refused("journal_hold")
        r.status = status
        r.result = result

    def save(self) -> None:
        for r in self.receipts:
            r.admission_saved = True
            r.terminal_saved = r.status in TERMINAL
        self.receipts = [r for r in self.receipts if not r.retiring]

    def restart(self) -> None:
        self.save()
        self.hold = False
        for r in self.receipts:
            if r.status not in TERMINAL:
                r.status = "interrupted"
                r.result = b""
                r.terminal_saved = False


# ---- the state machine ---------------------------------------------------


def changed_field(req: D.Request) -> D.Request:
    """The same operation with its last kind-specific field changed."""
    k = req.kind
    if k == D.Kind.SPACE_CREATE:
        return dataclasses.replace(req, scope=D.SCOPES[(D.SCOPES.index(req.scope) + 1) % 3])
    if k == D.Kind.MEMBER_SET:
        mask = D.rights_mask(req.permissions) ^ 1
        return dataclasses.replace(req, permissions=D.rights_names(mask))
    if k == D.Kind.CONVERSATION_CREATE:
        return dataclasses.replace(req, id="8" * 32)
    if k == D.Kind.INPUT:
        text = req.text if isinstance(req.text, str) else req.text.decode()
        return dataclasses.replace(req, text=text[:-1] + ("!" if text[-1:] != "!" else "?"))
    if k == D.Kind.CANCEL:
        return dataclasses.replace(req, target_sequence=req.target_sequence + 1)
    if k == D.Kind.RETIRE:
        return dataclasses.replace(req, retry_floor=req.retry_floor + 1)
    return dataclasses.replace(req, operation_key="e" * 32)


principal = st.integers(min_value=0, max_value=1 << 16)
grants_st = st.sampled_from([7, 7, 7, 7, 7, 7, 3, 1, 5])
pick = st.integers(min_value=0, max_value=1 << 16)


class DeviceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.journal = Journal()
        self.file = bytearray(self.journal.header())
        self.dev = D.Device(self.journal, LINEAGE)
        self.keep: Any = None
        self.keys = 0
        self.history: list[tuple[str, D.Request]] = []

    # -- helpers --
    def fresh_key(self) -> str:
        self.keys += 1
        return f"{self.keys:032x}"

    def key_for(self, actor: str, choice: int) -> str:
        """Mostly fresh keys; sometimes one the actor used before (conflict / reuse)."""
        mine = [r.operation_key for a, r in self.history if a == actor]
        if mine and choice % 5 == 0:
            return mine[choice % len(mine)]
        return self.fresh_key()

    def who(self, choice: int) -> str:
        """Mostly a registered principal; sometimes any (participant_not_found)."""
        registered = [p for p in PRINCIPALS if p in self.model.parts]
        if registered and choice % 8 != 7:
            return registered[choice // 8 % len(registered)]
        return PRINCIPALS[choice % len(PRINCIPALS)]

    def next_seq(self, actor: str) -> int:
        p = self.model.parts.get(actor)
        return p[0] if p else 1

    def both(self, grants: int, actor: str, req: D.Request) -> None:
        try:
            expected, retry = self.model.submit(grants, actor, req)
        except Refused as exc:
            with pytest.raises(errors.AotxError) as info:
                self.dev.submit(grants, actor, req)
            assert info.value.native == exc.code, (req, info.value.native, exc.code)
            return
        got = self.dev.submit(grants, actor, req)
        assert got.retry == retry
        assert got.op_id == expected.op_id
        assert got.sequence == expected.sequence
        assert got.status == expected.status
        if not retry:
            self.history.append((actor, req))

    def space_choice(self, actor: str, choice: int) -> str:
        """Mostly a space the actor has some right on; sometimes any, or none."""
        seen = [sid for sid in self.model.spaces if self.model.resolved(sid, actor)]
        every = list(self.model.spaces)
        if seen and choice % 6 < 4:
            return seen[choice // 6 % len(seen)]
        if every and choice % 6 == 4:
            return every[choice // 6 % len(every)]
        return NOBODY

    def conv_choice(self, actor: str, choice: int) -> str:
        seen = [cid for cid, v in self.model.convs.items() if self.model.resolved(v[0], actor)]
        every = list(self.model.convs)
        if seen and choice % 6 < 4:
            return seen[choice // 6 % len(seen)]
        if every and choice % 6 == 4:
            return every[choice // 6 % len(every)]
        return NOBODY

    @initialize()
    def two_registered(self) -> None:
        for actor in PRINCIPALS[:2]:
            self.both(7, actor, D.Request(D.Kind.REGISTER, LINEAGE, self.fresh_key(), 1))
        a = PRINCIPALS[0]
        self.both(7, a, D.Request(D.Kind.SPACE_CREATE, LINEAGE, self.fresh_key(), 2,
                                  id="4" * 32, scope="instance"))
        self.both(7, a, D.Request(D.Kind.CONVERSATION_CREATE, LINEAGE, self.fresh_key(), 3,
                                  space="4" * 32))

    # -- rules --
    @rule(a=principal, grants=grants_st)
    def register(self, a: int, grants: int) -> None:
        actor = self.who(a)
        self.both(grants, actor, D.Request(D.Kind.REGISTER, LINEAGE, self.fresh_key(),
                                           self.next_seq(actor)))

    @rule(a=principal, grants=grants_st, scope=st.sampled_from(D.SCOPES),
          ident=st.sampled_from([None, None, "5" * 32, "6" * 32]), k=pick)
    def create_space(self, a: int, grants: int, scope: str, ident: str | None,
                     k: int) -> None:
        actor = self.who(a)
        self.both(grants, actor, D.Request(D.Kind.SPACE_CREATE, LINEAGE, self.key_for(actor, k),
                                           self.next_seq(actor), id=ident, scope=scope))

    @rule(a=principal, grants=grants_st, s=pick, who=principal,
          perms=st.sampled_from([(), ("read",), ("read", "write"), ("write", "manage"),
                                 ("read", "write", "manage")]))
    def member_set(self, a: int, grants: int, s: int, who: int,
                   perms: tuple[str, ...]) -> None:
        actor = self.who(a)
        self.both(grants, actor, D.Request(D.Kind.MEMBER_SET, LINEAGE, self.fresh_key(),
                                           self.next_seq(actor), space=self.space_choice(actor, s),
                                           participant=PRINCIPALS[who % 3], permissions=perms))

    @rule(a=principal, grants=grants_st, s=pick,
          ident=st.sampled_from([None, None, "7" * 32]))
    def create_conversation(self, a: int, grants: int, s: int, ident: str | None) -> None:
        actor = self.who(a)
        self.both(grants, actor, D.Request(D.Kind.CONVERSATION_CREATE, LINEAGE, self.fresh_key(),
                                           self.next_seq(actor), space=self.space_choice(actor, s),
                                           id=ident))

    @rule(a=principal, grants=grants_st, c=pick,
          text=st.sampled_from(["hello", "", "ü" * 60, "x" * 300]),
          media=st.sampled_from([(), (("image", "ab" * 32),)]))
    def submit_input(self, a: int, grants: int, c: int, text: str,
                     media: tuple[tuple[str, str], ...]) -> None:
        actor = self.who(a)
        if not text and not media:
            text = "hi"
        conv = self.conv_choice(actor, c)
        self.both(grants, actor, D.Request(D.Kind.INPUT, LINEAGE, self.fresh_key(),
                                           self.next_seq(actor), conversation=conv,
                                           text=text, model="gemma-3-270m", media=media))

    @rule(pickr=pick, status=st.sampled_from([*TERMINAL, "running"]),
          big=st.booleans())
    def complete(self, pickr: int, status: str, big: bool) -> None:
        inputs = [r for r in self.model.receipts if r.kind == D.Kind.INPUT and not r.retiring]
        op = inputs[pickr % len(inputs)].op_id if inputs else NOBODY
        result = b"r" * (CAPS["result_bytes"] + 1 if big and pickr % 3 == 0 else 20)
        try:
            self.model.complete(op, status, result)
        except Refused as exc:
            with pytest.raises(errors.AotxError) as info:
                self.dev.complete(op, status, result, 3, 4)
            assert info.value.native == exc.code
            return
        self.dev.complete(op, status, result, 3, 4)

    @rule(a=principal, back=st.integers(0, 4))
    def cancel(self, a: int, back: int) -> None:
        actor = self.who(a)
        seq = self.next_seq(actor)
        self.both(7, actor, D.Request(D.Kind.CANCEL, LINEAGE, self.fresh_key(), seq,
                                      target_sequence=max(1, seq - back)))

    @rule(a=principal, back=st.integers(0, 6))
    def retire(self, a: int, back: int) -> None:
        actor = self.who(a)
        seq = self.next_seq(actor)
        self.both(7, actor, D.Request(D.Kind.RETIRE, LINEAGE, self.fresh_key(), seq,
                                      retry_floor=max(1, seq - back)))

    @precondition(lambda self: bool(self.history))
    @rule(pickr=pick, change=st.sampled_from(["none", "key", "field"]))
    def retry(self, pickr: int, change: str) -> None:
        actor, req = self.history[pickr % len(self.history)]
        if change == "key":
            req = dataclasses.replace(req, operation_key=self.fresh_key())
        elif change == "field":
            req = changed_field(req)
        self.both(7, actor, req)

    @rule(a=principal, ahead=st.integers(1, 3), lineage=st.booleans(), zero_key=st.booleans())
    def odd_sequence(self, a: int, ahead: int, lineage: bool, zero_key: bool) -> None:
        actor = self.who(a)
        p = self.model.parts.get(actor, [1, 1])
        seq = p[0] + ahead if ahead < 3 else p[1] - 1
        key = "0" * 32 if zero_key and ahead == 1 else self.fresh_key()
        self.both(7, actor, D.Request(D.Kind.REGISTER, OTHER_LINEAGE if lineage else LINEAGE,
                                      key, seq))

    @rule()
    def save(self) -> None:
        self.journal.save_into(self.file)
        self.model.save()

    @rule(a=principal)
    def hold(self, a: int) -> None:
        actor = self.who(a)
        self.journal.set_hold(True)
        self.model.hold = True
        self.both(7, actor, D.Request(D.Kind.SPACE_CREATE, LINEAGE, self.fresh_key(),
                                      self.next_seq(actor)))
        self.journal.set_hold(False)
        self.model.hold = False

    @rule()
    def restart(self) -> None:
        self.journal.save_into(self.file)
        self.dev.close()
        self.journal, self.dev, self.keep = recover(bytes(self.file))
        self.model.restart()

    # -- the whole visible state --
    @invariant()
    def same_state(self) -> None:
        m = self.model
        u = self.dev.usage()
        assert (u.participants, u.spaces, u.conversations, u.members, u.receipts,
                u.admissions) == (len(m.parts), len(m.spaces), len(m.convs), len(m.members),
                                  len(m.receipts), m.admissions)
        for actor in PRINCIPALS:
            part = self.dev.participant(7, actor)
            nxt, floor = m.parts.get(actor, [1, 1])
            assert (part.registered, part.next_sequence, part.retry_floor) == (
                actor in m.parts, nxt, floor)
            listed, _ = self.dev.spaces(7, actor, 0, 100)
            want = [(sid, o, sc) for sid, (o, sc) in m.spaces.items()
                    if m.resolved(sid, actor) & 1]
            assert [(s.id, s.owner, s.scope) for s in listed] == want
            for s in listed:
                assert D.rights_mask(s.rights) == m.resolved(s.id, actor)
                rows, _ = self.dev.members(7, actor, s.id, 0, 100)
                assert sorted((r.participant, D.rights_mask(r.rights)) for r in rows) == sorted(
                    (k, v) for (sp, k), v in m.members.items() if sp == s.id)
                convs, _ = self.dev.conversations(7, actor, s.id, 0, 100)
                assert [(c.id, c.inputs) for c in convs] == [
                    (cid, v[2]) for cid, v in m.convs.items() if v[0] == s.id]
        for r in m.receipts:
            if r.retiring:
                with pytest.raises(errors.NotFound):
                    self.dev.receipt(7, r.actor, r.op_id)
                continue
            got = self.dev.receipt(7, r.actor, r.op_id)
            assert (got.kind, got.sequence, got.operation_key, got.status, got.admission_saved,
                    got.terminal_saved, got.cancel_requested, got.resource_id) == (
                r.kind, r.sequence, r.key, r.status, r.admission_saved, r.terminal_saved,
                r.cancel_requested, r.resource), r
            data, total = self.dev.result(7, r.actor, r.op_id)
            assert data == r.result and total == len(r.result)

    def teardown(self) -> None:
        self.dev.close()


EXAMPLES = int(os.environ.get("AOTX_MODEL_EXAMPLES", "50"))
DeviceMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestDeviceModel = DeviceMachine.TestCase
