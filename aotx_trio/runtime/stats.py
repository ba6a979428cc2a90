"""Counters and histograms the runtime keeps for ``/metrics``.

Plain numbers (no metrics library in the runtime): the gateway asks for a
snapshot over the ``metrics`` service call and renders the Prometheus text
format itself, so the split deployment reports the runtime's numbers too.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

#: Latency buckets in seconds (upper bounds; +Inf is implied).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)   # per bucket, the last is +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        """Cumulative buckets ``[[upper bound or "+Inf", count], ...]``, sum and count."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, "+Inf"), self.counts, strict=True):
            running += n
            out.append([bound, running])
        return {"buckets": out, "sum": self.total, "count": self.count}
