"""The runtime's service: the call handler and its Unix socket (<journal>/service.sock).

:class:`ServiceHandler` answers the calls of docs/formats/socket.md against
the device: it resolves the caller's principal to its deployment grants (the
grant file read at boot), intersects them with the actions the gateway
vouches for, passes that bitmask on every device call, waits for the journal
to save an admission before answering a new mutation, and renders device
records as the JSON resources of spec/shared-api.md.

:func:`serve_socket` serves any handler over the socket: each connection is
read frame by frame, each request runs in its own task (at most
``MAX_IN_FLIGHT`` per connection) and its response is written whole under a
per-connection lock, so responses may come back out of order.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import os
import re
import socket as _socket
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import trio

from aotx_trio import errors, wire
from aotx_trio.client import SavePending

log = logging.getLogger("aotx.service")

MAX_IN_FLIGHT = 256
SOCKET_NAME = "service.sock"

# Device grant bits (csrc/aotx_device.h) and the action names that select them.
GRANT_BITS: dict[str, int] = {"shared_read": 1, "shared_write": 2, "shared_manage": 4}


def grant_mask(actions: Sequence[str]) -> int:
    mask = 0
    for a in actions:
        mask |= GRANT_BITS.get(a, 0)
    return mask


class Handler(Protocol):
    async def call(self, method: str, params: dict[str, Any]) -> Any: ...


# --------------------------------------------------------------------------- socket


async def _listen_unix(path: Path) -> trio.SocketListener:
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise errors.ConfigError(f"{path} exists and is not a socket", path=str(path))
        try:
            probe = await trio.open_unix_socket(str(path))
        except OSError:
            path.unlink()
        else:
            await probe.aclose()
            raise errors.ConfigError(f"another runtime is listening on {path}", path=str(path))
    sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is rw for its owner only
    try:
        await sock.bind(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.ENAMETOOLONG or "too long" in str(exc):
            raise errors.ConfigError(f"socket path too long ({len(str(path))} bytes): {path}",
                                     path=str(path)) from exc
        raise
    finally:
        os.umask(old)
    sock.listen(128)
    return trio.SocketListener(sock)


async def _serve_connection(stream: trio.abc.Stream, handler: Handler) -> None:
    reader = wire.FrameReader(stream)
    send_lock = trio.Lock()
    slots = trio.Semaphore(MAX_IN_FLIGHT)

    async def reply(frame: dict[str, Any]) -> None:
        data = wire.encode_frame(frame)
        async with send_lock:
            with trio.CancelScope(shield=True):
                await stream.send_all(data)

    async def one(req: dict[str, Any]) -> None:
        req_id = req.get("id")
        try:
            method, params = req.get("method"), req.get("params", {})
            if not isinstance(req_id, int) or not isinstance(method, str) \
                    or not isinstance(params, dict):
                raise wire.FrameError("request needs an integer id, a string method and an "
                                      "object params")
            result = await handler.call(method, params)
            frame = wire.success(req_id, result)
        except errors.AotxError as exc:
            frame = wire.failure(req_id if isinstance(req_id, int) else 0, exc)
        except Exception as exc:  # a bug: report it to the caller and in the log
            log.exception("service call %r failed", req.get("method"))
            frame = wire.failure(req_id if isinstance(req_id, int) else 0, errors.AotxError(
                f"internal error: {type(exc).__name__}", code="internal_error"))
        finally:
            slots.release()
        try:
            await reply(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    try:
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    req = await reader.read()
                except wire.FrameError as exc:
                    with trio.move_on_after(1):
                        await reply(wire.failure(0, exc))
                    break
                if req is None:
                    break
                await slots.acquire()
                nursery.start_soon(one, req)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await stream.aclose()


async def serve_socket(path: str | os.PathLike[str], handler: Handler, *,
                       task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on ``path`` and answer calls with ``handler`` until cancelled; calls
    ``task_status.started(path)`` once the socket accepts connections and removes
    the socket file on the way out."""
    p = Path(path)
    listener = await _listen_unix(p)
    st = p.lstat()
    ours = (st.st_dev, st.st_ino, st.st_ctime_ns)
    try:
        async with trio.open_nursery() as nursery:
            async def conn(stream: trio.SocketStream) -> None:
                try:
                    await _serve_connection(stream, handler)
                except Exception:  # one connection's failure never stops the service
                    log.exception("service connection failed")

            await nursery.start(trio.serve_listeners, conn, [listener])
            task_status.started(p)
    finally:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await listener.aclose()
        try:  # only our own socket file: a successor may already listen at this path
            st = p.lstat()
            if (st.st_dev, st.st_ino, st.st_ctime_ns) == ours:
                p.unlink()
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- ids and rendering

