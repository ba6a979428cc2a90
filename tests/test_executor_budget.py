"""The executor's KV-page admission as a property (hypothesis): random inputs on a
small pool never over-commit it, join in admission order, and every input that fits
the pool alone ends ``succeeded`` (none fails or starves for lack of pages); only one
that needs more than the whole pool fails, naming the pool."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import synth_gguf as sg
import trio
from _gateway_env import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotx_trio import errors
from aotx_trio.native.engine import Engine
from aotx_trio.runtime.executor import Executor
from aotx_trio.runtime.job import Job
from aotx_trio.runtime.prompt import Turn
from aotx_trio.runtime.served import TextModel

pytestmark = pytest.mark.timeout(300)
RESULT_CAP = 65536


class _Waker:
    def wake(self) -> None:
        pass


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sg.write_model(tmp_path_factory.mktemp("budget") / "tiny.gguf", TINY)


inputs = st.lists(st.tuples(st.integers(1, 70), st.integers(1, 40)), min_size=1, max_size=10)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=inputs, pages=st.integers(4, 12), seqs=st.integers(1, 4))
def test_the_pool_is_never_over_committed_and_nothing_starves(
        tiny: Path, spec: list[tuple[int, int]], pages: int, seqs: int) -> None:
    with Engine.load(tiny, kv_pages=pages, max_seqs=seqs) as eng:
        model = TextModel("tiny", "0" * 64, eng)
        ticks = itertools.count()
        ex = Executor(None, _Waker(), RESULT_CAP,  # type: ignore[arg-type]  # ephemeral only
                      clock=lambda: float(next(ticks)), deadline_s=1e12)
        kv = eng.kv_stats()
        jobs = [Job(f"{i:032x}", "", model, Turn("", b""), max_out,
                    prompt=[4 + (i * 7 + k) % 250 for k in range(plen)], ephemeral=True)
                for i, (plen, max_out) in enumerate(spec)]

        def fits_alone(j: Job) -> bool:
            """Whether the empty pool can hold the input (the engine's own accounting,
            sliding-window layers included)."""
            seq = eng.add_sequence()
            try:
                eng.reserve(seq, len(j.prompt) + j.max_output)
                return True
            except errors.OverCapacity:
                return False
            finally:
                eng.release(seq)

        alone = [fits_alone(j) for j in jobs]

        async def drive() -> None:
            for j in jobs:
                ex.submit(j)
            for _ in range(5000):
                await ex.cycle()
                running = [j for g in ex._running.values() for j in g]
                now = eng.kv_stats()
                assert now.used_pages + now.reserved_pages + now.free_pages == kv.n_pages
                assert len(running) == now.n_seqs <= seqs
                if all(ex.ended(j.op_id) is not None or j.finish is not None for j in jobs) \
                        and not running and not ex.queued():
                    return
            raise AssertionError("inputs starved")

        trio.run(drive)
        for j, fits in zip(jobs, alone, strict=True):
            if fits:     # waited as long as it had to, never failed for pages
                assert j.finish in ("stop", "length"), (j.finish, kv.n_pages)
            else:        # more than the whole pool: fails at once
                assert j.finish == "error"
        # inputs joined in admission order (the ones that could run at all)
        starts = [j.started for j, fits in zip(jobs, alone, strict=True) if fits]
        assert starts == sorted(starts)
        assert eng.kv_stats().free_pages == kv.n_pages       # ephemeral: nothing kept
