"""render.receipt_json writes exactly the bytes of the gateway's encoder over
render.render_receipt, for any receipt the device can show."""

from __future__ import annotations

import errno

from hypothesis import given
from hypothesis import strategies as st

from aotx_trio.gateway.errors import dumps
from aotx_trio.native.device import Receipt
from aotx_trio.native.journal import SaveId, SaveState
from aotx_trio.runtime import render
from aotx_trio.vocab import FINISH_CODES, STATUSES, Kind, finish_of

HEX16 = st.binary(min_size=16, max_size=16).map(bytes.hex)
U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
LINEAGE = "0123456789abcdef0123456789abcdef"

saves = st.builds(SaveState, saved_records=U64, pending_bytes=U64, file_incarnation=U64,
                  generation=U64, boot=U64,
                  commit_digest=st.binary(min_size=32, max_size=32),
                  disk_error=st.sampled_from([0, errno.EIO, errno.ENOSPC, 9999, -3]),
                  hold=st.integers(0, 7))
save_ids = st.builds(SaveId, file_incarnation=U64, generation=U64, boot=U64,
                     commit_records=U64,
                     commit_digest=st.binary(min_size=32, max_size=32))


@st.composite
def receipts(draw: st.DrawFn) -> Receipt:
    status = draw(st.sampled_from(STATUSES))
    foreign = draw(st.booleans())
    return Receipt(
        op_id=draw(HEX16), kind=draw(st.sampled_from(list(Kind))), status=status,
        participant=draw(HEX16), sequence=None if foreign else draw(U64),
        operation_key=None if foreign else draw(HEX16), retry=draw(st.booleans()),
        device_committed=draw(st.booleans()), admission_saved=draw(st.booleans()),
        terminal_saved=draw(st.booleans()), cancel_requested=draw(st.booleans()),
        admission_number=draw(U64), admission_record=draw(U64),
        terminal_record=draw(st.none() | U64),
        resource_id=draw(st.just("0" * 32) | HEX16), result_len=draw(U32),
        input_tokens=draw(U32), output_tokens=draw(U32), save=draw(saves),
        saved_by=draw(st.none() | save_ids), input_index=draw(U64),
        finish=finish_of(status, draw(st.integers(0, len(FINISH_CODES) - 1))))


@given(receipts())
def test_receipt_json_is_the_encoded_render(r: Receipt) -> None:
    assert render.receipt_json(r, LINEAGE) == \
        dumps(render.render_receipt(r, LINEAGE)).encode("utf-8")


def test_receipt_json_of_a_saved_admission() -> None:
    """One fixed receipt, byte for byte (a saved member.set)."""
    r = Receipt(op_id="ab" * 16, kind=Kind.MEMBER_SET, status="succeeded",
                participant="cd" * 16, sequence=7, operation_key="ef" * 16, retry=False,
                device_committed=True, admission_saved=True, terminal_saved=True,
                cancel_requested=False, admission_number=12, admission_record=40,
                terminal_record=41, resource_id="12" * 16, result_len=0, input_tokens=0,
                output_tokens=0,
                save=SaveState(saved_records=42, pending_bytes=0, file_incarnation=255,
                               generation=9, boot=1, commit_digest=bytes(32), disk_error=0,
                               hold=4),
                saved_by=SaveId(file_incarnation=255, generation=8, boot=1,
                                commit_records=42, commit_digest=b"\x77" * 32),
                finish=None)
    lin = LINEAGE
    assert render.receipt_json(r, lin).decode() == (
        f'{{"operation":"op-{lin}-{"ab" * 16}","kind":"member.set","status":"succeeded",'
        f'"participant":"par-{lin}-{"cd" * 16}","operation_key":"{"ef" * 16}",'
        f'"sequence":"7","resource":"spc-{lin}-{"12" * 16}","transport":{{"accepted":true}},'
        '"device":{"committed":true,"admission_number":"12"},'
        '"admission":{"saved":true,"record":"40"},"terminal":{"saved":true,"record":"41"},'
        '"cancel_requested":false,"finish":null,'
        '"result":{"bytes":0,"input_tokens":0,"output_tokens":0},'
        '"save":{"source":"journal","file_incarnation":"00000000000000ff",'
        f'"generation":"8","boot":"1","commit_digest":"{"77" * 32}","saved_records":"42",'
        '"pending_bytes":0,"disk_error":null,"hold":["pending_cap"]}}')


@given(st.none() | st.text() | st.text(alphabet="abcdefXYZ0129_-\"\\\u00e9\u2028\x00"))
def test_js_is_the_encoders_json_of_any_string(value: str | None) -> None:
    assert render._js(value) == dumps(value)
