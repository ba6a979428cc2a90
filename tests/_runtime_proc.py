"""A real ``aotx boot`` child process and its socket client, shared by the kill -9
tests (tests/test_memory_kill9.py, test_executor_kill9.py, test_checkpoint.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import trio
from _gateway_env import ALL, LINEAGE, make_config, short_dir
from _real import real_embedding_dir, real_gguf

from aotx_trio.runtime import pack
from aotx_trio.runtime.socket_server import SOCKET_NAME
from aotx_trio.service.client import SocketClient

#: alice's credentials in a socket call
WHO: dict[str, Any] = {"principal": "alice", "actions": list(ALL)}


@contextlib.contextmanager
def real_runtime(tmp_path: Path, *, auto_memory: bool = False
                 ) -> Iterator[tuple[Path, Path, str]]:
    """The real default models (Gemma 3 270M, MiniLM) packed into a shared runtime file
    (``auto_memory``: mode 2 for the text model) and a fresh data folder with alice's
    grants: (runtime file, folder, service socket path); the folder is removed after."""
    gguf = real_gguf()
    ccir = tmp_path / "real.aotxccir"
    pack.pack(ccir, models=[gguf], embedding=real_embedding_dir(), shared=True,
              lineage=LINEAGE, progress=False, auto_memory=[gguf.name] if auto_memory else ())
    folder = short_dir()
    try:
        make_config(folder, {"alice": ALL})
        yield ccir, folder, str(folder / "journal" / SOCKET_NAME)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def connected(sock: str) -> AsyncIterator[SocketClient]:
    """A running SocketClient on ``sock`` for the block."""
    client = SocketClient(sock)
    async with trio.open_nursery() as n:
        await n.start(client.run)
        yield client
        n.cancel_scope.cancel()


def boot(ccir: Path, folder: Path, env: dict[str, str] | None = None
         ) -> subprocess.Popen[str]:
    """``aotx boot`` on ``folder``'s journal and grants (``env`` added to this process's
    environment); returns once its socket is up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aotx_trio", "boot", "--ccir", str(ccir), "--journal",
         str(folder / "journal"), "--service-grants", str(folder / "grants")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})})
    sock = folder / "journal" / SOCKET_NAME
    deadline = time.monotonic() + 120
    while not sock.exists():
        assert proc.poll() is None, proc.communicate(timeout=30)
        assert time.monotonic() < deadline, "runtime did not start"
        time.sleep(0.05)
    return proc


def body(kind: str, seq: int, **fields: Any) -> dict[str, Any]:
    """alice's mutation ``kind`` with sequence (and operation key) ``seq``."""
    return {"principal": "alice", "actions": list(ALL), "kind": kind,
            "body": {"schema": "aotx.shared.mutation.v1", "lineage": LINEAGE,
                     "operation_key": f"{seq:032x}", "sequence": str(seq), **fields}}


async def first_conversation(client: SocketClient) -> tuple[str, str, str]:
    """alice registers (sequence 1), makes a space (2) and a conversation (3) in it:
    (the runtime's text model, space id, conversation id)."""
    caps = await client.call("capabilities", {})
    model = next(m["name"] for m in caps["models"] if m["kind"] == "text")
    await client.call("mutation.submit", body("participant.register", 1))
    r = await client.call("mutation.submit", body("space.create", 2))
    space = r["receipt"]["resource"]
    r = await client.call("mutation.submit", body("conversation.create", 3, space=space))
    return model, space, r["receipt"]["resource"]


async def start_input(client: SocketClient, text: str, max_output_tokens: int
                      ) -> tuple[str, str]:
    """:func:`first_conversation`, then alice's input ``text`` in it (sequence 4):
    (space id, operation id)."""
    model, space, con = await first_conversation(client)
    r = await client.call("mutation.submit", body(
        "input", 4, conversation=con, model=model, max_output_tokens=max_output_tokens,
        text=text))
    return space, r["receipt"]["operation"]


def _run(ccir: Path, folder: Path, main: Callable[[], Awaitable[None]],
         sig: signal.Signals, env: dict[str, str] | None) -> int:
    """Boot the runtime (with ``env``), run ``main`` (its socket client) under trio, send
    ``sig``; its exit status (a runtime still up after a failure is killed)."""
    proc = boot(ccir, folder, env)
    try:
        trio.run(main)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    return proc.returncode


def run_once(ccir: Path, folder: Path, main: Callable[[], Awaitable[None]]) -> None:
    """Boot the runtime, run ``main``, then stop the runtime cleanly (SIGTERM)."""
    _run(ccir, folder, main, signal.SIGTERM, None)


def kill_once(ccir: Path, folder: Path, main: Callable[[], Awaitable[None]],
              env: dict[str, str] | None = None) -> None:
    """Boot the runtime (with ``env``), run ``main``, then kill it with a real SIGKILL and
    check that is how it ended."""
    assert _run(ccir, folder, main, signal.SIGKILL, env) == -signal.SIGKILL
