"""The exception tree of aotx-trio: every exception class of the package lives here
(the errors under :class:`AotxError`, the control-flow signals under :class:`Signal`).

::

    AotxError                 .code, .message, .fields, .rc, .native (code name)     500
    ├── Refusal                      recoverable: the same request may succeed later 429
    │   ├── JournalHold              journal_hold         file cap / disk pressure   429
    │   ├── ReceiptTableFull         receipt_table_full   until a retirement         429
    │   ├── OverCapacity             over_capacity        KV pages / queue full      429
    │   ├── CapacityExhausted        capacity_exhausted   a fixed table is full      507
    │   ├── RuntimeUnavailable       runtime_unavailable  service socket down        503
    │   ├── NotReady                 not_ready            deployment/store not ready 503
    │   └── SavePending              save_pending         admitted, not yet saved    503
    ├── RequestError                 the request is wrong for the current state      400
    │   ├── BadRequest               invalid_utf8, malformed_json, schema_invalid    400
    │   ├── Unauthorized             unauthorized         token missing or wrong     401
    │   ├── Forbidden                forbidden            grant or space right       403
    │   ├── NotFound                 not_found            unknown or invisible       404
    │   ├── MethodNotAllowed         method_not_allowed                              405
    │   ├── Conflict                 conflict             other state conflicts      409
    │   │   └── SequenceConflict     sequence_conflict    other bytes / future seq   409
    │   ├── BelowRetryFloor          below_retry_floor                               410
    │   ├── Gone                     gone                 removed / expired / closed 410
    │   ├── BodyTooLarge             body_too_large                                  413
    │   ├── UnsupportedMediaType     unsupported_media_type  JSON under another type 415
    │   └── InvalidInput             invalid_argument     bad field (.fields[field]) 422
    │       └── InvalidParams        invalid_params       .fields: param, rule       422
    ├── FormatError                  a file or frame is corrupt, foreign, too new    500
    │   ├── JournalDamage            journal_damage       refuse to start            500
    │   ├── UnsupportedProfile       unsupported_profile                             500
    │   ├── CheckpointInvalid        checkpoint_damaged / checkpoint_mismatch        500
    │   └── FrameError               frame_invalid        service-socket framing     500
    ├── DeadlineExceeded             deadline_exceeded    execution deadline passed  504
    ├── UpstreamFailure              upstream_failure     the runtime / an upload    502
    ├── ConfigError                  config_error         names the key              500
    └── NativeError                  any other native error (<0)                     500
        └── DiskError                disk_error           write / fsync failed       500

    Signal                    not an error of a request: one function telling its caller
    │                         something; never rendered, never an AotxError
    ├── OutboundFailed        .reason: an outbound request got no status (pinned_http)
    ├── ClientGone            the client left before its body arrived (gateway fast path)
    ├── H2cRefused            the h2c preface was answered: close (gateway/listen.py)
    └── LeaseLost             a webhook delivery lease passed on: take it again

The number ending each line is the class's HTTP ``status`` (a class
attribute); :func:`http_parts` is the one map from an error to (status, the
error envelope of docs/api.md, headers) that every HTTP surface uses.
Native return codes become errors through one explicit table,
:data:`NATIVE`, keyed by the code's name (``aotx_code_name``);
:func:`aotx_trio.native.lib.check` is its only caller.  A test checks that every
code the library names is in the table.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("aotx.errors")


class AotxError(Exception):
    """Base of every error this package raises on purpose."""

    default_code = "error"
    status = 500

    def __init__(self, message: str, *, code: str | None = None, rc: int | None = None,
                 **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.rc = rc
        self.fields = fields
        #: the native code's own name (``aotx_code_name``) when a native call raised it
        self.native: str | None = None

    def envelope(self) -> dict[str, Any]:
        """The error body of docs/api.md: {"error": {"code", "message", ...fields}}."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        body.update(self.fields)
        return {"error": body}


class Refusal(AotxError):
    default_code = "refused"
    status = 429


class JournalHold(Refusal):
    default_code = "journal_hold"


class ReceiptTableFull(Refusal):
    default_code = "receipt_table_full"


class OverCapacity(Refusal):
    default_code = "over_capacity"


class CapacityExhausted(Refusal):
    default_code = "capacity_exhausted"
    status = 507


class RuntimeUnavailable(Refusal):
    """The runtime's service socket is not connected."""

    default_code = "runtime_unavailable"
    status = 503


