"""The runtime process: refuses to start without the shared profile or the
deployment grants, recovers its state from the journal, fails closed on damage,
and shuts down cleanly on SIGTERM/SIGINT (socket removed, nothing left running)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import synth_gguf as sg
import trio
from _gateway_env import ALL, LINEAGE, TINY, make_config, make_runtime_file, short_dir

from aotx_trio import errors
from aotx_trio.runtime import boot, pack
from aotx_trio.runtime.socket_server import SOCKET_NAME


@pytest.fixture
def folder() -> Any:
    import shutil

    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _submit(kind: str, key: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"principal": "alice", "actions": list(ALL), "kind": kind,
            "body": {"schema": "aotx.shared.mutation.v1", "lineage": LINEAGE,
                     "operation_key": f"{key:032x}", "sequence": str(seq), **fields}}


async def test_refuses_a_runtime_file_without_the_shared_profile(tmp_path: Path,
                                                                  folder: Path) -> None:
    gguf = sg.write_model(tmp_path / "m.gguf", TINY)
    plain = pack.pack(tmp_path / "plain.aotxccir", models=[gguf], progress=False)
    make_config(folder, {"alice": ALL})
    with pytest.raises(errors.UnsupportedProfile) as info:
        await boot.run_runtime(plain.path, folder / "journal", folder / "grants")
    assert "--shared" in info.value.message
    assert not (folder / "journal").exists()


async def test_serves_nothing_without_deployment_grants(tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    with pytest.raises(errors.ConfigError) as info:
        await boot.run_runtime(ccir, folder / "journal", folder / "no-grants")
    assert info.value.code == "grants_missing"
    assert not (folder / "journal" / SOCKET_NAME).exists()


async def test_state_survives_a_restart(tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    journal = folder / "journal"
    async with trio.open_nursery() as n:
        h = await n.start(boot.run_runtime, ccir, journal, folder / "grants")
        assert (journal / SOCKET_NAME).exists()
        first = await h.call("mutation.submit", _submit("participant.register", 1, 1))
        space = await h.call("mutation.submit", _submit("space.create", 2, 2, scope="room"))
        assert first["created"] and space["created"]
        n.cancel_scope.cancel()
    assert not (journal / SOCKET_NAME).exists()
    async with trio.open_nursery() as n:
        h = await n.start(boot.run_runtime, ccir, journal, folder / "grants")
        again = await h.call("mutation.submit", _submit("space.create", 2, 2, scope="room"))
        assert not again["created"]
        assert again["receipt"]["operation"] == space["receipt"]["operation"]
        frozen = ("file_incarnation", "generation", "boot", "commit_digest", "saved_records")
        assert again["receipt"]["save"]["boot"] == "1"      # the save that acknowledged it
        assert {k: again["receipt"]["save"][k] for k in frozen} == \
            {k: space["receipt"]["save"][k] for k in frozen}
        me = await h.call("participant.get", {"principal": "alice", "actions": list(ALL)})
        assert me["next_sequence"] == "3"
        got = await h.call("space.get", {"principal": "alice", "actions": list(ALL),
                                         "space": space["receipt"]["resource"]})
        assert got["scope"] == "room"
        n.cancel_scope.cancel()


async def test_receipt_save_fields_are_frozen(tmp_path: Path, folder: Path) -> None:
    """Each receipt names the save that acknowledged it (source, incarnation, generation,
    boot, commit digest), never the journal's state when read: unchanged by later saves
    and rebuilt alike after a restart."""
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    journal = folder / "journal"
    ident = ("source", "file_incarnation", "generation", "boot", "commit_digest",
             "saved_records")

    async def save_of(h: Any, receipt: dict[str, Any]) -> dict[str, Any]:
        got = await h.call("operation.get", {"principal": "alice", "actions": list(ALL),
                                             "operation": receipt["operation"]})
        return {k: got["save"][k] for k in ident}

    async with trio.open_nursery() as n:
        h = await n.start(boot.run_runtime, ccir, journal, folder / "grants")
        first = (await h.call("mutation.submit", _submit("participant.register", 1, 1)))
        second = (await h.call("mutation.submit", _submit("space.create", 2, 2)))
        a, b = (r["receipt"] for r in (first, second))
        a_save, b_save = ({k: r["save"][k] for k in ident} for r in (a, b))
        # two ticks of one boot: the same file and boot, another generation and digest
        assert a_save["source"] == "journal" and a_save["boot"] == b_save["boot"] == "1"
        assert a_save["file_incarnation"] == b_save["file_incarnation"]
        assert int(b_save["generation"]) > int(a_save["generation"]) >= 1
        assert a_save["commit_digest"] != b_save["commit_digest"]
        assert int(a_save["saved_records"]) > int(a["admission"]["record"])
        for i in range(3, 6):   # later saves move the journal on, not these receipts
            await h.call("mutation.submit", _submit("space.create", i, i))
        state = await h.call("save_state", {})
        assert int(state["generation"]) > int(b_save["generation"])
        assert await save_of(h, a) == a_save and await save_of(h, b) == b_save
        n.cancel_scope.cancel()
    async with trio.open_nursery() as n:
        h = await n.start(boot.run_runtime, ccir, journal, folder / "grants")
        assert await save_of(h, a) == a_save and await save_of(h, b) == b_save
        third = (await h.call("mutation.submit", _submit("space.create", 6, 6)))["receipt"]
        c_save = {k: third["save"][k] for k in ident}
        assert c_save["boot"] == "2" and int(c_save["generation"]) > int(b_save["generation"])
        assert await save_of(h, a) == a_save
        n.cancel_scope.cancel()
    async with trio.open_nursery() as n:   # and again after a second restart
        h = await n.start(boot.run_runtime, ccir, journal, folder / "grants")
        assert await save_of(h, a) == a_save and await save_of(h, third) == c_save
        n.cancel_scope.cancel()


async def test_journal_cap_and_disk_floor_hold_writes(tmp_path: Path, folder: Path) -> None:
    """limits.journal_max_bytes / --journal-max-bytes and the free-disk floor: writes are
    refused with the retryable journal_hold before a write fails; saved data stays."""
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    journal = folder / "journal"
    path = journal / "journal.aotxj"
    small = boot.JournalLimits(max_bytes=64 + 192 * 8, min_free_bytes=0)
    async with trio.open_nursery() as n:
        h = await n.start(functools.partial(boot.run_runtime, ccir, journal, folder / "grants",
                                            journal_limits=small))
        await h.call("mutation.submit", _submit("participant.register", 1, 1))
        seq = 2
        with pytest.raises(errors.JournalHold):
            for seq in range(2, 10):
                await h.call("mutation.submit", _submit("space.create", seq, seq))
        assert path.stat().st_size <= small.max_bytes
        me = await h.call("participant.get", {"principal": "alice", "actions": list(ALL)})
        assert me["next_sequence"] == str(seq)           # the refused one changed nothing
        state = await h.call("save_state", {})
        assert state["hold"] == ["file_cap"] and state["pending_bytes"] == 0
        n.cancel_scope.cancel()
    saved = path.read_bytes()
    # a floor above the free space: writes held from the start (only the boot record,
    # queued before, is written into the margin); reads still answer
    free = os.statvfs(journal).f_bavail * os.statvfs(journal).f_frsize
    floor = boot.JournalLimits(max_bytes=0, min_free_bytes=free + (1 << 40))
    async with trio.open_nursery() as n:
        h = await n.start(functools.partial(boot.run_runtime, ccir, journal, folder / "grants",
                                            journal_limits=floor))
        with pytest.raises(errors.JournalHold):
            await h.call("mutation.submit", _submit("space.create", seq, seq))
        state = await h.call("save_state", {})
        assert state["hold"] == ["disk"] and state["disk_error"] is None
        me = await h.call("participant.get", {"principal": "alice", "actions": list(ALL)})
        assert me["next_sequence"] == str(seq)
        n.cancel_scope.cancel()
    assert path.read_bytes()[:len(saved)] == saved
    # room again (the defaults): the same request is admitted
    async with trio.open_nursery() as n:
        h = await n.start(boot.run_runtime, ccir, journal, folder / "grants")
        got = await h.call("mutation.submit", _submit("space.create", seq, seq))
        assert got["created"] and got["receipt"]["admission"]["saved"]
        n.cancel_scope.cancel()


def test_journal_flags_reach_the_runtime() -> None:
    from aotx_trio import cli, config

    args = cli._parser().parse_args(["boot", "--ccir", "c", "--journal", "j",
                                     "--service-grants", "g", "--journal-max-bytes", "4096"])
    limits = boot.JournalLimits.of(config.Limits(), args.journal_max_bytes,
                                   args.journal_min_free_bytes)
    assert limits == boot.JournalLimits(4096, config.Limits().journal_min_free_bytes)
    args = cli._parser().parse_args(["serve", "--journal-min-free-bytes", "0"])
    cfg = config.Limits(journal_max_bytes=1 << 20)
    assert boot.JournalLimits.of(cfg, args.journal_max_bytes, args.journal_min_free_bytes) \
        == boot.JournalLimits(1 << 20, 0)
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["serve", "--journal-max-bytes", "-1"])


async def test_journal_damage_fails_closed(tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    journal = folder / "journal"
    async with trio.open_nursery() as n:
        h = await n.start(boot.run_runtime, ccir, journal, folder / "grants")
        for i in range(1, 4):
            await h.call("mutation.submit", _submit("participant.register", 1, 1) if i == 1
                         else _submit("space.create", i, i))
        n.cancel_scope.cancel()
    path = journal / "journal.aotxj"
    data = bytearray(path.read_bytes())
    data[64 + 192 + 40] ^= 0xFF   # a data byte of the second record: not a torn tail
    path.write_bytes(bytes(data))
    with pytest.raises(errors.FormatError):
        await boot.run_runtime(ccir, journal, folder / "grants")
    assert not (journal / SOCKET_NAME).exists()


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, proc.communicate(timeout=30)
        assert time.monotonic() < deadline, "runtime did not start"
        time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_aotx_boot_stops_cleanly_on_signal(tmp_path: Path, folder: Path, signum: int) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    sock = folder / "journal" / SOCKET_NAME
    proc = subprocess.Popen(
        [sys.executable, "-m", "aotx_trio", "boot", "--ccir", str(ccir), "--journal",
         str(folder / "journal"), "--service-grants", str(folder / "grants")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        _wait_for(sock, proc)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"lineage {LINEAGE}" in out
    assert "aotx boot: stopped" in out
    assert not sock.exists()


def test_aotx_boot_reports_damage_and_exits_1(tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    journal = folder / "journal"
    journal.mkdir()
    (journal / "journal.aotxj").write_bytes(b"NOTAJRNL" + bytes(120))
    proc = subprocess.run(
        [sys.executable, "-m", "aotx_trio", "boot", "--ccir", str(ccir), "--journal",
         str(journal), "--service-grants", str(folder / "grants")],
        capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("aotx boot: journal_")
    assert not (journal / SOCKET_NAME).exists()


def _boot_cmd(ccir: Path, folder: Path) -> list[str]:
    return [sys.executable, "-m", "aotx_trio", "boot", "--ccir", str(ccir), "--journal",
            str(folder / "journal"), "--service-grants", str(folder / "grants")]


def test_a_second_runtime_on_a_locked_journal_refuses_and_touches_nothing(
        tmp_path: Path, folder: Path) -> None:
    """Two real `aotx boot` processes on one journal folder: the second refuses with a clear
    message before reading anything; the journal's bytes and the first runtime are untouched."""
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    journal = folder / "journal"
    path = journal / "journal.aotxj"
    first = subprocess.Popen(_boot_cmd(ccir, folder), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        _wait_for(journal / SOCKET_NAME, first)
        deadline = time.monotonic() + 30
        while path.stat().st_size < 64 + 192:             # its boot record is saved
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)                                   # and its commit watermark
        before = path.read_bytes()
        sock_before = (journal / SOCKET_NAME).stat().st_ino
        second = subprocess.run(_boot_cmd(ccir, folder), capture_output=True, text=True,
                                timeout=60, env=dict(os.environ))
        assert second.returncode == 1
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith("aotx boot: journal_locked: ") and "in use" in last
        assert f"pid {first.pid}" in last
        assert path.read_bytes() == before                # not one byte written
        assert not (journal / "quarantine").exists()
        assert (journal / SOCKET_NAME).stat().st_ino == sock_before
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        _out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    # the lock goes with the process: the next runtime starts
    third = subprocess.Popen(_boot_cmd(ccir, folder), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        _wait_for(journal / SOCKET_NAME, third)
        third.send_signal(signal.SIGTERM)
        third.communicate(timeout=60)
    finally:
        if third.poll() is None:
            third.kill()
    assert third.returncode == 0


async def test_pack_refuses_a_runtime_file_in_use(tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    before = ccir.read_bytes()
    cmd = [sys.executable, "-m", "aotx_trio", "pack", "--runtime", str(ccir), "--shared"]
    async with trio.open_nursery() as n:
        await n.start(boot.run_runtime, ccir, folder / "journal", folder / "grants")
        with trio.fail_after(60):
            proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True,
                                          check=False, env=dict(os.environ))
        assert proc.returncode == 1
        assert b"runtime_in_use" in proc.stderr and b"in use by a running runtime" in proc.stderr
        with pytest.raises(errors.ConfigError) as info:
            pack.pack(ccir, shared=True, lineage="ff" * 16)
        assert info.value.code == "runtime_in_use"
        assert ccir.read_bytes() == before
        n.cancel_scope.cancel()
    stopped = ccir.read_bytes()                   # the stop wrote its state checkpoint
    assert stopped != before and stopped[:len(before)][4096:] == before[4096:]
    with trio.fail_after(60):
        proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True,
                                      check=False, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr      # the runtime stopped: the lock went with it
    assert ccir.read_bytes() == stopped           # already shared: nothing to write
