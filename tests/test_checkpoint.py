"""Checkpoints in the runtime file (aotx_trio/runtime/checkpoint.py): the write
protocol (models and the previous checkpoint never written over), boot from
checkpoint + suffix, every refusal naming why, ``aotx pack --checkpoint`` offline and
its refusals while a runtime holds the journal or the file, and kill -9 of a real
``aotx boot`` after a checkpoint and more acknowledged writes."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _gateway_env import ALL, LINEAGE, make_config, make_runtime_file, short_dir
from _runtime_proc import body as _body
from _runtime_proc import boot as _boot

from aotx_trio import errors
from aotx_trio._fs import flock_nb
from aotx_trio.native import device as D
from aotx_trio.native.journal import FILE_HEADER, RECORD_SIZE
from aotx_trio.runtime import ccir, checkpoint
from aotx_trio.runtime.boot import open_runtime_state
from aotx_trio.runtime.journal_file import JOURNAL_NAME, lock_journal_dir
from aotx_trio.runtime.socket_server import SOCKET_NAME
from aotx_trio.service.client import SocketClient
from aotx_trio.vocab import ALL_GRANTS

pytestmark = pytest.mark.timeout(300)

LIN = bytes.fromhex(LINEAGE)
KEY = "11" * 16


def _extents(rt: Path) -> dict[str, bytes]:
    rf = ccir.RuntimeFile.open(rt)
    raw = rt.read_bytes()
    return {c.name: hashlib.sha256(raw[c.offset:c.offset + c.length]).digest()
            for c in rf.components}


async def _write(journal: Path, rt: Path | None, first_seq: int, n: int) -> list[D.Receipt]:
    """n saved mutations (a register first when first_seq is 1, then spaces)."""
    async with open_runtime_state(LIN, journal, runtime_file=rt) as st:
        async with trio.open_nursery() as nursery:
            await nursery.start(st.emitter.run)
            out = []
            for seq in range(first_seq, first_seq + n):
                kind = D.Kind.REGISTER if seq == 1 else D.Kind.SPACE_CREATE
                out.append(st.device.submit(ALL_GRANTS, KEY, D.Request(
                    kind, LINEAGE, f"{seq:032x}", seq)))
            st.emitter.wake()
            await st.emitter.wait_saved(out[-1].admission_record)
            nursery.cancel_scope.cancel()
    return out


async def _state(journal: Path, rt: Path | None) -> tuple[Any, ...]:
    async with open_runtime_state(LIN, journal, runtime_file=rt) as st:
        spaces, _ = st.device.spaces(ALL_GRANTS, KEY)
        return (st.journal_file.start.records if st.journal_file.start else 0,
                len(st.journal_file.transfers), st.device.usage(),
                st.device.participant(ALL_GRANTS, KEY), spaces)


def test_boot_starts_from_the_shutdown_checkpoint(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    before = _extents(rt)
    j = tmp_path / "j"
    trio.run(_write, j, rt, 1, 5)
    h = ccir.RuntimeFile.open(rt).header
    assert h.profile.required & ccir.PROFILE_CHECKPOINT and h.checkpoint_length > 0
    start, suffix, usage, par, spaces = trio.run(_state, j, rt)
    assert start > 0 and suffix == 0         # nothing after the checkpoint but this boot
    assert usage.admissions == 5 and len(spaces) == 4 and par.next_sequence == 6
    # the same state as a replay of the whole journal (no runtime file: no checkpoint)
    _s, full_suffix, usage2, par2, spaces2 = trio.run(_state, j, None)
    assert full_suffix > 5 and (usage2, par2, spaces2) == (usage, par, spaces)
    assert _extents(rt) == before
    ccir.RuntimeFile.open(rt).verify(progress=False)


def test_checkpoints_alternate_and_never_overwrite_the_current_one(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    rf = ccir.RuntimeFile.open(rt)
    base = ccir.align_up(rf.components_end)
    a = b"A" * 5000
    assert checkpoint.write_section(rt, a) == base
    second = checkpoint.write_section(rt, b"B" * 3000)
    assert second == ccir.align_up(base + 5000)
    assert rt.read_bytes()[base:base + 5000] == a   # the previous one is intact
    assert checkpoint.write_section(rt, b"C" * 4000) == base   # fits before "B"
    assert rt.stat().st_size == base + 4000                     # "B" cut after the flip
    assert checkpoint.write_section(rt, b"D" * 9000) == ccir.align_up(base + 4000)
    assert checkpoint.read_section(rt) == b"D" * 9000


def test_a_torn_checkpoint_write_leaves_the_previous_one(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    checkpoint.write_section(rt, b"A" * 100)
    with rt.open("ab") as f:      # a crash after step 2: new bytes, old header
        f.write(b"\x00" * 4000 + b"torn" * 100)
    assert checkpoint.read_section(rt) == b"A" * 100
    ccir.RuntimeFile.open(rt).verify(progress=False)
    checkpoint.write_section(rt, b"B" * 50)
    assert checkpoint.read_section(rt) == b"B" * 50
    h = ccir.RuntimeFile.open(rt).header
    assert rt.stat().st_size == h.file_length


def _flip_section_byte(rt: Path, at: int) -> None:
    h = ccir.RuntimeFile.open(rt).header
    raw = bytearray(rt.read_bytes())
    raw[h.checkpoint_offset + at] ^= 0x40
    rt.write_bytes(bytes(raw))


@pytest.mark.parametrize("at", [0, 8, 60, 300, -1])
def test_a_damaged_checkpoint_refuses_to_start(tmp_path: Path, at: int) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    trio.run(_write, tmp_path / "j", rt, 1, 3)
    length = ccir.RuntimeFile.open(rt).header.checkpoint_length
    _flip_section_byte(rt, at % length)
    with pytest.raises(errors.CheckpointInvalid) as exc:
        trio.run(_state, tmp_path / "j", rt)
    assert exc.value.code == "checkpoint_damaged"
    assert exc.value.fields["reason"] in ("magic", "version", "checksum")


def test_a_checkpoint_of_another_journal_refuses_to_start(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    trio.run(_write, tmp_path / "a", None, 1, 2)        # journal a: no checkpoint
    trio.run(_write, tmp_path / "b", rt, 1, 2)          # journal b's checkpoint
    with pytest.raises(errors.CheckpointInvalid) as exc:
        trio.run(_state, tmp_path / "a", rt)
    assert exc.value.code == "checkpoint_mismatch"
    assert exc.value.fields["reason"] == "incarnation"
    assert "journal incarnation" in exc.value.message


def test_a_journal_shorter_than_the_checkpoint_refuses_to_start(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    j = tmp_path / "j"
    trio.run(_write, j, rt, 1, 4)
    path = j / JOURNAL_NAME
    records = (path.stat().st_size - FILE_HEADER) // RECORD_SIZE
    os.truncate(path, FILE_HEADER + (records - 2) * RECORD_SIZE)
    (j / "journal.commit").unlink(missing_ok=True)
    with pytest.raises(errors.CheckpointInvalid) as exc:
        trio.run(_state, j, rt)
    assert exc.value.fields["reason"] == "journal_short"
    assert exc.value.fields["records"] == records - 2


def test_a_journal_that_differs_at_the_checkpoint_refuses_to_start(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    j = tmp_path / "j"
    trio.run(_write, j, rt, 1, 4)
    info = checkpoint.parse_section(checkpoint.read_section(rt) or b"")
    path = j / JOURNAL_NAME
    raw = bytearray(path.read_bytes())
    off = FILE_HEADER + (info.anchor.records - 1) * RECORD_SIZE + 40
    raw[off] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(errors.CheckpointInvalid) as exc:
        trio.run(_state, j, rt)
    assert exc.value.fields["reason"] == "digest"
    assert exc.value.fields["record"] == info.anchor.records - 1


def test_a_new_journal_starts_a_new_history(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    trio.run(_write, tmp_path / "a", rt, 1, 3)
    start, _n, usage, _p, _s = trio.run(_state, tmp_path / "new", rt)
    assert start == 0 and usage.admissions == 0
    # its shutdown replaced the checkpoint: journal a is now refused, by name
    with pytest.raises(errors.CheckpointInvalid):
        trio.run(_state, tmp_path / "a", rt)


def test_pack_checkpoint_offline_and_its_refusals(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    j = tmp_path / "j"
    trio.run(_write, j, None, 1, 6)          # a runtime that wrote no checkpoint
    journal_before = (j / JOURNAL_NAME).read_bytes()
    lock = lock_journal_dir(j)               # a running runtime holds the journal
    try:
        with pytest.raises(errors.ConfigError) as exc:
            checkpoint.pack_checkpoint(rt, j)
        assert exc.value.code == "journal_locked"
    finally:
        os.close(lock)
    shared = flock_nb(rt, shared=True)       # ... or the runtime file
    assert shared is not None
    try:
        with pytest.raises(errors.ConfigError) as exc:
            checkpoint.pack_checkpoint(rt, j)
        assert exc.value.code == "runtime_in_use"
    finally:
        os.close(shared)
    done = checkpoint.pack_checkpoint(rt, j)
    assert done.replayed_from == 0 and done.anchor.records == \
        (len(journal_before) - FILE_HEADER) // RECORD_SIZE
    assert (j / JOURNAL_NAME).read_bytes() == journal_before    # never written
    start, suffix, usage, par, _spaces = trio.run(_state, j, rt)
    assert start == done.anchor.records and suffix == 0
    assert usage.admissions == 6 and par.next_sequence == 7
    again = checkpoint.pack_checkpoint(rt, j)                   # from that checkpoint on
    assert again.replayed_from > 0
    assert checkpoint.pack_checkpoint(rt, j, full=True).replayed_from == 0


def test_pack_cli_checkpoint(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    j = tmp_path / "j"
    trio.run(_write, j, None, 1, 2)
    out = subprocess.run([sys.executable, "-m", "aotx_trio", "pack", "--runtime", str(rt),
                          "--checkpoint", str(j)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert "checkpoint:" in out.stdout and "replayed from record 0" in out.stdout
    assert ccir.RuntimeFile.open(rt).header.checkpoint_length > 0


# --------------------------------------------------------------------------- kill -9



def _stop(proc: subprocess.Popen[str], sig: int) -> str:
    try:
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 0), err
    return err



def test_kill9_after_a_checkpoint_keeps_everything_acknowledged(tmp_path: Path) -> None:
    rt = make_runtime_file(tmp_path / "rt")
    folder = short_dir()
    sock = str(folder / "journal" / SOCKET_NAME)
    who = {"principal": "alice", "actions": list(ALL)}
    seen: dict[str, Any] = {}
    try:
        make_config(folder, {"alice": ALL})

        async def session(first: int, count: int) -> None:
            client = SocketClient(sock)
            async with trio.open_nursery() as n:
                await n.start(client.run)
                if first == 1:
                    await client.call("mutation.submit", _body("participant.register", 1))
                    first, count = 2, count - 1
                for seq in range(first, first + count):   # each answered once saved
                    r = await client.call("mutation.submit", _body("space.create", seq))
                    seen.setdefault("spaces", []).append(r["receipt"]["resource"])
                n.cancel_scope.cancel()

        async def read() -> dict[str, Any]:
            client = SocketClient(sock)
            async with trio.open_nursery() as n:
                await n.start(client.run)
                spaces = await client.call("space.list", {**who, "limit": 100})
                me = await client.call("participant.get", who)
                n.cancel_scope.cancel()
            return {"spaces": sorted(s["id"] for s in spaces["items"]), "me": me}

        proc = _boot(rt, folder)
        trio.run(session, 1, 4)
        _stop(proc, signal.SIGTERM)                   # clean: a checkpoint
        ck = checkpoint.parse_section(checkpoint.read_section(rt) or b"")
        proc = _boot(rt, folder)
        trio.run(session, 5, 5)                       # acknowledged after the checkpoint
        with pytest.raises(errors.ConfigError) as exc:  # offline only: this runtime runs
            checkpoint.pack_checkpoint(rt, folder / "journal")
        assert exc.value.code == "runtime_in_use"
        _stop(proc, signal.SIGKILL)
        assert checkpoint.parse_section(checkpoint.read_section(rt) or b"") == ck
        proc = _boot(rt, folder)
        got = trio.run(read)
        err = _stop(proc, signal.SIGTERM)
        assert f"replayed (from record {ck.anchor.records})" in err   # checkpoint + suffix
        assert got["spaces"] == sorted(seen["spaces"]) and len(got["spaces"]) == 8
        assert got["me"]["next_sequence"] == "10"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