class NotReady(Refusal):
    """Something a request needs is not ready: a deployment, an engine set, a scratch
    revision, or the registry store itself (the seed's ``not_ready``, ``missing``)."""

    default_code = "not_ready"
    status = 503


class SavePending(Refusal):
    """The device admitted the operation but the journal did not save it in time (disk
    trouble); an exact retry answers once it is saved."""

    default_code = "save_pending"
    status = 503


class RequestError(AotxError):
    default_code = "bad_request"
    status = 400


class BadRequest(RequestError):
    """The body cannot be read as a request at all."""

    default_code = "bad_request"


class Unauthorized(RequestError):
    default_code = "unauthorized"
    status = 401


class Forbidden(RequestError):
    default_code = "forbidden"
    status = 403


class NotFound(RequestError):
    default_code = "not_found"
    status = 404


class MethodNotAllowed(RequestError):
    default_code = "method_not_allowed"
    status = 405


class Conflict(RequestError):
    default_code = "conflict"
    status = 409


class SequenceConflict(Conflict):
    default_code = "sequence_conflict"


class BelowRetryFloor(RequestError):
    default_code = "below_retry_floor"
    status = 410


class Gone(RequestError):
    """The resource existed and never will again: an unpublished model
    (``model_removed``), an expired or closed scratch session."""

    default_code = "gone"
    status = 410


class BodyTooLarge(RequestError):
    default_code = "body_too_large"
    status = 413


class UnsupportedMediaType(RequestError):
    """A JSON body declared as another ``Content-Type``."""

    default_code = "unsupported_media_type"
    status = 415


class InvalidInput(RequestError):
    default_code = "invalid_argument"
    status = 422


class InvalidParams(InvalidInput):
    """A caller's field is wrong: ``param`` names it (a path such as
    ``output_targets[2].put_url``), ``rule`` says which check it failed
    (``required``, ``type``, ``range``, ``scheme``...).  Every surface shows it in its
    own dialect (the shared envelope, the router's, OpenAI's ``param``)."""

    default_code = "invalid_params"

    def __init__(self, param: str, rule: str, message: str, **fields: Any) -> None:
        super().__init__(message, param=param, rule=rule, **fields)


class FormatError(AotxError):
    default_code = "format_error"


class JournalDamage(FormatError):
    default_code = "journal_damage"


class UnsupportedProfile(FormatError):
    default_code = "unsupported_profile"


class CheckpointInvalid(FormatError):
    """The runtime file's state checkpoint is refused (docs/formats/checkpoint.md):
    ``checkpoint_damaged`` (checksum or structure) or ``checkpoint_mismatch`` (its
    journal position is not this journal's); ``.fields["reason"]`` says which check."""

    default_code = "checkpoint_damaged"


class FrameError(FormatError):
    """A service-socket frame that breaks the framing rules (docs/formats/socket.md)."""

    default_code = "frame_invalid"


class DeadlineExceeded(AotxError):
    """The operation ran past its execution deadline (its result read answers this)."""

    default_code = "deadline_exceeded"
    status = 504


class UpstreamFailure(AotxError):
    """Something past the router failed: the runtime before a typed envelope
    (``upstream_failure``), its identity (``attestation_mismatch``), an artifact it
    cannot load (``artifact_unloadable``), a store blob (``blob_missing``) or a
    direct upload (``upload_failed``); ``code=`` picks."""

    default_code = "upstream_failure"
    status = 502


class ConfigError(AotxError):
    default_code = "config_error"


class NativeError(AotxError):
    default_code = "native_error"


class DiskError(NativeError):
    default_code = "disk_error"


class Signal(Exception):
    """Base of the control-flow exceptions: a function telling its caller something
    (module docstring); no HTTP surface ever sees one."""


class OutboundFailed(Signal):
    """An outbound request (:mod:`aotx_trio.outbound.pinned_http`) got no status:
    ``reason`` says why, safe to log (``timeout``, ``tls:<error>``,
    ``connection:<error>``, ``address``); never the URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ClientGone(Signal):
    """The client went away before its request body arrived: nothing to answer."""


class H2cRefused(Signal):
    """The cleartext HTTP/2 preface was answered 505: close the connection."""


class LeaseLost(Signal):
    """This router no longer surely holds a webhook's delivery lease: take it again."""


