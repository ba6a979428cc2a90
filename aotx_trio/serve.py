"""``aotx serve``: the embedded default, runtime + gateway in one ``trio.run``.

The data folder (``--data``, default ``./aotx-data``)::

    runtime.aotxccir     the complete runtime file (packed from the default models
                         on first run when absent; an existing one is used as is)
    gateway.json         mode 0600; one principal "admin" with every action; only the
                         SHA-256 of its token is stored: the token is printed ONCE
    webhook-signing.key  the router's Ed25519 webhook key (mode 0600), created when
                         gateway.json names none (and recorded there as
                         ``webhooks.signing_key_file``)
    grants/grants.json   the deployment grant file, rewritten from gateway.json at
                         every start (after the journal folder's lock is taken: a
                         second ``aotx serve`` on the folder is refused before it
                         writes anything)
    journal/             journal.aotxj and service.sock (journal/models/: the embedding
                         model's files, extracted once from the runtime file)
    artifacts/           GGUF artifacts exported for on-demand loading (router.artifact_cache)
    registry/            the serving router's folder store (gateway.json ``store``
                         defaults to the data folder); on every start the default
                         models are registered if missing (``default/text``,
                         ``default/embedding``: aotx_trio.router.defaults)

Shutdown order on SIGINT/SIGTERM: hypercorn shuts down gracefully first, then
the runtime tree is cancelled (nothing is left running).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from pathlib import Path
from typing import Any

import trio

from aotx_trio import _latency
from aotx_trio._process import on_signal, run_trio, setup_logging
from aotx_trio.config import GatewayConfig, load_gateway_config, write_gateway_config
from aotx_trio.errors import AotxError
from aotx_trio.gateway.auth import hash_token, new_token
from aotx_trio.gateway.serve import serve_gateway
from aotx_trio.grants import load_grants, write_grants
from aotx_trio.runtime.boot import JournalLimits, run_runtime
from aotx_trio.runtime.ccir import RuntimeFile
from aotx_trio.runtime.handler import ServiceHandler
from aotx_trio.runtime.journal_file import journal_dir_locked
from aotx_trio.service.client import InProcessClient
from aotx_trio.vocab import ACTIONS

log = logging.getLogger("aotx.serve")

RUNTIME_NAME = "runtime.aotxccir"
CONFIG_NAME = "gateway.json"
KEY_NAME = "webhook-signing.key"
ADMIN = "admin"
ADMIN_ACTIONS = list(ACTIONS)


def ensure_runtime(data: Path) -> Path:
    """The data folder's runtime file, packed from the default models if missing."""
    target = data / RUNTIME_NAME
    if not target.exists():
        from aotx_trio.default_models import (
            default_chat_model,
            default_embedding_model,
            default_text_model,
        )
        from aotx_trio.runtime.pack import pack

        print(f"aotx serve: packing {target} from the default models (first run)",
              file=sys.stderr, flush=True)
        # SmolLM2 sorts first in the file: the runtime's first text model, default/text
        pack(target, models=[default_chat_model(), default_text_model()],
             embedding=default_embedding_model(), shared=True)
    return target


def ensure_config(data: Path, bind: str) -> tuple[GatewayConfig, str | None]:
    """gateway.json (created with a fresh admin token on first run) and the token,
    which is returned only when it was just made."""
    path = data / CONFIG_NAME
    token: str | None = None
    if not path.exists():
        token = new_token()
        config = GatewayConfig.model_validate({
            "bind": bind,
            "service_socket": None,
            "principals": [{"name": ADMIN, "token_sha256": hash_token(token),
                            "actions": ADMIN_ACTIONS}],
        })
        write_gateway_config(path, config)
    ensure_webhook_key(path)
    config = load_gateway_config(path)
    update: dict[str, Any] = {"bind": bind}
    if config.store is None:     # the embedded default: the folder store in the data folder
        update["store"] = str(data.resolve())
    if config.router.artifact_cache is None:   # GGUFs loaded on demand are exported here
        update["router"] = config.router.model_copy(
            update={"artifact_cache": (data / "artifacts").resolve()})
    return config.model_copy(update=update), token


def ensure_webhook_key(path: Path) -> None:
    """When ``gateway.json`` names no webhook signing key: create one next to it and
    record it there (the file's other keys kept as they are)."""
    import json

    from aotx_trio._fs import atomic_write_text
    from aotx_trio.webhooks.signing import create_key

    data = json.loads(path.read_text(encoding="utf-8"))
    hooks = data.setdefault("webhooks", {})
    if not isinstance(hooks, dict) or hooks.get("signing_key_file") is not None:
        return   # configured (or malformed: loading the file reports it)
    key = path.parent / KEY_NAME
    if not key.exists():
        create_key(key)
        log.info("created the webhook signing key %s", key)
    hooks["signing_key_file"] = KEY_NAME
    atomic_write_text(path, json.dumps(data, indent=2) + "\n", mode=0o600)


