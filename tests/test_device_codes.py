"""The sign rule of native codes (csrc/aotx.h): >0 only for refusals a later retry of the
same call may get past, <0 for every error (malformed, invalid, forbidden, not found,
conflicting, damaged).  Every code the library names is enumerated through
``aotx_code_name``, so a new code with the wrong sign fails here."""

from __future__ import annotations

from aotx_trio.native import lib as native

# Conditions that may clear by themselves: tables and queues that drain, saves that land.
RETRYABLE = frozenset({
    "busy",
    "participants_full", "spaces_full", "conversations_full", "members_full",
    "receipt_table_full", "retirement_blocked", "admission_unsaved", "memory_full",
    "journal_hold", "journal_nothing",
    "kv_pages_exhausted", "kv_seqs_exhausted", "kv_prefix_released",
    "embed_batch_full",
})

ERROR_SUFFIXES = ("_invalid", "_not_found", "_forbidden", "_conflict", "_mismatch", "_damage",
                  "_foreign", "_corrupt", "_unsupported", "_too_large", "_out_of_order",
                  "_state", "_missing", "_error", "_sequence", "_floor", "_terminal")

# Every device code name as aotx_code_name returned it before the renumbering: the
# names are the contract (aotx_trio/errors.py maps by name), the numbers are not.
DEVICE_NAMES = frozenset({
    "lineage_mismatch", "participant_not_found", "sequence_conflict", "future_sequence",
    "below_retry_floor", "operation_key_conflict", "registration_conflict",
    "space_id_conflict", "conversation_id_conflict", "space_not_found",
    "conversation_not_found", "operation_not_found", "member_not_found", "target_not_found",
    "forbidden", "grant_forbidden", "retirement_blocked", "retry_floor_invalid",
    "participants_full", "spaces_full", "conversations_full", "members_full",
    "receipt_table_full", "command_too_large", "result_too_large", "already_terminal",
    "admission_unsaved", "kind_invalid", "operation_key_invalid", "scope_invalid",
    "rights_invalid", "text_invalid", "model_invalid", "media_invalid", "sampling_invalid",
    "status_invalid", "cursor_invalid", "target_sequence_invalid", "reserved_token_invalid",
    "recovery_damage", "device_out_of_order",
    "memory_full", "memory_retained", "memory_not_found", "embedding_invalid",
    "version_conflict", "publication_unsupported", "retention_mode_invalid",
    "lease_invalid", "lease_conflict", "lease_missing", "output_conflict",
})


def _named_codes() -> dict[int, str]:
    codes: dict[int, str] = {}
    for code in range(-999, 1000):
        name = native.code_name(code)
        if name not in ("unknown_error", "unknown_refusal"):
            codes[code] = name
    return codes


def test_every_code_has_the_sign_of_its_class() -> None:
    codes = _named_codes()
    assert codes[0] == "ok"
    wrong = {code: name for code, name in codes.items() if code != 0
             and (code > 0) != (name in RETRYABLE)}
    assert wrong == {}, "positive codes must be retryable refusals, the rest negative"
    for code, name in codes.items():
        if name.endswith(ERROR_SUFFIXES) or name == "forbidden":
            assert code < 0, (code, name)
    # every retryable name exists, and names are unique
    assert RETRYABLE <= set(codes.values())
    assert len(set(codes.values())) == len(codes)


def test_device_codes_keep_their_names() -> None:
    device = {name for code, name in _named_codes().items() if abs(code) // 100 == 1}
    assert device == DEVICE_NAMES
