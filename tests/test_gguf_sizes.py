"""Sizes read from a GGUF never overflow what is computed from them (issue 10, "Smaller").

The vocabulary size comes from the row count of ``token_embd.weight``, a 64-bit
dimension: a hostile file that names 2^31 rows or more (the file made that long
as a sparse file, so the reader's bounds check passes) must be refused at load,
never truncated to 32 bits (a truncated count sizes the logits buffer while the
64-bit one drives the loops over it).  Each case loads in a child process, so a
crash is a failure of this test rather than of the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import synth_gguf as sg
from gguf import GGUFReader

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent
TINY = sg.Spec(d_model=64, n_layers=1, d_ff=128, n_heads=2, n_kv_heads=1, head_dim=32,
               n_vocab=320, types=(sg.Q.Q8_0,), embd_type=sg.Q.Q8_0)
# rows of token_embd.weight a file may claim: each truncates in int32 (before the fix:
# "negative array length", "tokens[0] = 2 outside 0..-1", and a segfault at 2^32 + 320)
ROWS = [2**31, 2**31 + 320, 2**32, 2**32 + 320]

CHILD = """
import json, sys
from aotx_trio import errors
from aotx_trio.native.engine import Engine
try:
    eng = Engine.load(sys.argv[1], threads=1, max_seqs=2, max_tokens=64, max_batch_tokens=16)
except errors.AotxError as exc:
    print(json.dumps({"refused": exc.code, "message": str(exc)}))
else:
    with eng:
        ids = eng.tokenize(b"the capital")
        out = list(eng.generate(ids[:4], max_tokens=2))
    print(json.dumps({"loaded": True, "out": len(out)}))
"""


def _lying_model(tmp_path: Path, rows: int) -> Path:
    path = sg.write_model(tmp_path / f"rows-{rows}.gguf", TINY)
    ref = GGUFReader(str(path))
    (embd,) = [t for t in ref.tensors if t.name == "token_embd.weight"]
    dims = embd.field.parts[3]                       # the u64 dims: [d_model, rows]
    at = int(dims.ctypes.data - ref.data.ctypes.data) + 8
    data_offset = int(ref.data_offset)
    embd_offset = int(embd.field.parts[5][0])
    del ref, embd, dims
    raw = bytearray(path.read_bytes())
    assert int.from_bytes(raw[at:at + 8], "little") == TINY.n_vocab
    raw[at:at + 8] = rows.to_bytes(8, "little")
    path.write_bytes(raw)
    row_bytes = TINY.d_model // 32 * 34                # Q8_0: 34 bytes per 32 weights
    os.truncate(path, max(len(raw), data_offset + embd_offset + rows * row_bytes))  # sparse
    return path


@pytest.mark.parametrize("rows", ROWS)
def test_a_vocabulary_past_int32_is_refused(tmp_path: Path, rows: int) -> None:
    path = _lying_model(tmp_path, rows)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                         text=True, timeout=100, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, f"the load crashed ({out.returncode}): {out.stderr[-2000:]}"
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got.get("refused", "").startswith("model_"), got
