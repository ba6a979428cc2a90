"""The trio thread's latency: what keeps the event loop from being held for tens of ms.

Every HTTP response, SSE delivery, fanout pass and the executor's Python run on the
one trio thread, so anything that stops that thread stops them all.  Two causes
were measured (docs/benchmarks.md, "SSE fanout", trio Instrument of
``scripts/bench_sse.py --stalls``), both process-wide, neither our own code:

* **the cyclic garbage collector**: with 500 SSE connections the live heap holds
  ~250,000 tracked objects; CPython's default thresholds (700, 10, 10) then run a
  young collection every few hundred allocations (~600 per 20 events), a middle one
  every tenth (4 ms on average, up to 47 ms) and full ones of 60-220 ms, each
  on whichever task allocated.  :func:`tune_gc` freezes what start-up allocated
  (moved to the permanent generation: never scanned again) and raises the
  thresholds to :data:`GC_THRESHOLDS`, so a young collection comes every 20,000
  container allocations, a middle one every million and a full one at most every
  100 middle ones; reference cycles are still collected, the long-lived ones later
  (docs/decisions.md, "SSE fanout latency").
* **CPU time slices**: an engine step runs on a worker thread plus the engine's
  pool threads, spinning flat out on every core; at the same priority the trio
  thread waits for a time slice behind them.  :func:`lower_worker_priority` gives
  every thread but the trio thread a nice value of :data:`WORKER_NICE` (Linux
  ``setpriority`` per thread id; threads created later by a lowered thread inherit
  it), so the loop runs first when it has work and the engine gets every cycle it
  leaves.  An unprivileged process cannot raise it back: this is one-way.
"""

from __future__ import annotations

import gc
import logging
import os
import threading

log = logging.getLogger("aotx.latency")

#: (young, middle, old) collection thresholds (gc.set_threshold).
GC_THRESHOLDS = (20_000, 50, 100)
#: The nice value of every thread but the trio thread.
WORKER_NICE = 10

_tuned = False
_local = threading.local()        # .lowered: this thread lowered itself already


def tune_gc() -> bool:
    """Freeze the start-up heap and raise the collector's thresholds (once per process;
    True the first time)."""
    global _tuned
    if _tuned:
        return False
    _tuned = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return True


def _lower(tid: int) -> bool:
    """Lower thread ``tid``; True when it was above :data:`WORKER_NICE`."""
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < WORKER_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, WORKER_NICE)
            return True
    except OSError:          # gone already, or not allowed: only latency is at stake
        pass
    return False


def lower_this_thread() -> None:
    """Lower the calling (worker) thread; free after the first call per thread (thread
    ids are reused, so it is remembered per thread, not per id)."""
    if not getattr(_local, "lowered", False):
        _lower(threading.get_native_id())
        _local.lowered = True


def lower_worker_priority(main_tid: int | None = None) -> int:
    """Lower every thread of the process except ``main_tid`` (default: the calling
    thread, the trio thread); returns how many were lowered now."""
    keep = threading.get_native_id() if main_tid is None else main_tid
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:          # not Linux: nothing to do
        return 0
    return sum(_lower(t) for t in tids if t != keep)
