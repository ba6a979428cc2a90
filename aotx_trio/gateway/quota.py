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

The receipt, space, conversation, member-row and media-bytes quotas are the
runtime's (:mod:`aotx_trio.runtime.quota`): it holds the counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

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

