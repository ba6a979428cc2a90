"""Test helpers for the serving router's routes: a runtime (the tiny synthetic model,
or a given runtime file) + a gateway app with a RouterService over a registry store
(folder or PostgreSQL), served by a real hypercorn on a loopback port, and
publication helpers that bind models to what that runtime has loaded."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
from _gateway_env import (
    TINY_MODEL,
    hypercorn_on,
    make_config,
    make_runtime_file,
    short_dir,
    token_for,
)

from aotx_trio.gateway.app import create_app
from aotx_trio.identity import Descriptor, build_commit
from aotx_trio.registry.backends import open_store
from aotx_trio.registry.records import ArtifactRef, EngineSet
from aotx_trio.router.artifacts import store_artifact
from aotx_trio.router.registry import Registry
from aotx_trio.router.service import RouterService, Settings
from aotx_trio.router.upload import UploadPolicy
from aotx_trio.runtime import boot
from aotx_trio.runtime.handler import ServiceHandler
from aotx_trio.runtime.socket_server import SOCKET_NAME
from aotx_trio.service.client import DeviceClient, InProcessClient, SocketClient

READ = ("models_read",)
BOTH = ("models_read", "models_invoke")
PRINCIPALS = {"reader": READ, "invoker": BOTH, "nobody": ("shared_read",)}
TEXT_SPEC = {"spec_dsl": 2, "interaction": "request_response",
             "params": [{"name": "prompt", "type": "string"},
                        {"name": "max_tokens", "type": "integer", "default": 4},
                        {"name": "temperature", "type": "number", "default": 0.0}],
             "results": {"fields": [{"name": "text", "type": "string"},
                                    {"name": "prompt_tokens", "type": "integer"},
                                    {"name": "completion_tokens", "type": "integer"},
                                    {"name": "finish_reason", "type": "string"}],
                         "delivery": ["inline"]}}
MID = "runs/demo/r1/checkpoints/step-000200000.inference-tiny-r1.json"


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_for(name)}"}


@dataclass
class RouterEnv:
    url: str
    router: RouterService
    handler: ServiceHandler
    folder: Path
    http: httpx.AsyncClient

    @property
    def reg(self) -> Registry:
        return self.router.reg

    async def get(self, path: str, who: str = "reader", **kw: Any) -> httpx.Response:
        return await self.http.get(self.url + path, headers=auth(who), **kw)

    async def post(self, path: str, body: Any, who: str = "invoker") -> httpx.Response:
        return await self.http.post(self.url + path, json=body, headers=auth(who))

    def loaded(self, kind: str = "textgen") -> dict[str, Any]:
        """The runtime's identity row of its first artifact of ``kind``."""
        return next(a for a in self.handler.models.identity() if a["kind"] == kind)


async def publish(reg: Registry, artifact_path: Path, *, model_id: str = MID,
                  release: str = "tiny-r1", model_type: str = "textgen",
                  spec: Mapping[str, Any] = TEXT_SPEC, descriptor: Mapping[str, Any] | None = None,
                  source_commit: str | None = None, engine_set: EngineSet | None = None,
                  ) -> ArtifactRef:
    """Store ``artifact_path``, mint ``release`` from it and publish ``model_id``."""
    art = await reg.run(store_artifact, reg.store, artifact_path)
    commit = source_commit or build_commit()
    await reg.mint_release(release, art, Descriptor.model_validate(dict(descriptor or {})),
                           commit, engine_set)
    await reg.publish(model_id, {"model_type": model_type,
                                 "artifact": art.model_dump(mode="json"),
                                 "serving": {"runtime_release": {"name": release,
                                                                 "source_commit": commit},
                                             "spec": dict(spec)}})
    return art


@contextlib.asynccontextmanager
async def router_served(tmp_path: Path, *, store_url: str | None = None,
                        store_dir: Path | None = None, ccir: Path | None = None,
                        settings: Settings | None = None,
                        principals: Mapping[str, Sequence[str]] = PRINCIPALS,
                        handler: ServiceHandler | None = None,
                        upload: UploadPolicy | None = None, socket: bool = False,
                        cache_dir: Path | None = None,
                        now: Callable[[], float] | None = None,
                        ) -> AsyncIterator[RouterEnv]:
    """Runtime + gateway (with the router) on hypercorn; the store is PostgreSQL at
    ``store_url`` or a folder (``store_dir``, default under ``tmp_path``).  With
    ``handler`` given, no runtime is started: that one is shared."""
    folder = short_dir()
    store = open_store(url=store_url) if store_url else \
        open_store(data=store_dir or tmp_path / "data")
    try:
        if ccir is None and handler is None:
            ccir = make_runtime_file(tmp_path / "rt")
        _, cfg = make_config(folder, principals)
        async with trio.open_nursery() as nursery:
            if handler is None:
                handler = await nursery.start(boot.run_runtime, ccir, folder / "journal",
                                              folder / "grants")
            client: DeviceClient = InProcessClient(handler)
            if socket:      # the split deployment's transport: the runtime's service socket
                client = SocketClient(str(folder / "journal" / SOCKET_NAME))
            reg = Registry(store) if now is None else Registry(store, now=now)
            router = RouterService(reg, client,
                                   settings or Settings(index_refresh_s=0.1), upload,
                                   cache_dir)
            app = create_app(client, cfg.principals, router=router)
            async with hypercorn_on(app, cfg) as url, httpx.AsyncClient(timeout=60) as hc:
                yield RouterEnv(url, router, handler, folder, hc)
            nursery.cancel_scope.cancel()
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)


def tiny_gguf(tmp_path: Path) -> Path:
    """The tiny GGUF the default test runtime file was packed from."""
    return tmp_path / "rt" / TINY_MODEL
