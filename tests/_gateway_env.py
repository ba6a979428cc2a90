"""Test helpers for the runtime and gateway tests: a tiny shared runtime file, a
gateway configuration with fresh tokens, its grant file, and an embedded
runtime + app in one trio nursery (the same wiring as ``aotx serve``), either
behind Quart's test client (:func:`embedded`) or served by a real hypercorn on
a loopback port (:func:`served`)."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import synth_gguf as sg
import trio
from quart_trio import QuartTrio

from aotx_trio.config import GatewayConfig, write_gateway_config
from aotx_trio.gateway.app import make_app_from_config
from aotx_trio.gateway.auth import hash_token
from aotx_trio.grants import write_grants
from aotx_trio.runtime import boot, pack
from aotx_trio.runtime.handler import ServiceHandler
from aotx_trio.service.client import InProcessClient

ALL = ("shared_read", "shared_write", "shared_manage")
SCHEMA = "aotx.shared.mutation.v1"
LINEAGE = "0123456789abcdef0123456789abcdef"


TINY_MODEL = "tiny.gguf"
# A real (random-weight) Gemma 3 GGUF small enough to load in milliseconds.
TINY = sg.Spec(d_model=64, n_layers=2, d_ff=128, n_heads=2, n_kv_heads=1, head_dim=32,
               window=8, n_vocab=256, types=(sg.Q.F32,), embd_type=sg.Q.F32)


def make_runtime_file(folder: Path, lineage: str = LINEAGE, spec: sg.Spec = TINY) -> Path:
    """A shared runtime file from a tiny synthetic GGUF (the runtime loads and runs it;
    ``spec``: another one, still named TINY_MODEL) and a stub embedding folder (not
    loaded yet)."""
    folder.mkdir(parents=True, exist_ok=True)
    gguf = sg.write_model(folder / TINY_MODEL, spec)
    emb = folder / "embedding"
    emb.mkdir(exist_ok=True)
    (emb / "config.json").write_text("{}")
    (emb / "tokenizer.json").write_text("{}")
    (emb / "model.safetensors").write_bytes(bytes(16))
    target = folder / "runtime.aotxccir"
    pack.pack(target, models=[gguf], embedding=emb, shared=True, lineage=lineage,
              progress=False)
    return target


def token_for(name: str) -> str:
    return f"token-{name}-0123456789abcdef"


def make_config(folder: Path, principals: Mapping[str, Sequence[str]], *,
                socket: Path | None = None, max_body_bytes: int | None = None,
                bind: str = "127.0.0.1:0", limits: Mapping[str, Any] | None = None,
                ) -> tuple[Path, GatewayConfig]:
    limits = dict(limits or {})
    if max_body_bytes is not None:
        limits["max_body_bytes"] = max_body_bytes
    cfg = GatewayConfig.model_validate({
        "bind": bind,
        "service_socket": str(socket) if socket is not None else None,
        "principals": [{"name": n, "token_sha256": hash_token(token_for(n)),
                        "actions": list(a)} for n, a in principals.items()],
        "limits": limits,
    })
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gateway.json"
    write_gateway_config(path, cfg)
    write_grants(cfg, folder / "grants")
    return path, cfg


def short_dir() -> Path:
    """A fresh folder with a short path (AF_UNIX socket paths are limited to 107 bytes);
    the caller removes it."""
    return Path(tempfile.mkdtemp(prefix="aotx-t-", dir="/tmp"))


@dataclass
class Env:
    app: QuartTrio
    client: Any               # quart test client
    handler: ServiceHandler
    lineage: str
    folder: Path

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token_for(name)}"}

    def body(self, key: int, sequence: int, **fields: Any) -> dict[str, Any]:
        return {"schema": SCHEMA, "lineage": self.lineage,
                "operation_key": f"{key:032x}", "sequence": str(sequence), **fields}

    def par(self, name: str) -> str:
        from aotx_trio.vocab import principal_key
        return f"par-{self.lineage}-{principal_key(name)}"


@contextlib.asynccontextmanager
async def embedded(tmp_path: Path, principals: Mapping[str, Sequence[str]], *,
                   deployed: Mapping[str, Sequence[str]] | None = None,
                   max_body_bytes: int | None = None,
                   ccir: Path | None = None, folder: Path | None = None,
                   ) -> AsyncIterator[Env]:
    """Runtime + app in one nursery over a fresh journal (or, with ``folder``, the
    journal kept there: a restart; the caller removes it); ``deployed`` overrides the
    grant file's actions."""
    keep = folder is not None
    folder = folder or short_dir()
    try:
        if ccir is None:
            ccir = make_runtime_file(tmp_path / "rt")
        _, cfg = make_config(folder, principals, max_body_bytes=max_body_bytes)
        if deployed is not None:
            _, dep = make_config(folder / "dep", deployed)
            write_grants(dep, folder / "grants")
        async with trio.open_nursery() as nursery:
            handler = await nursery.start(boot.run_runtime, ccir, folder / "journal",
                                          folder / "grants")
            app = make_app_from_config(cfg, InProcessClient(handler))
            async with app.test_app() as test_app:
                yield Env(app, test_app.test_client(), handler, handler.lineage, folder)
            nursery.cancel_scope.cancel()
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def json_of(text: str) -> Any:
    return json.loads(text)


