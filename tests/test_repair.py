"""``aotx repair`` (issue 10 item 2): the operator's explicit repair of a journal the
runtime refuses.  Real ``aotx boot`` / ``aotx repair`` processes on a journal a real
runtime wrote, with one flipped bit in an acknowledged record: boot refuses naming the
offset and touches nothing; repair at that offset keeps every byte it sets aside in
``quarantine/`` (byte for byte), truncates only then, and the runtime starts on the
prefix; repair refuses while a runtime holds the journal, and at a non-record offset."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from _gateway_env import ALL, LINEAGE, make_config, make_runtime_file, short_dir

from aotx_trio.native.journal import FILE_HEADER, RECORD_SIZE, recover_journal
from aotx_trio.runtime import boot

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def folder() -> Iterator[Path]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _submit(kind: str, key: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"principal": "alice", "actions": list(ALL), "kind": kind,
            "body": {"schema": "aotx.shared.mutation.v1", "lineage": LINEAGE,
                     "operation_key": f"{key:032x}", "sequence": str(seq), **fields}}


def _aotx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aotx_trio", *args], capture_output=True,
                          text=True, timeout=90, env={**os.environ, "PYTHONPATH": str(ROOT)})


async def _write(ccir: Path, folder: Path, spaces: int) -> None:
    async with trio.open_nursery() as n:
        h = await n.start(boot.run_runtime, ccir, folder / "journal", folder / "grants")
        await h.call("mutation.submit", _submit("participant.register", 1, 1))
        for i in range(2, 2 + spaces):
            await h.call("mutation.submit", _submit("space.create", i, i, scope="private"))
        n.cancel_scope.cancel()


async def _spaces(ccir: Path, folder: Path) -> int:
    async with trio.open_nursery() as n:
        h = await n.start(boot.run_runtime, ccir, folder / "journal", folder / "grants")
        out = await h.call("space.list", {"principal": "alice", "actions": list(ALL)})
        n.cancel_scope.cancel()
    return len(out["items"])


def test_repair_sets_the_damaged_bytes_aside_and_the_runtime_starts(
        tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    journal = folder / "journal"
    trio.run(_write, ccir, folder, 6)
    path = journal / "journal.aotxj"
    good = path.read_bytes()
    transfers = recover_journal(good).transfers
    victim = transfers[len(transfers) // 2]        # an acknowledged transfer mid-file
    bad = bytearray(good)
    bad[FILE_HEADER + RECORD_SIZE * victim.first_record + 40] ^= 0x01   # one bit of data
    path.write_bytes(bytes(bad))

    refused = _aotx("boot", "--ccir", str(ccir), "--journal", str(journal),
                    "--service-grants", str(folder / "grants"))
    assert refused.returncode == 1 and "journal_damage" in refused.stderr, refused.stderr
    at = int(re.findall(r"byte offset (\d+)", refused.stderr)[-1])
    assert path.read_bytes() == bad                # the refusal touched nothing

    for wrong in (str(at + 1), "10"):              # not a record offset: refused, untouched
        out = _aotx("repair", "--journal", str(journal), "--at", wrong)
        assert out.returncode == 1 and "invalid" in out.stderr, out.stderr
        assert path.read_bytes() == bad

    done = _aotx("repair", "--journal", str(journal), "--at", str(at))
    assert done.returncode == 0, done.stderr
    end = len(path.read_bytes())
    assert end <= at and (end - FILE_HEADER) % RECORD_SIZE == 0
    assert path.read_bytes() == bytes(bad[:end])
    (kept,) = (journal / "quarantine").glob(f"repair-{end}-*.aotxj")
    assert kept.read_bytes() == bytes(bad[end:])   # every byte set aside is kept
    assert f"{len(bad) - end} bytes set aside in {kept}" in done.stdout

    # the runtime file's checkpoint (written at the clean stop) covers the cut records:
    # refused, named, until it is rebuilt from what the journal kept
    stale = _aotx("boot", "--ccir", str(ccir), "--journal", str(journal),
                  "--service-grants", str(folder / "grants"))
    assert stale.returncode == 1 and "checkpoint" in stale.stderr, stale.stderr
    assert "--full-replay" in done.stdout
    rebuilt = _aotx("pack", "--runtime", str(ccir), "--checkpoint", str(journal),
                    "--full-replay")
    assert rebuilt.returncode == 0, rebuilt.stderr
    spaces = trio.run(_spaces, ccir, folder)       # the runtime starts on the prefix
    assert 0 <= spaces < 6


def test_repair_refuses_a_journal_a_runtime_holds(tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    make_config(folder, {"alice": ALL})
    journal = folder / "journal"

    async def main() -> subprocess.CompletedProcess[str]:
        async with trio.open_nursery() as n:
            await n.start(boot.run_runtime, ccir, journal, folder / "grants")
            before = (journal / "journal.aotxj").read_bytes()
            out = await trio.to_thread.run_sync(
                lambda: _aotx("repair", "--journal", str(journal), "--at", str(FILE_HEADER)))
            assert (journal / "journal.aotxj").read_bytes() == before
            n.cancel_scope.cancel()
        return out

    out = trio.run(main)
    assert out.returncode == 1 and "journal_locked" in out.stderr, out.stderr
    assert not (journal / "quarantine").exists()
