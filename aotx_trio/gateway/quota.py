"""Per-principal request rate: a token bucket per principal (429 ``over_quota``).

``limits.requests_per_second`` tokens flow into each principal's bucket, which
holds at most ``limits.request_burst``; every authenticated request of the
shared API takes one (:func:`aotx_trio.gateway.routes_table.admit`, which both
the Quart path and the ASGI fast path call, so both meet the same check).  An
empty bucket is 429 ``over_quota`` (``quota: "requests"``) with
``Retry-After`` = the seconds until the next token, rounded up.  Buckets exist
only for configured principals (a request is authenticated first), so memory
is bounded by the configuration.  A rate of 0 turns the limit off.

The receipt, space and conversation quotas are the runtime's
(:mod:`aotx_trio.runtime.quota`): it holds the counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from aotx_trio import errors


class RateLimiter:
    def __init__(self, rate: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
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
                "principal", code="over_quota", quota="requests", limit=self.rate,
                retry_after=wait)
        self._buckets[name] = (tokens - 1.0, now)
