"""kill -9 between retention and generation (mode 1, and mode 2 with the flag taken away
before the next boot): a real ``aotx boot`` process (the real
Gemma 3 270M and MiniLM) retains an input's memory, is killed while the input runs,
and boots again: the memory rows are there, alike; the input reads ``interrupted``;
its memory input is never repeated (still two rows, and no third retention)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from _real import real_gguf
from _runtime_proc import WHO, connected, kill_once, real_runtime, run_once, start_input
from _runtime_proc import body as _body

from aotx_trio.runtime import pack

pytestmark = pytest.mark.timeout(300)


def test_kill9_between_retention_and_generation(tmp_path: Path) -> None:
    with real_runtime(tmp_path) as (ccir, folder, sock):
        state: dict[str, Any] = {}

        async def first() -> None:
            async with connected(sock) as client:
                space, op = await start_input(client, "Write a very long story about the sea.",
                                              2000)
                with trio.fail_after(60):
                    while True:   # retained and saved, and generating
                        rows = await client.call("memory.list", {**WHO, "space": space})
                        st = (await client.call("operation.get",
                                                {**WHO, "operation": op}))["status"]
                        if len(rows["items"]) == 2 and st == "running":
                            break
                        await trio.sleep(0.02)
                state.update(space=space, op=op, rows=rows["items"])

        kill_once(ccir, folder, first)

        async def second() -> None:
            async with connected(sock) as client:
                rows = await client.call("memory.list", {**WHO, "space": state["space"]})
                assert rows["items"] == state["rows"]
                r = await client.call("operation.get", {**WHO, "operation": state["op"]})
                assert r["status"] == "interrupted"
                caps = await client.call("capabilities", {})
                assert caps["usage"]["memory"] == 2
                text = await client.call("memory.get", {**WHO, "space": state["space"],
                                                        "object": rows["items"][0]["object"],
                                                        "offset": 0})
                assert text["text"] == "Write a very long story about the sea."

        run_once(ccir, folder, second)


def test_kill9_in_mode_2_then_boot_without_the_flag(tmp_path: Path) -> None:
    """Mode 2 with the real Gemma as its own interpreter: killed while the input runs
    (retained and interpreted: four rows), then booted from a runtime file whose model
    lost the automatic-memory flag.  Recovery reads mode 2 for the old rows, the input
    reads interrupted and its interpretation is never repeated (still four rows); a new
    input on the same model is recorded with mode 1."""
    with real_runtime(tmp_path, auto_memory=True) as (ccir, folder, sock):
        state: dict[str, Any] = {}

        async def first() -> None:
            async with connected(sock) as client:
                caps = await client.call("capabilities", {})
                model = next(m for m in caps["models"] if m["kind"] == "text")
                assert model["automatic_memory"] is True
                await client.call("mutation.submit", _body("participant.register", 1))
                r = await client.call("mutation.submit", _body("space.create", 2))
                space = r["receipt"]["resource"]
                r = await client.call("mutation.submit", _body("conversation.create", 3,
                                                               space=space))
                con = r["receipt"]["resource"]
                r = await client.call("mutation.submit", _body(
                    "input", 4, conversation=con, model=model["name"], max_output_tokens=2000,
                    text="My locker number is 318. Write a very long story about the sea."))
                op = r["receipt"]["operation"]
                with trio.fail_after(120):
                    while True:   # retained, interpreted and saved, and generating
                        rows = await client.call("memory.list", {**WHO, "space": space})
                        st = (await client.call("operation.get",
                                                {**WHO, "operation": op}))["status"]
                        if len(rows["items"]) == 4 and st == "running":
                            break
                        await trio.sleep(0.02)
                state.update(space=space, con=con, op=op, rows=rows["items"],
                             model=model["name"])

        kill_once(ccir, folder, first)
        assert [(r["kind"], r["retention_mode"]) for r in state["rows"]] == \
            [("text", 2), ("embedding", 2), ("interpretation", 2), ("embedding", 2)]
        pack.pack(ccir, no_auto_memory=[real_gguf().name], progress=False)   # flag flipped

        async def second() -> None:
            async with connected(sock) as client:
                caps = await client.call("capabilities", {})
                assert next(m for m in caps["models"]
                            if m["kind"] == "text")["automatic_memory"] is False
                rows = await client.call("memory.list", {**WHO, "space": state["space"]})
                assert rows["items"] == state["rows"]          # mode 2, as recorded
                r = await client.call("operation.get", {**WHO, "operation": state["op"]})
                assert r["status"] == "interrupted"
                await trio.sleep(1.0)                           # nothing is re-run
                assert (await client.call("capabilities", {}))["usage"]["memory"] == 4
                r = await client.call("mutation.submit", _body(
                    "input", 5, conversation=state["con"], model=state["model"],
                    max_output_tokens=4, text="A short one."))
                op = r["receipt"]["operation"]
                with trio.fail_after(120):
                    while not (await client.call("operation.get",
                                                 {**WHO, "operation": op}))["terminal"]["saved"]:
                        await trio.sleep(0.05)
                rows = await client.call("memory.list", {**WHO, "space": state["space"]})
                assert [(r["kind"], r["retention_mode"]) for r in rows["items"][4:]] == \
                    [("text", 1), ("embedding", 1)]

        run_once(ccir, folder, second)
