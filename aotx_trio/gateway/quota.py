"""Per-principal request rate: a token bucket per principal (429 ``over_quota``).

``limits.requests_per_second`` tokens flow into each principal's bucket, which
holds at most ``limits.request_burst``; every authenticated request of every
route (the shared API, media, metrics, the router, webhooks) takes one, in the
one admit step (:class:`aotx_trio.gateway.routes_table.Admission`, which both the
Quart path and the ASGI fast path run).  An empty bucket is 429 ``over_quota``
(``quota: "requests"``) with ``Retry-After`` = the seconds until the next token,
rounded up.  Buckets exist only for configured principals (a request is
authenticated first), so memory is bounded by the configuration.  A rate of 0
turns the limit off.

The OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/embeddings``,
``/v1/models``) draw from a bucket of their own (``limits.v1_requests_per_second``,
``limits.v1_request_burst``; ``quota: "v1_requests"``; the ``v1`` bucket of their
rows): a generation costs far more than a shared-API read, so its rate is set
apart.

What a principal holds at once, connections and requests in flight (SSE streams
included), is counted by :class:`Holdings`.  The receipt, space, conversation,
member-row, memory-row and media-bytes quotas are the runtime's
(:mod:`aotx_trio.runtime.quota`): it holds the counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aotx_trio import errors


class RateLimiter:
    def __init__(self, rate: float, burst: int,
                 clock: Callable[[], float] = time.monotonic, *,
                 quota: str = "requests") -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.quota = quota
        self._buckets: dict[str, tuple[float, float]] = {}   # name -> (tokens, at)

    def take(self, name: str) -> None:
        """One request of ``name``, or :class:`aotx_trio.errors.Refusal` ``over_quota``."""
        if self.rate <= 0:
            return
        now = self.clock()
        tokens, at = self._buckets.get(name, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[name] = (tokens, now)
            wait = max(1, math.ceil((1.0 - tokens) / self.rate))
            raise errors.Refusal(
                f"over {self.rate:g} requests per second (burst {self.burst}) for this "
                "principal", code="over_quota", quota=self.quota, limit=self.rate,
                retry_after=wait)
        self._buckets[name] = (tokens - 1.0, now)



class Holdings:
    """What each principal holds at once (``limits.max_connections_per_principal``,
    ``limits.max_inflight_per_principal``), so one token cannot take every
    connection slot (``limits.max_connections``) from the others.

    * **Requests in flight**: from the admit step until the response's last part is
      sent (an SSE stream or a streamed chat completion for its whole life, an
      invoke, an upload).  One more is 429 ``over_quota`` (``quota: "inflight"``).
    * **Connections**: a connection belongs to the principal of its latest admitted
      request until it closes (the listener reports the close:
      :func:`aotx_trio.gateway.listen.configure`, ``closed``; a server that does not
      leaves connections uncounted: ``tracking``).  A request that would
      give a principal one connection more than its quota is 429 ``over_quota``
      (``quota: "connections"``) and its connection closes after the answer.

    :meth:`wrap` is the ASGI wrapper that releases a request's hold when its
    response is done; :meth:`enter` is called by the admit step with the request's
    ASGI scope.  Counts exist only for configured principals and open connections."""

    def __init__(self, max_connections: int, max_inflight: int) -> None:
        self.max_connections = max_connections
        self.max_inflight = max_inflight
        self.inflight: dict[str, int] = {}
        self.tracking = False   # set once a listener reports closes (else not counted)
        self.owner: dict[Any, str] = {}             # connection (the peer) -> principal
        self.connections: dict[str, set[Any]] = {}  # principal -> its connections

    def enter(self, name: str, scope: dict[str, Any] | None) -> None:
        """Hold one request of ``name`` on the connection of ``scope`` (429 past a
        quota); released by :meth:`wrap` once the response is done."""
        if scope is None or "aotx.held" in scope:
            return
        peer = scope.get("client") if self.tracking else None
        if peer is not None and self.owner.get(peer) != name:
            mine = self.connections.setdefault(name, set())
            if len(mine) >= self.max_connections:
                scope["aotx.close"] = True
                raise errors.Refusal(
                    f"the principal holds {len(mine)} connections; close some first",
                    code="over_quota", quota="connections", limit=self.max_connections)
            self.closed(peer)
            self.owner[peer] = name
            mine.add(peer)
        held = self.inflight.get(name, 0)
        if held >= self.max_inflight:
            raise errors.Refusal(f"the principal has {held} requests in flight",
                                 code="over_quota", quota="inflight",
                                 limit=self.max_inflight)
        self.inflight[name] = held + 1
        scope["aotx.held"] = name

    def closed(self, peer: Any) -> None:
        """The connection of ``peer`` closed (or passed to another principal)."""
        name = self.owner.pop(peer, None)
        if name is not None:
            mine = self.connections.get(name)
            if mine is not None:
                mine.discard(peer)
                if not mine:
                    del self.connections[name]

    def _leave(self, name: str) -> None:
        left = self.inflight.get(name, 1) - 1
        if left > 0:
            self.inflight[name] = left
        else:
            self.inflight.pop(name, None)

    def wrap(self, app: Callable[[Any, Any, Any], Awaitable[None]],
             ) -> Callable[[Any, Any, Any], Coroutine[Any, Any, None]]:
        """The ASGI wrapper: a held request is released when ``app`` returns (its
        response sent whole, or the client gone); a refused connection closes."""
        async def held(scope: Any, receive: Any, send: Any) -> None:
            if scope.get("type") != "http":
                await app(scope, receive, send)
                return

            def release() -> None:
                name = scope.pop("aotx.held", None)
                if name is not None:
                    self._leave(name)

            async def closing(message: dict[str, Any]) -> None:
                kind = message.get("type")
                if kind == "http.response.start" and scope.get("aotx.close"):
                    message = {**message, "headers": [
                        *message.get("headers", []), (b"connection", b"close")]}
                elif kind == "http.response.body" and not message.get("more_body"):
                    release()   # answered whole: the client may ask again at once
                await send(message)

            try:
                await app(scope, receive, closing)
            finally:
                release()

        return held
