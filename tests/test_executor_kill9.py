"""kill -9 during a generation on the real default model: a real ``aotx boot`` process
leases the input (one LEASE transfer), journals its output as OUTPUT transfers (the
running result read serves them), is killed mid-way and boots again: the input reads
``interrupted`` with the output journaled before the kill readable, and it is never
leased or run again (reuses tests/test_memory_kill9.py's boot helpers).  Also killed
after the lease and before its memory processing, and during it (mode 2, retained but
not interpreted): interrupted, memory never repeated."""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import pytest
import trio
from _runtime_proc import WHO, connected, kill_once, real_runtime, run_once, start_input

from aotx_trio.native.journal import JournalReader
from aotx_trio.runtime.executor import OUTPUT_BATCH_BYTES
from aotx_trio.service.client import SocketClient

pytestmark = pytest.mark.timeout(300)
XFER_LEASE, XFER_OUTPUT, XFER_MEMORY = 3, 4, 7


def _journal_transfers(folder: Path) -> list[Any]:
    image = b"".join(p.read_bytes() for p in sorted((folder / "journal").glob("*.aotxj")))
    return list(JournalReader(image))


def test_kill9_during_generation_keeps_the_journaled_output(tmp_path: Path) -> None:
    with real_runtime(tmp_path) as (ccir, folder, sock):
        state: dict[str, Any] = {}

        async def result(client: SocketClient, op: str) -> tuple[dict[str, Any], bytes]:
            got = await client.call("operation.result", {**WHO, "operation": op,
                                                          "offset": 0})
            return got, base64.b64decode(got["data"])

        async def first() -> None:
            async with connected(sock) as client:
                _space, op = await start_input(
                    client, "Count from one to one thousand in words, one per line.", 2000)
                with trio.fail_after(120):
                    while True:   # running, two output batches journaled and saved
                        got, data = await result(client, op)
                        if got["status"] == "running" and len(data) >= 2 * OUTPUT_BATCH_BYTES:
                            break
                        await trio.sleep(0.02)
                assert got["finished"] is False and got["length"] == len(data)
                state.update(op=op, seen=data)

        kill_once(ccir, folder, first)
        op_hex = state["op"].rsplit("-", 1)[1]

        async def second() -> None:
            async with connected(sock) as client:
                r = await client.call("operation.get", {**WHO, "operation": state["op"]})
                assert r["status"] == r["finish"] == "interrupted"
                state["tokens"] = (r["result"]["input_tokens"], r["result"]["output_tokens"])
                got, data = await result(client, state["op"])
                # every byte a read showed before the kill is still there, in order
                assert data[:len(state["seen"])] == state["seen"]
                assert got["status"] == "interrupted" and got["finished"] is True
                state["after"] = data
                await trio.sleep(1.0)          # nothing runs it again
                again, data2 = await result(client, state["op"])
                assert data2 == data and again["status"] == "interrupted"

        run_once(ccir, folder, second)
        # the journal: one lease named the input, its OUTPUT transfers hold exactly the
        # interrupted result's bytes, none written after the restart
        outputs = [t for t in _journal_transfers(folder)
                   if t.kind == XFER_OUTPUT and t.data[16:32].hex() == op_hex]
        assert b"".join(t.data[40:] for t in outputs) == state["after"]
        offsets = [struct.unpack_from("<I", t.data, 4)[0] for t in outputs]
        assert offsets == [i * OUTPUT_BATCH_BYTES for i in range(len(outputs))]
        # a batch per 128 bytes (one journal record each), not a record per token
        assert len(outputs) >= 2 and all(len(t.data) == 40 + OUTPUT_BATCH_BYTES
                                          for t in outputs)
        # each batch carries the token counts then; the interrupted input reports the last
        counts = [struct.unpack_from("<II", t.data, 32) for t in outputs]
        assert state["tokens"] == counts[-1]
        n_in, n_out = counts[-1]
        assert n_in > 10 and 0 < n_out < len(state["after"])
        assert [c[0] for c in counts] == [n_in] * len(counts)
        assert [c[1] for c in counts] == sorted({c[1] for c in counts})   # rising
        leases = [t for t in _journal_transfers(folder) if t.kind == XFER_LEASE]
        assert len(leases) == 1


