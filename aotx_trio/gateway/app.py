"""The gateway's QuartTrio app factory.

:func:`create_app` wires the one device client, the authenticator, the limits,
and every route of the one table (:data:`aotx_trio.gateway.routes_table.ROUTES`,
whose docstring explains the routes): one view per row, registered from the
handler modules' ``VIEWS`` by endpoint, each behind the one admit step
(``before_request``) and the one error renderer (the app's error handler, in the
row's dialect).  When the
client has a long-lived ``run(task_status=...)`` task (the socket transport),
the app starts it in ``app.nursery`` before serving and only then accepts
requests; quart-trio cancels that nursery at shutdown, so nothing is left
running.

The mutation rows are answered in front of Quart by :class:`aotx_trio.gateway.fast.FastMutations`
(the same functions, so the same checks and the same bytes, far less CPU);
``fast_mutations=False`` leaves them to the Quart views generated from the
same table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from quart import Response, g, request
from quart_trio import QuartTrio

from aotx_trio import errors
from aotx_trio.config import GatewayConfig
from aotx_trio.gateway import (
    chat,
    completions,
    embeddings,
    media,
    metrics,
    router_routes,
    shared_routes,
    webhook_routes,
)
from aotx_trio.gateway.auth import Authenticator, PrincipalEntry
from aotx_trio.gateway.budget import BodyBudget
from aotx_trio.gateway.errors import respond
from aotx_trio.gateway.fast import FastMutations
from aotx_trio.gateway.framing import guard
from aotx_trio.gateway.metrics import GatewayMetrics
from aotx_trio.gateway.quota import Holdings, RateLimiter
from aotx_trio.gateway.routes_table import ROUTES, Admission, dialect_of, route_of, unrouted
from aotx_trio.router.service import RouterService, Settings
from aotx_trio.service.client import DeviceClient
from aotx_trio.webhooks.service import WebhookService

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_MEDIA_BYTES = 2 * 1024 * 1024

#: every row's view, by endpoint (a test checks these are exactly the table's rows)
VIEWS: dict[str, Callable[..., Awaitable[Response]]] = {
    **shared_routes.VIEWS, **media.VIEWS, **chat.VIEWS, **completions.VIEWS, **embeddings.VIEWS,
    **metrics.VIEWS, **router_routes.VIEWS, **webhook_routes.VIEWS}


def create_app(client: DeviceClient, principals: Iterable[PrincipalEntry], *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, list_limit_default: int = 50,
               list_limit_max: int = 500, retry_after_s: int = 1,
               sse_queue_depth: int = 256, sse_keepalive_s: float = 15.0,
               max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES,
               fast_mutations: bool = True, router: RouterService | None = None,
               rate: RateLimiter | None = None, v1_rate: RateLimiter | None = None,
               body_budget: int | None = None,
               webhooks: WebhookService | None = None,
               holdings: Holdings | None = None) -> QuartTrio:
    app = QuartTrio("aotx_trio.gateway", static_folder=None)
    app.request_class = media.request_class(max_media_bytes)
    app.config.update(
        AOTX_MAX_MEDIA_BYTES=max_media_bytes,
        AOTX_CLIENT=client,
        MAX_CONTENT_LENGTH=max_body_bytes,
        PROVIDE_AUTOMATIC_OPTIONS=False,
        AOTX_LIST_LIMIT_DEFAULT=list_limit_default,
        AOTX_LIST_LIMIT_MAX=list_limit_max,
        AOTX_RETRY_AFTER_S=retry_after_s,
        AOTX_SSE_QUEUE_DEPTH=sse_queue_depth,
        AOTX_SSE_KEEPALIVE_S=sse_keepalive_s,
        AOTX_ROUTER=router,
        AOTX_WEBHOOKS=webhooks,
    )
    app.config["BODY_TIMEOUT"] = 30
    auth = Authenticator(principals)
    app.config["AOTX_AUTH"] = auth      # reloaded in place on SIGHUP (gateway/serve.py)

    run = getattr(client, "run", None)
    if run is not None:
        @app.before_serving
        async def _start_client() -> None:
            await app.nursery.start(run)

    if router is not None:   # the serving router's index, rescan and reaper
        @app.before_serving
        async def _start_router() -> None:
            await app.nursery.start(router.run)

        @app.after_serving
        async def _close_router() -> None:
            await router.reg.aclose()

    if webhooks is not None:   # one supervised delivery task per active subscription
        @app.before_serving
        async def _start_webhooks() -> None:
            await app.nursery.start(webhooks.run)

    admission = Admission(auth, {"requests": rate, "v1": v1_rate},
                          {"body": max_body_bytes, "media": max_media_bytes}, holdings)
    app.config["AOTX_HOLDINGS"] = holdings   # the listener reports closed connections

    @app.before_request
    async def _admit() -> None:   # the one admit step of every row
        route = route_of(request.endpoint, request.path)
        if route is not None:
            g.principal = admission(route, request.headers.get("Authorization"),
                                    request.content_length,
                                    request.headers.get("Content-Type"), request.scope)

    @app.errorhandler(Exception)
    async def _error(exc: Exception) -> Response:   # the one place errors are rendered
        route = route_of(request.endpoint, request.path)
        return respond(unrouted(exc, request.path), dialect_of(request.path)
                       if route is None else route.dialect)

    @app.after_request
    async def _no_store(resp: Response) -> Response:
        resp.headers["Cache-Control"] = "no-store"
        has_body = request.content_length or "Transfer-Encoding" in request.headers
        body = request.body          # Quart has no public flags for these two
        if has_body and (not body._complete.is_set() or body._must_raise is not None):
            # answered before the whole body was read (an early 4xx, or one over the
            # limit): the unread bytes cannot carry another request, so the
            # connection closes after this response
            resp.headers["Connection"] = "close"
        return resp

    own_metrics = GatewayMetrics()
    app.config["AOTX_METRICS"] = own_metrics

    app.url_map.merge_slashes = False    # "//" is not "/" (gateway/framing.py)
    for route in ROUTES:
        app.add_url_rule(route.path, route.endpoint, VIEWS[route.endpoint],
                         methods=[route.method])
    if fast_mutations:
        app.asgi_app = app.config["AOTX_FAST"] = FastMutations(  # type: ignore[method-assign]
            app.asgi_app, client, admission,
            body_timeout=float(app.config["BODY_TIMEOUT"]), retry_after_s=retry_after_s)
    if body_budget is not None:
        app.asgi_app = BodyBudget(  # type: ignore[method-assign]
            app.asgi_app, budget=body_budget, max_body_bytes=max(max_body_bytes, max_media_bytes),
            retry_after_s=retry_after_s)
    if holdings is not None:   # inside the guard: the scope the views see
        app.asgi_app = holdings.wrap(app.asgi_app)  # type: ignore[method-assign,assignment]
    app.asgi_app = own_metrics.wrap(guard(app.asgi_app))  # type: ignore[method-assign,assignment]
    return app


def router_from_config(config: GatewayConfig, client: DeviceClient) -> RouterService | None:
    """The serving router over ``config.store`` (None when no store is set)."""
    if config.store is None:
        return None
    from aotx_trio.config import is_store_url
    from aotx_trio.registry.backends import open_store
    from aotx_trio.router.registry import Registry
    from aotx_trio.router.upload import UploadPolicy

    upload = UploadPolicy.from_config(config.router.upload)
    store = open_store(url=config.store) if is_store_url(config.store) \
        else open_store(data=config.store)
    r = config.router
    return RouterService(Registry(store), client, Settings(
        index_refresh_s=r.index_refresh_s, rescan_interval_s=r.rescan_interval_s,
        reap_interval_s=r.reap_interval_s, max_inflight_invokes=r.max_inflight_invokes),
        upload, r.artifact_cache)


def webhooks_from_config(config: GatewayConfig, router: RouterService | None,
                         ) -> WebhookService | None:
    """Webhook delivery over the router's store (None without one)."""
    if router is None:
        return None
    from aotx_trio.webhooks.delivery import Settings as HookSettings
    from aotx_trio.webhooks.signing import load_key

    w = config.webhooks
    key = None if w.signing_key_file is None else load_key(w.signing_key_file)
    return WebhookService(router.reg.store, key, HookSettings(
        retry_interval_s=w.retry_interval_s, timeout_s=w.timeout_s,
        allow_insecure_targets=w.allow_insecure_targets,
        ca_file=None if w.ca_file is None else str(w.ca_file), lease_s=w.lease_s,
        max_webhooks=config.limits.max_webhooks))


def make_app_from_config(config: GatewayConfig, client: DeviceClient, *,
                         fast_mutations: bool = True) -> QuartTrio:
    """The app for a loaded ``gateway.json`` (aotx_trio.config.GatewayConfig)."""
    principals = list(config.principals)
    if not principals:
        raise errors.ConfigError("gateway.json names no principals", key="principals")
    lim = config.limits
    router = router_from_config(config, client)
    return create_app(client, principals, max_body_bytes=lim.max_body_bytes,
                      list_limit_default=lim.list_limit_default,
                      list_limit_max=lim.list_limit_max, retry_after_s=lim.retry_after_s,
                      sse_queue_depth=lim.sse_queue_depth, sse_keepalive_s=lim.sse_keepalive_s,
                      max_media_bytes=lim.max_media_bytes, fast_mutations=fast_mutations,
                      rate=RateLimiter(lim.requests_per_second, lim.request_burst),
                      v1_rate=RateLimiter(lim.v1_requests_per_second, lim.v1_request_burst,
                                          quota="v1_requests"),
                      body_budget=lim.max_buffered_body_bytes, router=router,
                      holdings=Holdings(lim.max_connections_per_principal,
                                        lim.max_inflight_per_principal),
                      webhooks=webhooks_from_config(config, router))
