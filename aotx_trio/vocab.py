"""The one vocabulary of the shared-conversations contract (a leaf module).

Kinds, scopes, permissions, statuses, grant bits and actions, id formats, the
mutation schema and the input limits of docs/api.md (its
contract and routes).  Numeric values equal the C header's
(``csrc/device/aotx_device.h``); ``tests/test_vocab.py`` checks each one against the
native library, so the two cannot drift apart.  Everything else imports these
names from here.
"""

from __future__ import annotations

import enum
import hashlib
import re
from typing import Literal

SCHEMA = "aotx.shared.mutation.v1"
BASE_PATH = "/aotx/v1/shared"


class Kind(enum.IntEnum):
    """Mutation kinds (canonical byte 1, AOTX_KIND_*)."""

    REGISTER = 1
    SPACE_CREATE = 2
    MEMBER_SET = 3
    CONVERSATION_CREATE = 4
    INPUT = 5
    CANCEL = 6
    RETIRE = 7
    PUBLISH = 8


#: The wire name of each kind (receipts' ``kind``, the service's ``mutation.submit``).
KIND_NAMES: dict[Kind, str] = {
    Kind.REGISTER: "participant.register",
    Kind.SPACE_CREATE: "space.create",
    Kind.MEMBER_SET: "member.set",
    Kind.CONVERSATION_CREATE: "conversation.create",
    Kind.INPUT: "input",
    Kind.CANCEL: "cancellation",
    Kind.RETIRE: "participant.retire",
    Kind.PUBLISH: "publication",
}
KINDS_BY_NAME: dict[str, Kind] = {name: kind for kind, name in KIND_NAMES.items()}

#: Space scopes, indexed by AOTX_SCOPE_* (0, 1, 2).
SCOPES: tuple[str, ...] = ("private", "room", "instance")
#: Memory row kinds by their device code (docs/formats/device.md, "Memory rows").
MEMORY_KINDS: tuple[str, ...] = ("", "text", "embedding", "interpretation")
Scope = Literal["private", "room", "instance"]

#: Space rights; bit i of a rights mask is PERMISSIONS[i] (AOTX_RIGHT_*).
PERMISSIONS: tuple[str, ...] = ("read", "write", "manage")
Permission = Literal["read", "write", "manage"]

#: Receipt statuses, indexed by AOTX_STATUS_*.
STATUSES: tuple[str, ...] = ("admitted", "running", "succeeded", "failed", "cancelled",
                             "interrupted", "deadline_exceeded")
TERMINAL: frozenset[str] = frozenset(STATUSES[2:])
#: Why a succeeded input stopped, indexed by AOTX_FINISH_* (index 0: not recorded).
FINISH_CODES: tuple[str, ...] = ("none", "stop", "length")
#: The ``finish`` of every other terminal status.
FINISH_OF_STATUS: dict[str, str] = {"failed": "error", "cancelled": "cancelled",
                                    "interrupted": "interrupted",
                                    "deadline_exceeded": "deadline_exceeded"}


def finish_of(status: str, code: int) -> str | None:
    """The ``finish`` of a receipt: null until terminal; ``stop``/``length`` for a
    succeeded input (one completed before finish codes were recorded reads ``stop``);
    the status's own word otherwise."""
    if status not in TERMINAL:
        return None
    if status == "succeeded":
        return "length" if code == FINISH_CODES.index("length") else "stop"
    return FINISH_OF_STATUS[status]

#: Media row types (AOTX_MEDIA_*).
MEDIA_TYPES: dict[str, int] = {"image": 1, "audio": 2}


#: The ``type/subtype`` an upload may declare (its ``Content-Type``, parameters
#: aside): the formats image and audio models read.
MEDIA_CONTENT_TYPES: frozenset[str] = frozenset({
    "image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp", "image/tiff",
    "image/avif", "image/heic", "image/heif",
    "audio/wav", "audio/x-wav", "audio/wave", "audio/mpeg", "audio/mp4", "audio/aac",
    "audio/ogg", "audio/opus", "audio/flac", "audio/webm"})


