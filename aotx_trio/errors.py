"""The exception tree of aotx-trio (the one errors module).

::

    AotxError                      .code (snake_case), .message, .fields, .rc
    ├── Refusal                    recoverable: the same request may succeed later
    │   ├── JournalHold            journal_hold         journal paused by file cap / disk pressure
    │   ├── ReceiptTableFull       receipt_table_full   no free receipt until a retirement
    │   ├── OverCapacity           over_capacity        KV pages / queue full (retry_after)
    │   └── CapacityExhausted      capacity_exhausted   a fixed table is full
    ├── RequestError               the request itself is wrong for the current state
    │   ├── SequenceConflict       sequence_conflict    other bytes at a known or a future sequence
    │   ├── BelowRetryFloor        below_retry_floor    sequence below the saved retry floor
    │   ├── Conflict               conflict             other state conflicts
    │   ├── NotFound               not_found            unknown, or not visible to the caller
    │   ├── Forbidden              forbidden            grant or space right missing
    │   └── InvalidInput           invalid_argument     bad field or value (.fields["field"])
    ├── FormatError                a file is corrupt, foreign or from the future (.fields["offset"])
    │   ├── JournalDamage          journal_damage       damage before the tail: refuse to start
    │   └── UnsupportedProfile     unsupported_profile  a required profile this reader lacks
    ├── ConfigError                configuration invalid (names the key)
    └── NativeError                any other native error (<0): io_error, internal_error, ...
        └── DiskError              disk_error           write/fsync failed

Native return codes are translated in one place, :func:`aotx_trio.native.check`,
which calls :func:`from_native` here.  HTTP status codes for each class live in
``HTTP_STATUS`` so that every HTTP surface renders the one error envelope of
``shared-api.md``.
"""

from __future__ import annotations

from typing import Any


class AotxError(Exception):
    """Base of every error this package raises on purpose."""

    default_code = "error"

    def __init__(self, message: str, *, code: str | None = None, rc: int | None = None,
                 **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.rc = rc
        self.fields = fields

    def envelope(self) -> dict[str, Any]:
        """The error body of shared-api.md: {"error": {"code", "message", ...fields}}."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        body.update(self.fields)
        return {"error": body}


class Refusal(AotxError):
    default_code = "refused"


class JournalHold(Refusal):
    default_code = "journal_hold"


class ReceiptTableFull(Refusal):
    default_code = "receipt_table_full"


class OverCapacity(Refusal):
    default_code = "over_capacity"


class CapacityExhausted(Refusal):
    default_code = "capacity_exhausted"


class RequestError(AotxError):
    default_code = "bad_request"


class SequenceConflict(RequestError):
    default_code = "sequence_conflict"


class BelowRetryFloor(RequestError):
    default_code = "below_retry_floor"


class Conflict(RequestError):
    default_code = "conflict"


class NotFound(RequestError):
    default_code = "not_found"


class Forbidden(RequestError):
    default_code = "forbidden"


class InvalidInput(RequestError):
    default_code = "invalid_argument"


class FormatError(AotxError):
    default_code = "format_error"


class JournalDamage(FormatError):
    default_code = "journal_damage"


class UnsupportedProfile(FormatError):
    default_code = "unsupported_profile"


class ConfigError(AotxError):
    default_code = "config_error"


class NativeError(AotxError):
    default_code = "native_error"


class DiskError(NativeError):
    default_code = "disk_error"


HTTP_STATUS: dict[type[AotxError], int] = {
    JournalHold: 429,
    ReceiptTableFull: 429,
    OverCapacity: 429,
    CapacityExhausted: 507,
    SequenceConflict: 409,
    BelowRetryFloor: 410,
    Conflict: 409,
    NotFound: 404,
    Forbidden: 403,
    InvalidInput: 422,
    RequestError: 400,
    Refusal: 429,
    AotxError: 500,
}


def http_status(exc: AotxError) -> int:
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


# Native code names (aotx_code_name) -> exception class.  A name not listed
# falls back by sign: >0 Refusal, <0 NativeError.  Prefix rules below catch
# families (every "*_not_found" is NotFound, and so on).
_BY_NAME: dict[str, type[AotxError]] = {
    "journal_hold": JournalHold,
    "receipt_table_full": ReceiptTableFull,
    "over_capacity": OverCapacity,
    "kv_pages_exhausted": OverCapacity,
    "capacity_exhausted": CapacityExhausted,
    "participants_full": CapacityExhausted,
    "spaces_full": CapacityExhausted,
    "conversations_full": CapacityExhausted,
    "members_full": CapacityExhausted,
    "sequence_conflict": SequenceConflict,
    "future_sequence": SequenceConflict,
    "below_retry_floor": BelowRetryFloor,
    "conflict": Conflict,
    "retirement_blocked": Conflict,
    "not_found": NotFound,
    "forbidden": Forbidden,
    "invalid_argument": InvalidInput,
    "journal_damage": JournalDamage,
    "journal_foreign": FormatError,
    "unsupported_profile": UnsupportedProfile,
    "lineage_mismatch": Conflict,
    "command_too_large": InvalidInput,
    "result_too_large": InvalidInput,
    "already_terminal": Conflict,
    "disk_error": DiskError,
    "io_error": DiskError,
}

_BY_SUFFIX: list[tuple[str, type[AotxError]]] = [
    ("_not_found", NotFound),
    ("_conflict", Conflict),
    ("_full", CapacityExhausted),
    ("_forbidden", Forbidden),
    ("_damage", JournalDamage),
    ("_corrupt", FormatError),
    ("_unsupported", FormatError),
    ("_invalid", InvalidInput),
]


def from_native(rc: int, name: str, message: str, **fields: Any) -> AotxError:
    cls = _BY_NAME.get(name)
    if cls is None:
        for suffix, c in _BY_SUFFIX:
            if name.endswith(suffix):
                cls = c
                break
    if cls is None:
        cls = Refusal if rc > 0 else NativeError
    return cls(message, code=name, rc=rc, **fields)