KIND_CODES: dict[str, int] = {
    "participant.register": 1, "space.create": 2, "member.set": 3,
    "conversation.create": 4, "participant.retire": 7,
}
KIND_NAMES: dict[int, str] = {1: "participant.register", 2: "space.create", 3: "member.set",
                              4: "conversation.create", 5: "input", 6: "cancellation",
                              7: "participant.retire"}
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "interrupted", "deadline_exceeded"})
SCOPES = ("private", "room", "instance")
PERMISSIONS = ("read", "write", "manage")
# The resource a receipt's resource_id names, by kind.
RESOURCE_PREFIX: dict[int, str] = {1: "par", 2: "spc", 3: "spc", 4: "con", 5: "con"}
HOLD_REASONS = ((1, "file_cap"), (2, "disk"), (4, "pending_cap"))
ZERO16 = "0" * 32

_HEX32 = re.compile(r"[0-9a-f]{32}")


def principal_key(name: str) -> str:
    """The device's participant key: sha256(principal name)[:16], as 32 hex digits."""
    return hashlib.sha256(name.encode("utf-8")).digest()[:16].hex()


def format_id(prefix: str, lineage: str, ident: str) -> str:
    return f"{prefix}-{lineage}-{ident}"


def parse_id(prefix: str, text: Any, lineage: str, field: str) -> str:
    """The 32-hex id inside ``<prefix>-<lineage>-<hex32>``; a malformed id, or one
    of another lineage, names nothing here (404)."""
    if isinstance(text, str):
        parts = text.split("-")
        if len(parts) == 3 and parts[0] == prefix and parts[1] == lineage \
                and _HEX32.fullmatch(parts[2]):
            return parts[2]
    raise errors.NotFound(f"no such {field}: {text!r}", code=f"{field}_not_found", field=field)


def _hexstr(value: Any) -> str:
    return value.hex() if isinstance(value, bytes | bytearray) else str(value)


def render_save(save: Any) -> dict[str, Any]:
    err = int(save.disk_error)
    return {
        "source": "journal",
        "file_incarnation": f"{int(save.file_incarnation):016x}",
        "generation": str(int(save.generation)),
        "boot": str(int(save.boot)),
        "commit_digest": _hexstr(save.commit_digest),
        "saved_records": str(int(save.saved_records)),
        "pending_bytes": int(save.pending_bytes),
        "disk_error": None if err == 0 else {"errno": err,
                                             "name": errno.errorcode.get(err, str(err))},
        "hold": [name for bit, name in HOLD_REASONS if int(save.hold) & bit],
    }


def render_receipt_save(r: Any) -> dict[str, Any]:
    """A receipt's ``save``: the identity of the save that acknowledged its admission
    (``r.saved_by``: source, file incarnation, generation, boot, commit digest and the
    records it covers; frozen once saved, null before), and the journal's pending
    bytes, disk error and hold as read now."""
    out = render_save(r.save)
    ack = r.saved_by
    out.update({
        "file_incarnation": None if ack is None else f"{int(ack.file_incarnation):016x}",
        "generation": None if ack is None else str(int(ack.generation)),
        "boot": None if ack is None else str(int(ack.boot)),
        "commit_digest": None if ack is None else _hexstr(ack.commit_digest),
        "saved_records": None if ack is None else str(int(ack.commit_records)),
    })
    return out


