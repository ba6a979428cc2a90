"""The trio thread's latency policy (aotx_trio/_latency.py): the collector's thresholds
and frozen start-up heap, and worker threads below the trio thread's priority."""

from __future__ import annotations

import gc
import os
import threading

import pytest

from aotx_trio import _latency

pytestmark = pytest.mark.timeout(30)


def test_tune_gc_collects_then_freezes_once_and_raises_the_thresholds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cyclic garbage is collected first (never frozen), what is left moves to the
    permanent generation, the thresholds rise; a second call does nothing."""
    import weakref

    class Node:
        def __init__(self) -> None:
            self.me = self

    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    kept = [Node() for _ in range(10)]
    monkeypatch.setattr(_latency, "_tuned", False)
    was_enabled = gc.isenabled()
    before = gc.get_threshold()
    gc.disable()   # no collection between here and tune_gc's own
    try:
        frozen = gc.get_freeze_count()
        assert _latency.tune_gc() is True
        assert gone() is None                                # collected, not frozen
        assert gc.get_freeze_count() >= frozen + len(kept)
        assert gc.get_threshold() == _latency.GC_THRESHOLDS
        assert _latency.tune_gc() is False                   # once per process
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        if was_enabled:
            gc.enable()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux thread ids")
def test_worker_threads_go_below_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    me = threading.get_native_id()
    mine = os.getpriority(os.PRIO_PROCESS, me)
    # relative to where this process already runs (an earlier test whose trio loop ran
    # on another thread may have lowered this one, and nice only goes down)
    if mine >= 19:
        pytest.skip("this thread already runs at the lowest priority")
    monkeypatch.setattr(_latency, "WORKER_NICE", min(19, max(mine + 5, _latency.WORKER_NICE)))
    started, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def worker() -> None:
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert started.wait(10)
        assert os.getpriority(os.PRIO_PROCESS, tid[0]) == mine
        assert _latency.lower_worker_priority() >= 1
        assert os.getpriority(os.PRIO_PROCESS, tid[0]) == max(mine, _latency.WORKER_NICE)
        assert os.getpriority(os.PRIO_PROCESS, me) == mine     # the loop's stays
        assert _latency.lower_worker_priority() == 0            # nothing new since
    finally:
        stop.set()
        t.join()

    seen: list[int] = []

    def step() -> None:
        _latency.lower_this_thread()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=step)
    t.start()
    t.join()
    assert seen == [max(mine, _latency.WORKER_NICE)]