def test_kill9_between_lease_and_memory(tmp_path: Path) -> None:
    """The lease comes first, then memory processing: a runtime killed after the lease
    and before retention (memory.DELAY_ENV holds it there) boots again with the input
    ``interrupted`` and its memory never retained (no MEMORY transfer, no rows, before
    or after the restart): it is not repeated; the acknowledged admission is kept."""
    from aotx_trio.runtime import memory

    with real_runtime(tmp_path) as (ccir, folder, sock):
        state: dict[str, Any] = {}

        async def first() -> None:
            async with connected(sock) as client:
                space, op = await start_input(client, "Remember that the boat is blue.", 20)
                with trio.fail_after(60):
                    while True:   # leased, its memory processing waiting
                        got = await client.call("operation.get", {**WHO, "operation": op})
                        if got["status"] == "running":
                            break
                        await trio.sleep(0.05)
                await trio.sleep(1.0)     # the lease saved (the emitter saves in ms)
                rows = await client.call("memory.list", {**WHO, "space": space})
                assert rows["items"] == []
                state.update(op=op, space=space)

        kill_once(ccir, folder, first, {memory.DELAY_ENV: "600"})
        kinds = [t.kind for t in _journal_transfers(folder)]
        assert kinds.count(XFER_LEASE) == 1 and XFER_MEMORY not in kinds

        async def second() -> None:
            async with connected(sock) as client:
                got = await client.call("operation.get", {**WHO, "operation": state["op"]})
                assert got["status"] == "interrupted"
                await trio.sleep(1.0)                             # nothing is re-run
                rows = await client.call("memory.list", {**WHO, "space": state["space"]})
                assert rows["items"] == []
                assert (await client.call("capabilities", {}))["usage"]["memory"] == 0

        run_once(ccir, folder, second)
        kinds = [t.kind for t in _journal_transfers(folder)]
        assert kinds.count(XFER_LEASE) == 1 and XFER_MEMORY not in kinds


def test_kill9_during_memory_processing_in_mode_2(tmp_path: Path) -> None:
    """Killed during memory processing: leased, retained (mode 2), its interpretation
    not run yet (memory.DELAY_ENV ``after:``).  After the restart the input reads
    ``interrupted``, its two rows are there as saved, and its memory input is not
    repeated: no interpretation, no further MEMORY transfer."""
    from aotx_trio.runtime import memory

    with real_runtime(tmp_path, auto_memory=True) as (ccir, folder, sock):
        state: dict[str, Any] = {}

        async def first() -> None:
            async with connected(sock) as client:
                space, op = await start_input(client, "My locker number is 318.", 20)
                with trio.fail_after(60):
                    while True:   # leased and retained (saved rows), the calls waiting
                        rows = await client.call("memory.list", {**WHO, "space": space})
                        got = await client.call("operation.get", {**WHO, "operation": op})
                        if got["status"] == "running" and len(rows["items"]) == 2:
                            break
                        await trio.sleep(0.05)
                state.update(op=op, space=space, rows=rows["items"])

        kill_once(ccir, folder, first, {memory.DELAY_ENV: "after:600"})
        assert [(r["kind"], r["retention_mode"]) for r in state["rows"]] == \
            [("text", 2), ("embedding", 2)]
        kinds = [t.kind for t in _journal_transfers(folder)]
        assert kinds.count(XFER_LEASE) == 1 and kinds.count(XFER_MEMORY) == 1
        assert kinds.index(XFER_LEASE) < kinds.index(XFER_MEMORY)   # the lease first

        async def second() -> None:
            async with connected(sock) as client:
                got = await client.call("operation.get", {**WHO, "operation": state["op"]})
                assert got["status"] == "interrupted"
                await trio.sleep(1.0)                             # nothing is re-run
                rows = await client.call("memory.list", {**WHO, "space": state["space"]})
                assert rows["items"] == state["rows"]
                assert (await client.call("capabilities", {}))["usage"]["memory"] == 2

        run_once(ccir, folder, second)
        kinds = [t.kind for t in _journal_transfers(folder)]
        assert kinds.count(XFER_LEASE) == 1 and kinds.count(XFER_MEMORY) == 1