#: what 422 ``media_type_invalid`` says (the gateway's check and the runtime's)
MEDIA_TYPE_RULE = "Content-Type must be one of " + ", ".join(sorted(MEDIA_CONTENT_TYPES))


def media_content_type(content_type: str) -> str | None:
    """An upload's ``type/subtype`` (``IMAGE/PNG; x=y`` -> ``image/png``) when it is on
    :data:`MEDIA_CONTENT_TYPES`, else None."""
    top = content_type.split(";", 1)[0].strip().lower()
    return top if top in MEDIA_CONTENT_TYPES else None


def media_kind(content_type: str) -> str | None:
    """The media row type of an upload's Content-Type (``image/png; x=y`` -> ``image``),
    or None when its ``type/subtype`` is not on :data:`MEDIA_CONTENT_TYPES`."""
    top = media_content_type(content_type)
    return None if top is None else top.partition("/")[0]

MAX_TEXT_BYTES = 2048       # text + device-added media links
MEDIA_LINK_BYTES = 73       # per media row, separator included
MAX_MEDIA = 8
MAX_MODEL_NAME = 128

# --------------------------------------------------------------------------- actions

#: Every gateway action of gateway.json, in canonical order.
ACTIONS: tuple[str, ...] = ("shared_read", "shared_write", "shared_manage", "models_read",
                            "models_invoke", "webhooks_manage", "metrics_read")
Action = Literal["shared_read", "shared_write", "shared_manage", "models_read",
                 "models_invoke", "webhooks_manage", "metrics_read"]
SHARED_ACTIONS: tuple[str, ...] = ACTIONS[:3]

#: Device grant bits (AOTX_GRANT_*) selected by the shared actions.
GRANT_READ = 1
GRANT_WRITE = 2
GRANT_MANAGE = 4
ALL_GRANTS = GRANT_READ | GRANT_WRITE | GRANT_MANAGE
GRANT_BITS: dict[str, int] = {"shared_read": GRANT_READ, "shared_write": GRANT_WRITE,
                              "shared_manage": GRANT_MANAGE}


def grant_mask(actions: tuple[str, ...] | list[str] | frozenset[str]) -> int:
    """The device grant bitmask of a set of actions (other actions select nothing)."""
    mask = 0
    for a in actions:
        mask |= GRANT_BITS.get(a, 0)
    return mask


# --------------------------------------------------------------------------- ids

#: Resource id prefixes: ``{prefix}-{lineage}-{32 hex}``.
PREFIXES: dict[str, str] = {"participant": "par", "space": "spc", "conversation": "con",
                            "operation": "op", "memory": "mem"}
HEX32 = r"^[0-9a-f]{32}$"
_HEX32 = re.compile(r"[0-9a-f]{32}")


def is_decimal(text: object, max_digits: int = 20) -> bool:
    """ASCII decimal digits only, 1..``max_digits`` of them (superscript two and the
    Arabic-Indic digits pass ``str.isdigit``, not this)."""
    return isinstance(text, str) and 0 < len(text) <= max_digits and text.isascii() \
        and text.isdigit()


def is_hex32(text: object) -> bool:
    return isinstance(text, str) and _HEX32.fullmatch(text) is not None


def format_id(prefix: str, lineage: str, ident: str) -> str:
    """``{prefix}-{lineage}-{ident}`` (par, spc, con, op)."""
    return f"{prefix}-{lineage}-{ident}"


def parse_id(prefix: str, lineage: str, text: object) -> str | None:
    """The 32-hex id inside ``{prefix}-{lineage}-{id}``, or None when ``text`` is not
    one of this lineage (callers answer not_found)."""
    if not isinstance(text, str):
        return None
    parts = text.split("-")
    if len(parts) == 3 and parts[0] == prefix and parts[1] == lineage \
            and _HEX32.fullmatch(parts[2]):
        return parts[2]
    return None


def principal_key(name: str) -> str:
    """The device's participant key of a principal: sha256(UTF-8 name)[:16], 32 hex."""
    return hashlib.sha256(name.encode("utf-8")).digest()[:16].hex()