@dataclass
class Served:
    url: str                  # "http://127.0.0.1:<port>"
    app: QuartTrio
    handler: ServiceHandler
    lineage: str


@contextlib.asynccontextmanager
async def hypercorn_on(app: Any, cfg: GatewayConfig) -> AsyncIterator[str]:
    """``app`` served by hypercorn (trio worker, the gateway's own hypercorn settings) on
    ``cfg``'s bind for the block: its URL; then a graceful shutdown."""
    from hypercorn.trio import serve as hypercorn_serve

    from aotx_trio.gateway.serve import hypercorn_config

    shutdown, stopped = trio.Event(), trio.Event()

    async def http(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await hypercorn_serve(app, hypercorn_config(cfg, app), shutdown_trigger=shutdown.wait,
                                  task_status=task_status)
        finally:
            stopped.set()

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(http)
        yield binds[0]
        shutdown.set()
        await stopped.wait()
        nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def served(tmp_path: Path, principals: Mapping[str, Sequence[str]], *,
                 fast_mutations: bool = True, max_body_bytes: int | None = None,
                 ccir: Path | None = None, limits: Mapping[str, Any] | None = None,
                 socket: bool = False) -> AsyncIterator[Served]:
    """Runtime + app over a fresh journal, served by hypercorn on a free loopback port
    (:func:`hypercorn_on`); ``fast_mutations`` as in
    :func:`aotx_trio.gateway.app.create_app`; ``limits`` are gateway.json's; ``socket``:
    the gateway reaches the runtime through its service socket (a SocketClient: streams
    ride its push frames), as ``aotx gateway serve`` does; the runtime takes the
    ``limits.journal_*`` of ``limits``, as in ``aotx serve``.  Shut down gracefully on exit
    (the gateway before the runtime)."""
    from aotx_trio.runtime.socket_server import SOCKET_NAME
    from aotx_trio.service.client import DeviceClient, SocketClient

    folder = short_dir()
    try:
        if ccir is None:
            ccir = make_runtime_file(tmp_path / "rt")
        _, cfg = make_config(folder, principals, max_body_bytes=max_body_bytes,
                             limits=limits)
        async with trio.open_nursery() as nursery:
            handler = await nursery.start(functools.partial(
                boot.run_runtime, ccir, folder / "journal", folder / "grants",
                journal_limits=boot.JournalLimits.of(cfg.limits)))
            client: DeviceClient = InProcessClient(handler)
            if socket:
                client = SocketClient(str(folder / "journal" / SOCKET_NAME), connect_timeout=5)
            app = make_app_from_config(cfg, client, fast_mutations=fast_mutations)
            async with hypercorn_on(app, cfg) as url:
                yield Served(url, app, handler, handler.lineage)
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