def render_receipt(r: Any, lineage: str) -> dict[str, Any]:
    """A receipt (aotx_trio.device.Receipt) as the JSON of shared-api.md."""
    kind = int(r.kind)
    prefix = RESOURCE_PREFIX.get(kind)
    saved = int(r.save.saved_records)
    admission_saved = bool(r.admission_saved) or saved > int(r.admission_record)
    terminal_record = r.terminal_record
    terminal_saved = bool(r.terminal_saved) or (
        r.status in TERMINAL and terminal_record is not None and saved > int(terminal_record))
    return {
        "operation": format_id("op", lineage, r.op_id),
        "kind": KIND_NAMES.get(kind, str(kind)),
        "status": r.status,
        "participant": format_id("par", lineage, r.participant),
        "operation_key": r.operation_key,
        "sequence": None if r.sequence is None else str(r.sequence),
        "resource": format_id(prefix, lineage, r.resource_id)
        if prefix and r.resource_id != ZERO16 else None,
        "transport": {"accepted": True},
        "device": {"committed": bool(r.device_committed),
                   "admission_number": str(r.admission_number)},
        "admission": {"saved": admission_saved, "record": str(r.admission_record)},
        "terminal": {"saved": terminal_saved,
                     "record": None if terminal_record is None else str(terminal_record)},
        "cancel_requested": bool(r.cancel_requested),
        "result": {"bytes": int(r.result_len), "input_tokens": int(r.input_tokens),
                   "output_tokens": int(r.output_tokens)},
        "save": render_receipt_save(r),
    }


def render_space(v: Any, lineage: str) -> dict[str, Any]:
    return {
        "id": format_id("spc", lineage, v.id),
        "scope": v.scope,
        "owner": format_id("par", lineage, v.owner),
        "permissions": list(v.rights),
        "conversations": str(v.conversations),
        "admission_number": str(v.admission_number),
    }


def render_conversation(v: Any, lineage: str) -> dict[str, Any]:
    return {
        "id": format_id("con", lineage, v.id),
        "space": format_id("spc", lineage, v.space),
        "creator": format_id("par", lineage, v.creator),
        "inputs": str(v.inputs),
        "admission_number": str(v.admission_number),
    }


def _counter(value: int | None) -> str | None:
    return None if value is None else str(value)


