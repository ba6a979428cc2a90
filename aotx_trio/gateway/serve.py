"""``aotx gateway serve --config FILE``: the gateway process (hypercorn, trio worker).

::

    serve_gateway          hypercorn.trio.serve(app, shutdown_trigger=...)
    └─ app.nursery
       └─ device client    SocketClient.run: <journal>/service.sock

SIGINT/SIGTERM trigger hypercorn's graceful shutdown (in-flight requests
finish, then quart-trio cancels the app nursery and runs after_serving).
SIGHUP re-reads ``gateway.json`` and replaces the principals (tokens and
actions) without a restart: a revoked token is 401 from then on.  Other keys
(bind, limits) need a restart.  A file that no longer loads is logged and the
running principals are kept.
:func:`serve_gateway` is also the gateway half of ``aotx serve``, with an
in-process client instead of the socket.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve as hypercorn_serve

from aotx_trio import _latency, errors
from aotx_trio._process import on_reload as on_reload_signal
from aotx_trio._process import on_signal, run_trio, setup_logging
from aotx_trio.config import GatewayConfig, load_gateway_config
from aotx_trio.gateway.app import make_app_from_config
from aotx_trio.gateway.auth import Authenticator
from aotx_trio.gateway.listen import configure
from aotx_trio.gateway.routes_table import body_limit
from aotx_trio.service.client import DeviceClient, SocketClient

log = logging.getLogger("aotx.gateway")


def hypercorn_config(config: GatewayConfig, app: Any = None) -> HyperConfig:
    """hypercorn's settings for ``config``; with ``app``, its connections' closes are
    reported to the app's :class:`~aotx_trio.gateway.quota.Holdings`."""
    hc = HyperConfig()
    hc.bind = [config.bind]
    hc.keep_alive_timeout = config.limits.keep_alive_timeout_s
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.graceful_timeout = 5.0
    hc.h11_max_incomplete_size = 64 * 1024
    lim = config.limits
    holdings = None if app is None else app.config.get("AOTX_HOLDINGS")
    if holdings is not None:
        holdings.tracking = True
    configure(hc, max_connections=lim.max_connections, h2c=lim.allow_h2c,
              body_limit=functools.partial(body_limit, {
                  "body": lim.max_body_bytes, "media": lim.max_media_bytes}),
              closed=None if holdings is None else holdings.closed)
    return hc


async def serve_gateway(config: GatewayConfig, client: DeviceClient,
                        shutdown: trio.Event, *, config_path: Path | None = None,
                        on_reload: Callable[[GatewayConfig], None] | None = None,
                        task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
                        ) -> None:
    """Serve until ``shutdown`` is set; ``started()`` with the bound URLs.  With
    ``config_path``, SIGHUP reloads its principals, then calls ``on_reload``."""
    app = make_app_from_config(config, client)
    auth: Authenticator = app.config["AOTX_AUTH"]

    def reload() -> None:
        assert config_path is not None
        fresh = load_gateway_config(config_path)
        if not fresh.principals:
            raise errors.ConfigError(f"{config_path}: names no principals", key="principals")
        auth.reload(fresh.principals)
        if on_reload is not None:
            on_reload(fresh)
        log.info("reloaded %d principals from %s", len(fresh.principals), config_path)

    async with trio.open_nursery() as nursery:
        if config_path is not None:
            await nursery.start(on_reload_signal, reload)
        await hypercorn_serve(app, hypercorn_config(config, app),
                              shutdown_trigger=shutdown.wait, task_status=task_status)
        nursery.cancel_scope.cancel()


async def _run(config: GatewayConfig, path: Path) -> None:
    if config.service_socket is None:
        raise errors.ConfigError("gateway.json: service_socket is required for "
                                 "'aotx gateway serve' (use 'aotx serve' for one process)",
                                 key="service_socket")
    shutdown = trio.Event()
    client = SocketClient(str(config.service_socket))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(on_signal, shutdown.set)
        binds = await nursery.start(functools.partial(serve_gateway, config, client,
                                                      shutdown, config_path=path))
        _latency.tune_gc()
        print(f"aotx gateway: listening on {' '.join(binds)}", flush=True)
        await shutdown.wait()
        # hypercorn returns after its graceful shutdown; then the signal task ends.
    print("aotx gateway: stopped", flush=True)


def main(args: argparse.Namespace) -> int:
    setup_logging()
    config = load_gateway_config(args.config)
    run_trio(_run, config, Path(args.config))
    return 0