def model_sources(runtime: Path) -> dict[str, list[Any]]:
    """The runtime file's models as artifact files: text model name -> its one extent,
    ``embedding`` -> the embedding folder's files (aotx_trio.router.defaults.Extent)."""
    from aotx_trio.router.defaults import Extent
    from aotx_trio.runtime.served import EMBEDDING_NAME

    rf = RuntimeFile.open(runtime)
    out: dict[str, list[Any]] = {c.name: [Extent(c.name, rf.path, c.offset, c.length)]
                                 for c in rf.text_models}
    out[EMBEDDING_NAME] = [Extent(c.name, rf.path, c.offset, c.length)
                           for c in rf.embedding_files]
    return out


async def register_default_models(config: GatewayConfig, runtime: Path,
                                  handler: ServiceHandler) -> list[str]:
    """The default models in the configured store (idempotent; docs/decisions.md)."""
    from aotx_trio.config import is_store_url
    from aotx_trio.registry.backends import open_store
    from aotx_trio.router.defaults import register_defaults
    from aotx_trio.router.registry import Registry

    assert config.store is not None
    store = await trio.to_thread.run_sync(functools.partial(
        open_store, **({"url": config.store} if is_store_url(config.store)
                       else {"data": config.store})))
    reg = Registry(store)
    try:
        identity = await handler.call("identity", {})
        sources = await trio.to_thread.run_sync(model_sources, runtime)
        return await register_defaults(reg, identity, sources)
    finally:
        await reg.aclose()


def prepare(data: Path, bind: str) -> tuple[Path, GatewayConfig, str | None]:
    data.mkdir(parents=True, exist_ok=True)
    runtime = ensure_runtime(data)
    config, token = ensure_config(data, bind)
    write_grants(config, data / "grants")
    return runtime, config, token


async def serve_embedded(data: Path, bind: str, *,
                         task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
                         shutdown: trio.Event | None = None,
                         journal_max_bytes: int | None = None,
                         journal_min_free_bytes: int | None = None,
                         service_socket: bool = False, freeze_heap: bool = False) -> None:
    """Flags given as None take gateway.json's ``limits.journal_*``.  The runtime's
    service socket is opened only with ``service_socket`` (``--service-socket``).
    ``freeze_heap`` (the CLI's): once serving, the start-up heap goes to the collector's
    permanent generation (:func:`aotx_trio._latency.tune_gc`).
    SIGHUP re-reads gateway.json: the gateway's principals and the runtime's grants
    (the grant file is rewritten from it) change without a restart."""
    with journal_dir_locked(data / "journal") as journal_lock:   # before any write
        await _serve_locked(data, bind, journal_lock, task_status, shutdown,
                            journal_max_bytes, journal_min_free_bytes, service_socket,
                            freeze_heap)
    print("aotx serve: stopped", flush=True)


async def _serve_locked(data: Path, bind: str, journal_lock: int,
                        task_status: trio.TaskStatus[list[str]],
                        shutdown: trio.Event | None, journal_max_bytes: int | None,
                        journal_min_free_bytes: int | None, service_socket: bool,
                        freeze_heap: bool) -> None:
    runtime, config, token = await trio.to_thread.run_sync(prepare, data, bind)
    limits = JournalLimits.of(config.limits, journal_max_bytes, journal_min_free_bytes)
    if token is not None:
        print("aotx serve: admin token (shown once, stored only as its SHA-256):",
              flush=True)
        print(f"  {token}", flush=True)
    shutdown = shutdown if shutdown is not None else trio.Event()
    async with trio.open_nursery() as outer:
        outer.start_soon(on_signal, shutdown.set)
        handler = await outer.start(functools.partial(
            run_runtime, runtime, data / "journal", data / "grants",
            execution_deadline_s=config.limits.execution_deadline_s, journal_limits=limits,
            journal_lock=journal_lock, socket=service_socket))
        try:
            for model_id in await register_default_models(config, runtime, handler):
                log.info("default model %s", model_id)
        except AotxError as exc:   # e.g. a PostgreSQL store that is down: serve anyway
            log.error("the default models were not registered: %s", exc.message)

        def reload(fresh: GatewayConfig) -> None:
            write_grants(fresh, data / "grants")
            handler.grants = load_grants(data / "grants")

        async with trio.open_nursery() as gateway:
            binds = await gateway.start(functools.partial(
                serve_gateway, config, InProcessClient(handler), shutdown,
                config_path=data / CONFIG_NAME, on_reload=reload))
            if freeze_heap:
                _latency.tune_gc()
            print(f"aotx serve: lineage {handler.lineage}, listening on {' '.join(binds)}",
                  flush=True)
            task_status.started(binds)
        outer.cancel_scope.cancel()   # the gateway has shut down: stop the runtime


# The journal's write + fsync runs in a worker thread; when the fsync returns, that
# thread needs the GIL to hand its result back to trio.  CPython makes a thread that
# waits for the GIL wait for the switch interval (5 ms by default) while the trio
# thread runs Python code, which under load stretched every journal tick (a ~4 ms
# fsync) by up to 5 ms and capped the saves per second (docs/benchmarks.md).
SWITCH_INTERVAL_S = 0.0005


def main(args: argparse.Namespace) -> int:
    setup_logging()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    run_trio(functools.partial(serve_embedded, journal_max_bytes=args.journal_max_bytes,
                               journal_min_free_bytes=args.journal_min_free_bytes,
                               service_socket=args.service_socket, freeze_heap=True),
             Path(args.data), args.bind)
    return 0