def text_or_none(data: bytes) -> str | None:
    """The span as text only when it is complete UTF-8 (never replaced)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# --------------------------------------------------------------------------- the handler


class Saver(Protocol):
    """The journal emitter as the handler sees it."""

    def wake(self) -> None: ...
    async def wait_saved(self, record_index: int) -> None: ...


class GrantTable(Protocol):
    def actions_for(self, key: str | bytes) -> frozenset[str]: ...


READ_CHUNK = 65536
MAX_CACHED_PRINCIPALS = 4096


class ServiceHandler:
    """Answers service calls against one device (docs/formats/socket.md, "Methods").

    ``device`` is an :class:`aotx_trio.device.Device`; ``saver`` the journal
    emitter; ``save_state`` returns the journal's current save state."""

    def __init__(self, device: Any, saver: Saver, save_state: Callable[[], Any],
                 lineage: str, grants: GrantTable, *, models: Mapping[str, Any] | None = None,
                 save_timeout: float = 30.0) -> None:
        self.device = device
        self.saver = saver
        self.save_state = save_state
        self.lineage = lineage
        self.grants = grants
        self.models = dict(models or {})
        self.save_timeout = save_timeout
        self.state: Any = None  # the runtime's RuntimeState, set by boot (tests, tools)
        # principal name -> (device key, deployed actions) of the grant table self.grants
        self._principals: dict[str, tuple[str, frozenset[str]]] = {}
        self._principals_of: GrantTable = grants
        self._methods: dict[str, Callable[[Mapping[str, Any]], Awaitable[Any]]] = {
            "ping": self._ping,
            "capabilities": self._capabilities,
            "save_state": self._save_state,
            "participant.get": self._participant,
            "mutation.submit": self._submit,
            "space.get": self._space,
            "space.list": self._spaces,
            "member.list": self._members,
            "conversation.list": self._conversations,
            "conversation.get": self._conversation,
            "operation.get": self._operation,
            "operation.result": self._result,
        }

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        fn = self._methods.get(method)
        if fn is None:
            raise errors.NotFound(f"no service method {method!r}", code="method_not_found",
                                  method=method)
        return await fn(params)

    # -- callers ------------------------------------------------------------------
    def _caller(self, params: Mapping[str, Any]) -> tuple[int, str]:
        """(grant bitmask, principal key): the deployment grants of the principal,
        intersected with the actions the gateway vouches for on this call."""
        name = params.get("principal")
        actions = params.get("actions", [])
        if not isinstance(name, str) or not name or not isinstance(actions, list):
            raise errors.InvalidInput("call needs principal (string) and actions (list)",
                                      field="principal")
        if self._principals_of is not self.grants:   # a new grant table: forget
            self._principals, self._principals_of = {}, self.grants
        known = self._principals.get(name)
        if known is None:
            if len(self._principals) >= MAX_CACHED_PRINCIPALS:
                self._principals.clear()
            key = principal_key(name)
            known = self._principals[name] = (key, self.grants.actions_for(key))
        key, deployed = known
        return grant_mask([a for a in actions if a in deployed]), key

    @staticmethod
    def _cursor(params: Mapping[str, Any]) -> tuple[int, int]:
        cursor = params.get("cursor")
        limit = params.get("limit", 50)
        try:
            c = int(cursor) if cursor is not None else 0
        except (TypeError, ValueError):
            c = -1
        if c < 0 or c >= 1 << 64:
            raise errors.InvalidInput("cursor is not one this runtime returned", field="cursor")
        if not isinstance(limit, int) or not 1 <= limit <= 10000:
            raise errors.InvalidInput("limit must be an integer in 1..10000", field="limit")
        return c, limit

    # -- reads --------------------------------------------------------------------
    async def _ping(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"lineage": self.lineage}

    async def _capabilities(self, params: Mapping[str, Any]) -> dict[str, Any]:
        from aotx_trio import native

        caps = native.capacities()
        usage = self.device.usage()
        return {
            "lineage": self.lineage,
            "schema": "aotx.shared.mutation.v1",
            "capacities": {k: caps[k] for k in ("participants", "spaces", "conversations",
                                                 "members", "receipts")},
            "usage": {k: int(getattr(usage, k)) for k in (
                "participants", "spaces", "conversations", "members", "receipts")},
            "limits": {"command_bytes": caps["command_bytes"],
                       "result_bytes": caps["result_bytes"],
                       "max_text_bytes": 2048, "max_media": 8, "media_link_bytes": 73},
            "models": self.models,
            "features": {"inputs": False, "events": False, "cancellations": False,
                         "memory": False, "publications": False, "media": False},
            "save": render_save(self.save_state()),
        }

    async def _save_state(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return render_save(self.save_state())

    async def _participant(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        v = self.device.participant(grants, key, key)
        if not v.registered:
            return {"lineage": self.lineage, "participant": None,
                    "next_sequence": "1", "retry_floor": "0"}
        nxt, floor = _counter(v.next_sequence), _counter(v.retry_floor)
        return {"lineage": self.lineage,
                "participant": {"id": format_id("par", self.lineage, key),
                                "principal": params["principal"],
                                "next_sequence": nxt, "retry_floor": floor},
                "next_sequence": nxt, "retry_floor": floor}

    async def _space(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        space = parse_id("spc", params.get("space"), self.lineage, "space")
        return render_space(self.device.space(grants, key, space), self.lineage)

    async def _spaces(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        cursor, limit = self._cursor(params)
        rows, nxt = self.device.spaces(grants, key, cursor, limit)
        return {"items": [render_space(r, self.lineage) for r in rows],
                "next_cursor": str(nxt) if nxt else None}

    async def _members(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        space = parse_id("spc", params.get("space"), self.lineage, "space")
        cursor, limit = self._cursor(params)
        rows, nxt = self.device.members(grants, key, space, cursor, limit)
        items = []
        for r in rows:
            p = self.device.participant(grants, key, r.participant)
            items.append({
                "participant": format_id("par", self.lineage, r.participant),
                "permissions": list(r.rights),
                "next_sequence": _counter(p.next_sequence),
                "retry_floor": _counter(p.retry_floor),
            })
        return {"items": items, "next_cursor": str(nxt) if nxt else None}

    async def _conversations(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        space = parse_id("spc", params.get("space"), self.lineage, "space")
        cursor, limit = self._cursor(params)
        rows, nxt = self.device.conversations(grants, key, space, cursor, limit)
        return {"items": [render_conversation(r, self.lineage) for r in rows],
                "next_cursor": str(nxt) if nxt else None}

    async def _conversation(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        con = parse_id("con", params.get("conversation"), self.lineage, "conversation")
        return render_conversation(self.device.conversation(grants, key, con), self.lineage)

    async def _operation(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        op = parse_id("op", params.get("operation"), self.lineage, "operation")
        return render_receipt(self.device.receipt(grants, key, op), self.lineage)

    async def _result(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        op = parse_id("op", params.get("operation"), self.lineage, "operation")
        offset = params.get("offset", 0)
        if not isinstance(offset, int) or not 0 <= offset < 1 << 64:
            raise errors.InvalidInput("offset must be a non-negative byte offset",
                                      field="offset")
        receipt = self.device.receipt(grants, key, op)
        data, total = self.device.result(grants, key, op, offset, READ_CHUNK)
        return {
            "operation": format_id("op", self.lineage, op),
            "status": receipt.status,
            "offset": offset,
            "length": len(data),
            "data": base64.b64encode(data).decode("ascii"),
            "text": text_or_none(data),
            "next_offset": offset + len(data),
            "total": total,
            "finished": receipt.status in TERMINAL,
            "input_tokens": int(receipt.input_tokens),
            "output_tokens": int(receipt.output_tokens),
        }

    # -- mutations ----------------------------------------------------------------
    def build_request(self, kind: str, body: Mapping[str, Any]) -> Any:
        """The :class:`aotx_trio.device.Request` of a validated mutation body."""
        from aotx_trio.device import Kind, Request

        code = KIND_CODES.get(kind)
        if code is None:
            raise errors.InvalidInput(f"unknown mutation kind {kind!r}", field="kind")
        lineage = body.get("lineage")
        if lineage != self.lineage:
            raise errors.Conflict(f"lineage {lineage!r} is not this runtime's lineage "
                                  f"{self.lineage}", code="lineage_mismatch",
                                  field="lineage", expected=self.lineage)
        key, seq = body.get("operation_key"), body.get("sequence")
        if not isinstance(key, str) or not _HEX32.fullmatch(key) or not isinstance(seq, str) \
                or not seq.isdigit():
            raise errors.InvalidInput("operation_key and sequence are required",
                                      field="operation_key")
        fields: dict[str, Any] = {}
        if code in (2, 4):
            raw = body.get("id")
            prefix = "spc" if code == 2 else "con"
            if raw is None:
                fields["id"] = None
            elif isinstance(raw, str) and _HEX32.fullmatch(raw):
                fields["id"] = raw
            else:
                try:
                    fields["id"] = parse_id(prefix, raw, self.lineage, "id")
                except errors.NotFound:
                    raise errors.InvalidInput(
                        f"id must be 32 hex digits or {prefix}-{self.lineage}-<hex>",
                        field="id") from None
        if code == 2:
            scope = body.get("scope", "private")
            if scope not in SCOPES:
                raise errors.InvalidInput(f"unknown scope {scope!r}", field="scope")
            fields["scope"] = scope
        if code in (3, 4):
            fields["space"] = parse_id("spc", body.get("space"), self.lineage, "space")
        if code == 3:
            try:
                fields["participant"] = parse_id("par", body.get("participant"), self.lineage,
                                                 "participant")
            except errors.NotFound:
                raise errors.InvalidInput("participant must be par-<lineage>-<hex> of this "
                                          "runtime", field="participant") from None
            perms = body.get("permissions", [])
            if not isinstance(perms, list) or any(p not in PERMISSIONS for p in perms):
                raise errors.InvalidInput("permissions must list read, write or manage",
                                          field="permissions")
            fields["permissions"] = tuple(p for p in PERMISSIONS if p in perms)
        if code == 7:
            floor = body.get("retry_floor", "0")
            if not isinstance(floor, str) or not floor.isdigit():
                raise errors.InvalidInput("retry_floor must be a decimal string",
                                          field="retry_floor")
            fields["retry_floor"] = int(floor)
        return Request(kind=Kind(code), lineage=self.lineage, operation_key=key,
                       sequence=int(seq), **fields)

    async def _submit(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        kind = params.get("kind")
        body = params.get("body")
        if not isinstance(kind, str) or not isinstance(body, Mapping):
            raise errors.InvalidInput("mutation.submit needs kind and body", field="kind")
        req = self.build_request(kind, body)
        receipt = self.device.submit(grants, key, req)
        created = not receipt.retry
        self.saver.wake()
        with trio.move_on_after(self.save_timeout) as waited:
            await self.saver.wait_saved(int(receipt.admission_record))
        if waited.cancelled_caught:
            raise SavePending(
                f"operation admitted but not saved within {self.save_timeout:g} s; an exact "
                "retry answers with its receipt once it is saved",
                operation=format_id("op", self.lineage, receipt.op_id), retry_after=1)
        try:  # the receipt again, with the save state after the wait
            receipt = self.device.receipt(grants, key, receipt.op_id)
        except errors.AotxError:
            pass
        return {"receipt": render_receipt(receipt, self.lineage), "created": created}