def by_name(kind: str) -> type[AotxError] | None:
    """The class of this module named ``kind`` (the socket protocol's ``kind`` field)."""
    cls = globals().get(kind)
    if isinstance(cls, type) and issubclass(cls, AotxError):
        return cls
    return None


# --------------------------------------------------------------------------- HTTP


def http_status(exc: AotxError) -> int:
    return exc.status


def http_parts(exc: AotxError, retry_after_s: int = 1,
               ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, envelope, extra headers) of an error, for every HTTP route.

    Every 429 and 503 carries ``Retry-After`` and the same number as ``retry_after``
    in the body (the error's own value, else ``retry_after_s``); a 401 carries
    ``WWW-Authenticate``."""
    status = exc.status
    body = exc.envelope()
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="aotx"'
    if status in (429, 503):
        value = exc.fields.get("retry_after")
        seconds = max(1, int(value)) if isinstance(value, int | float) else retry_after_s
        body["error"]["retry_after"] = seconds
        headers["Retry-After"] = str(seconds)
    return status, body, headers


# --------------------------------------------------------------------------- native codes

# Every native code name -> (class, public code or None to keep the name, extra fields).
# Tables that are full answer 507 capacity_exhausted naming the table; a missing
# deployment grant is 403 forbidden naming the reason.
_Entry = tuple[type[AotxError], str | None, dict[str, Any]]


def _e(cls: type[AotxError], code: str | None = None, **fields: Any) -> _Entry:
    return cls, code, fields


NATIVE: dict[str, _Entry] = {
    # common (csrc/aotx.h)
    "busy": _e(Refusal),
    "out_of_memory": _e(NativeError),
    "invalid_argument": _e(InvalidInput),
    "io_error": _e(DiskError),
    "internal_error": _e(NativeError),
    "unsupported": _e(FormatError),
    "buffer_too_small": _e(NativeError),
    # device (csrc/device/aotx_device.h)
    "lineage_mismatch": _e(Conflict),
    "participant_not_found": _e(NotFound),
    "sequence_conflict": _e(SequenceConflict),
    "future_sequence": _e(SequenceConflict),
    "below_retry_floor": _e(BelowRetryFloor),
    "operation_key_conflict": _e(Conflict),
    "registration_conflict": _e(Conflict),
    "space_id_conflict": _e(Conflict),
    "conversation_id_conflict": _e(Conflict),
    "space_not_found": _e(NotFound),
    "conversation_not_found": _e(NotFound),
    "operation_not_found": _e(NotFound),
    "member_not_found": _e(NotFound),
    "target_not_found": _e(NotFound),
    "forbidden": _e(Forbidden),
    "grant_forbidden": _e(Forbidden, "forbidden", reason="deployment_grant"),
    "retirement_blocked": _e(Refusal),   # receipts below the floor are not saved yet
    "retry_floor_invalid": _e(InvalidInput),
    "participants_full": _e(CapacityExhausted, "capacity_exhausted", table="participants"),
    "spaces_full": _e(CapacityExhausted, "capacity_exhausted", table="spaces"),
    "conversations_full": _e(CapacityExhausted, "capacity_exhausted", table="conversations"),
    "members_full": _e(CapacityExhausted, "capacity_exhausted", table="members"),
    "memory_full": _e(CapacityExhausted, "capacity_exhausted", table="memory"),
    "memory_retained": _e(Conflict),
    "memory_not_found": _e(NotFound),
    "embedding_invalid": _e(InvalidInput),
    "version_conflict": _e(Conflict),
    "publication_unsupported": _e(Conflict),
    "retention_mode_invalid": _e(InvalidInput),
    "lease_invalid": _e(InvalidInput),      # the executor's own calls: never a client's
    "lease_conflict": _e(Conflict),
    "lease_missing": _e(Conflict),
    "output_conflict": _e(Conflict),
    "receipt_table_full": _e(ReceiptTableFull),
    "command_too_large": _e(InvalidInput),
    "result_too_large": _e(InvalidInput),
    "already_terminal": _e(Conflict),
    "admission_unsaved": _e(Refusal),
    "kind_invalid": _e(InvalidInput),
    "operation_key_invalid": _e(InvalidInput),
    "scope_invalid": _e(InvalidInput),
    "rights_invalid": _e(InvalidInput),
    "text_invalid": _e(InvalidInput),
    "model_invalid": _e(InvalidInput),
    "media_invalid": _e(InvalidInput),
    "sampling_invalid": _e(InvalidInput),
    "status_invalid": _e(InvalidInput),
    "cursor_invalid": _e(InvalidInput, field="cursor"),
    "target_sequence_invalid": _e(InvalidInput),
    "reserved_token_invalid": _e(InvalidInput),
    "recovery_damage": _e(JournalDamage),
    "device_out_of_order": _e(NativeError),
    # journal (csrc/journal/aotx_journal.h)
    "journal_damage": _e(JournalDamage),
    "journal_foreign": _e(FormatError),
    "journal_too_large": _e(FormatError),
    "journal_state": _e(NativeError),
    "journal_hold": _e(JournalHold),
    "journal_nothing": _e(Refusal),
    # gguf and model (csrc/engine/aotx_gguf.h, aotx_model.h)
    "gguf_open_error": _e(NativeError),
    "gguf_header_corrupt": _e(FormatError),
    "gguf_version_unsupported": _e(FormatError),
    "gguf_data_corrupt": _e(FormatError),
    "gguf_value_type_corrupt": _e(FormatError),
    "gguf_tensor_corrupt": _e(FormatError),
    "gguf_alignment_corrupt": _e(FormatError),
    "gguf_key_invalid": _e(InvalidInput),
    "gguf_limit_corrupt": _e(FormatError),
    "model_arch_unsupported": _e(FormatError),
    "model_param_invalid": _e(InvalidInput),
    "model_tensor_invalid": _e(InvalidInput),
    "model_batch_invalid": _e(InvalidInput),
    "model_vocab_invalid": _e(InvalidInput),
    # KV pool (csrc/engine/aotx_kv.h)
    "kv_seq_not_found": _e(NotFound),
    "kv_context_invalid": _e(InvalidInput),
    "kv_params_invalid": _e(InvalidInput),
    "kv_pages_exhausted": _e(OverCapacity),
    "kv_seqs_exhausted": _e(OverCapacity),
    "kv_prefix_released": _e(Refusal),
    # tokenizer (csrc/tokenizer/aotx_tokenizer.h)
    "tokenizer_vocab_corrupt": _e(FormatError),
    "token_id_invalid": _e(InvalidInput),
    "token_type_invalid": _e(InvalidInput),
    "special_token_id_invalid": _e(InvalidInput),
    "bos_token_invalid": _e(InvalidInput),
    "byte_fallback_invalid": _e(InvalidInput),
    "tokenizer_model_unsupported": _e(FormatError),
    "tokenizer_pre_unsupported": _e(FormatError),
    "tokenizer_merges_invalid": _e(InvalidInput),
    # embeddings (csrc/embed/aotx_embed.h)
    "embed_config_invalid": _e(InvalidInput),
    "embed_weight_missing": _e(FormatError),
    "embed_token_invalid": _e(InvalidInput),
    "embed_length_invalid": _e(InvalidInput),
    "embed_batch_full": _e(OverCapacity),
    # kernels (csrc/engine/aotx_kernels.h)
    "kernel_type_unsupported": _e(FormatError),
    "kernel_shape_invalid": _e(InvalidInput),
    # CUDA (csrc/cuda/aotx_cuda.h): a device that cannot serve is a configuration matter
    # (no device, no driver, no kernels for it, no CUDA in the build, a model too large);
    # a failed call or a fault on a working device is the library's error
    "cuda_error": _e(NativeError),
    "cuda_out_of_memory": _e(NativeError),
    "cuda_no_device": _e(ConfigError),
    "cuda_not_built": _e(ConfigError),
    "cuda_driver_unusable": _e(ConfigError),
    "cuda_arch_unsupported": _e(ConfigError),
    "cuda_launch_refused": _e(NativeError),
    "cuda_device_fault": _e(NativeError),
    "cuda_model_too_large": _e(ConfigError),
}


def from_native(rc: int, name: str, message: str, **fields: Any) -> AotxError:
    """The exception for native code ``rc`` named ``name`` (see :data:`NATIVE`)."""
    entry = NATIVE.get(name)
    if entry is None:   # a code the table lacks: a test keeps this from happening
        log.error("native code %d (%s) is not in aotx_trio.errors.NATIVE", rc, name)
        cls: type[AotxError] = Refusal if rc > 0 else NativeError
        exc = cls(message, code=name, rc=rc, **fields)
    else:
        cls, code, extra = entry
        exc = cls(message, code=code or name, rc=rc, **{**extra, **fields})
    exc.native = name
    return exc
