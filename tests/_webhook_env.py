"""Test helpers for webhooks: a real consumer (hypercorn on loopback, HTTPS with a
trustme test CA) that checks every post's signature with PyNaCl and records what it
accepted, and synthetic events appended through the store's real feed."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing
import trio
import trustme

from aotx_trio.identity import canonical, sha256_hex
from aotx_trio.registry.feed import operation_id
from aotx_trio.registry.records import rfc3339
from aotx_trio.registry.store import StoreBackend


@dataclass
class Receiver:
    public_key: str = ""
    #: status to answer the n-th post (0-based) with; 200 by default
    answer: Callable[[int, dict[str, Any]], int] = lambda n, body: 200
    posts: list[dict[str, Any]] = field(default_factory=list)     # every verified post
    accepted: list[str] = field(default_factory=list)             # op ids answered 2xx
    refused: int = 0                                               # bad signatures
    on_post: Callable[[dict[str, Any]], None] | None = None
    heads: list[dict[str, str]] = field(default_factory=list)
    #: how long each answer takes (a slow consumer)
    delay_s: float = 0.0
    #: (the URL's query, op id) of each 2xx: which subscription accepted what
    by_query: list[tuple[str, str]] = field(default_factory=list)

    def accepted_for(self, query_part: str) -> list[str]:
        return [op for q, op in self.by_query if query_part in q]

    def verify(self, headers: dict[str, str], raw: bytes) -> bool:
        ts, sig = headers.get("x-serving-timestamp"), headers.get("x-serving-signature")
        if ts is None or sig is None or abs(time.time() - int(ts)) > 300:
            return False
        try:
            nacl.signing.VerifyKey(bytes.fromhex(self.public_key)).verify(
                ts.encode() + b"." + raw, bytes.fromhex(sig.removeprefix("ed25519=")))
        except nacl.exceptions.BadSignatureError:
            return False
        return True

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return      # the sender died mid-post (a killed router): no post at all
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.heads.append(headers)
        if not self.verify(headers, raw):
            self.refused += 1
            status = 401
        else:
            body = json.loads(raw)
            status = self.answer(len(self.posts), body)
            self.posts.append(body)
            if self.delay_s:
                await trio.sleep(self.delay_s)
            if 200 <= status < 300:
                self.accepted.append(body["operation_id"])
                self.by_query.append((scope["query_string"].decode(), body["operation_id"]))
            if self.on_post is not None:
                self.on_post(body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def receiving(tmp_path: Path, receiver: Receiver, *, tls: bool = True,
                    ) -> AsyncIterator[tuple[str, str | None]]:
    """Serve ``receiver``; (its URL ``https://localhost:PORT/hook?token=...``, the CA
    file to trust) for the duration."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    hc = Config()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.graceful_timeout = 0.5
    ca_file: str | None = None
    if tls:
        ca = trustme.CA()
        cert = ca.issue_cert("localhost")
        cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        hc.certfile = hc.keyfile = str(tmp_path / "server.pem")
        ca_file = str(tmp_path / "ca.pem")
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            receiver.app, hc, shutdown_trigger=shutdown.wait, task_status=task_status))
        port = binds[0].rsplit(":", 1)[1]
        scheme = "https" if tls else "http"
        yield f"{scheme}://localhost:{port}/hook?token=SECRET-TOKEN", ca_file
        shutdown.set()


def append_events(store: StoreBackend, n: int, *, start: int = 0,
                  kind: str = "alias.moved") -> list[str]:
    """Append ``n`` events of ``kind`` through the store's feed; their operation ids."""
    ops = []
    for i in range(start, start + n):
        obj = sha256_hex(f"{kind}-{i}".encode())
        op = operation_id(kind, f"a/{i}", obj)
        now = time.time()
        event = {"type": kind, "subject": f"a/{i}", "at": rfc3339(now), "object_sha256": obj,
                 "operation_id": op, "payload": {"target": f"m/{i}", "level": 1}}
        assert store.feed_append(canonical(event), op, now) is not None
        ops.append(op)
    return ops


def first_seen(ops: list[str]) -> list[str]:
    return list(dict.fromkeys(ops))
