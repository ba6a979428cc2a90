"""``GET /metrics``: the Prometheus text format, behind the bearer token with the
``metrics_read`` action.

Two sources, one page:

* the gateway's own numbers, kept by :class:`GatewayMetrics` in a registry of
  this app (prometheus-client): HTTP requests by method, route template and
  status and their latency (counted by an ASGI wrapper around everything, the
  fast path included), SSE subscribers and drops;
* the runtime's numbers, asked for on each scrape with the ``metrics`` service
  call (in process or over the socket): KV pages per model (used, free,
  shared), the admission queue, running inputs, engine steps, prefill and
  output tokens, inputs ended by status, time to first token, journal state.

Route templates keep the label set small: a path is labelled with the rule of
its row in the route table (:data:`aotx_trio.gateway.routes_table.ROUTES`;
path parameters become ``{space}``, ``{conversation}``, ``{target}``, ...);
a path no row matches is ``other``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from quart import Response, current_app

from aotx_trio.gateway.routes_table import row_of
from aotx_trio.service.client import DeviceClient

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Scope = Any   # an ASGI scope (a dict)
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def route_template(path: str) -> str:
    """The label of a request path: its row's rule in the route table
    (``/aotx/v1/shared/spaces/spc-.../members`` -> ``.../spaces/{space}/members``,
    ``/v1/chat/completions`` as it is); ``other`` for a path no row matches."""
    found = row_of(path)
    return "other" if found is None else found[1]


class GatewayMetrics:
    """The gateway's own metrics (one registry per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("aotx_http_requests", "HTTP requests answered",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("aotx_http_request_seconds", "HTTP request latency",
                                 ["method", "route"], registry=self.registry)
        self.sse_subscribers = Gauge("aotx_sse_subscribers", "open SSE streams",
                                     registry=self.registry)
        self.sse_dropped = Counter("aotx_sse_dropped", "SSE subscribers dropped",
                                   ["reason"], registry=self.registry)
        self._cache: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def _children(self, method: str, path: str, status: int) -> tuple[Any, Any]:
        """The (request counter, latency histogram) children of one request's labels,
        cached (prometheus-client's ``labels()`` takes a lock and builds a key each
        time; this runs on every response)."""
        key = (method, path, status)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= 4096:
                self._cache.clear()
            route = route_template(path)
            found = self._cache[key] = (self.requests.labels(method, route, str(status)),
                                        self.latency.labels(method, route))
        return found

    def wrap(self, app: ASGIApp) -> Callable[[Any, Any, Any], Coroutine[Any, Any, None]]:
        """An ASGI wrapper that counts every HTTP request ``app`` answers."""
        async def counted(scope: Scope, receive: Any, send: Any) -> None:
            if scope.get("type") != "http":
                await app(scope, receive, send)
                return
            start = time.perf_counter()

            async def watch(message: dict[str, Any]) -> None:
                if message.get("type") == "http.response.start":
                    count, latency = self._children(str(scope.get("method", "")),
                                                    str(scope.get("path", "")),
                                                    int(message.get("status", 0)))
                    count.inc()
                    latency.observe(time.perf_counter() - start)
                await send(message)

            await app(scope, receive, watch)

        return counted


class _Snapshot(Collector):
    """The runtime's snapshot (the ``metrics`` service call) as metric families."""

    def __init__(self, snap: dict[str, Any]) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        pages = GaugeMetricFamily("aotx_kv_pages", "KV cache pages", labels=["model", "state"])
        seqs = GaugeMetricFamily("aotx_kv_sequences", "live KV sequences", labels=["model"])
        page_bytes = GaugeMetricFamily("aotx_kv_page_bytes",
                                       "bytes of one KV page (halved by f16 KV)",
                                       labels=["model"])
        for name, m in self.snap.get("models", {}).items():
            pages.add_metric([name, "total"], m["kv_pages"])
            pages.add_metric([name, "free"], m["kv_free_pages"])
            pages.add_metric([name, "used"], m["kv_used_pages"])
            pages.add_metric([name, "shared"], m["kv_shared_pages"])
            seqs.add_metric([name], m["sequences"])
            if "kv_page_bytes" in m:
                page_bytes.add_metric([name], m["kv_page_bytes"])
        yield pages
        yield seqs
        yield page_bytes
        ex = self.snap.get("executor")
        if ex is not None:
            yield GaugeMetricFamily("aotx_admission_queue_depth",
                                    "saved inputs waiting for KV pages", value=ex["queued"])
            yield GaugeMetricFamily("aotx_running_inputs", "inputs generating",
                                    value=ex["running"])
            for key, help_ in (("steps", "engine steps (batched groups)"),
                               ("prefill_tokens", "prompt tokens fed"),
                               ("output_tokens", "tokens generated"),
                               ("reused_tokens", "prompt positions reused from a "
                                                 "conversation's resident KV pages")):
                yield CounterMetricFamily(f"aotx_engine_{key}", help_, value=ex[key])
            yield GaugeMetricFamily("aotx_resident_sequences",
                                    "conversations whose KV pages stay between turns",
                                    value=ex["resident_sequences"])
            ended = CounterMetricFamily("aotx_inputs_finished", "inputs ended, by status",
                                        labels=["status"])
            for status, n in sorted(ex["finished"].items()):
                ended.add_metric([status], n)
            yield ended
            yield _histogram("aotx_time_to_first_token_seconds",
                             "start of execution to the first token",
                             ex["time_to_first_token_seconds"])
        j = self.snap.get("journal", {})
        yield GaugeMetricFamily("aotx_journal_saved_records", "journal records saved",
                                value=int(j.get("saved_records", 0)))
        yield GaugeMetricFamily("aotx_journal_pending_bytes", "journal bytes not yet saved",
                                value=int(j.get("pending_bytes", 0)))
        yield GaugeMetricFamily("aotx_journal_hold", "1 while the journal holds writes",
                                value=1 if j.get("hold") else 0)
        for key, help_ in (("tick_seconds", "journal tick: drain, write, fsync, ack"),
                           ("fsync_seconds", "journal fsync alone")):
            if key in j:
                yield _histogram(f"aotx_journal_{key}", help_, j[key])


def _histogram(name: str, help_: str, h: dict[str, Any]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, help_)
    fam.add_metric([], [(str(b), float(n)) for b, n in h["buckets"]], sum_value=h["sum"])
    return fam


async def metrics_response(client: DeviceClient, own: GatewayMetrics) -> Response:
    """The ``/metrics`` page (after the admit step: ``metrics_read``)."""
    snap: dict[str, Any] = await client.call("metrics", {})
    runtime = CollectorRegistry()
    runtime.register(_Snapshot(snap))
    body = generate_latest(own.registry) + generate_latest(runtime)
    resp = Response(body, status=200, content_type=CONTENT_TYPE)
    resp.headers["Cache-Control"] = "no-store"
    return resp


async def _view() -> Response:
    return await metrics_response(current_app.config["AOTX_CLIENT"],
                                  current_app.config["AOTX_METRICS"])


VIEWS = {"metrics": _view}
