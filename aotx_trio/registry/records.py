"""The registry's documents (docs/formats/registry.md): canonical JSON, keys, times.

Every stored document is one of the pydantic models below, stored as its
canonical JSON (:func:`canonical`); a document that does not parse as its model
is *corrupt* (:class:`~aotx_trio.errors.FormatError`).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from aotx_trio.errors import FormatError, InvalidInput
from aotx_trio.identity import (
    Descriptor,
    Doc,
    canonical,
)

MODEL_TYPES = ("textgen", "embedding")
MODEL_STATES = ("active", "deprecated", "disabled")
RELEASE_STATES = ("active", "disabled")
ARTIFACT_KINDS = ("gguf", "embedding_folder")

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
MAX_KEY_CHARS = 400
MAX_SEGMENTS = 16


def check_key(key: str, what: str = "model_id") -> str:
    """A path-like key: 1-16 ``/``-joined segments, no ``.``/``..``/hidden names."""
    parts = key.split("/") if isinstance(key, str) else []
    if (not parts or len(key) > MAX_KEY_CHARS or len(parts) > MAX_SEGMENTS
            or not all(_SEGMENT.match(p) for p in parts)):
        raise InvalidInput(f"{what} {key!r} is not a valid key (segments of "
                           "[A-Za-z0-9_][A-Za-z0-9._-]*, joined by '/')",
                           param=what, rule="key")
    return key


def check_name(name: str, what: str = "release") -> str:
    """A one-segment name (release names, runtime ids)."""
    check_key(name, what)
    if "/" in name:
        raise InvalidInput(f"{what} {name!r} must not contain '/'", param=what, rule="key")
    return name


def check_sha256(value: str, what: str = "sha256") -> str:
    if not isinstance(value, str) or not _HEX64.match(value):
        raise InvalidInput(f"{what} must be 64 lowercase hex digits", param=what, rule="sha256")
    return value


def check_commit(value: str) -> str:
    if not isinstance(value, str) or not _HEX40.match(value):
        raise InvalidInput("source_commit must be 40 lowercase hex digits",
                           param="source_commit", rule="commit")
    return value


def canonical_uuid(value: str) -> str | None:
    """``value`` if it is a canonical (lowercase, hyphenated) UUID, else None."""
    try:
        parsed = uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        return None
    return value if str(parsed) == value else None


def rfc3339(seconds: float) -> str:
    t = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=dt.UTC).timestamp()


D = TypeVar("D", bound=BaseModel)


def parse(cls: type[D], body: bytes, where: str) -> D:
    """``body`` as a ``cls``; a corrupt document is a FormatError naming ``where``."""
    try:
        return cls.model_validate_json(body)
    except ValidationError as exc:
        raise FormatError(f"registry document {where} is corrupt: "
                          f"{exc.errors()[0]['msg']}", code="registry_corrupt",
                          object=where) from None


class ArtifactRef(Doc):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    kind: Literal["gguf", "embedding_folder"]
    size: int = Field(ge=0)


class RuntimeRelease(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    source_commit: str = Field(pattern=r"^[0-9a-f]{40}$")


class Serving(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    runtime_release: RuntimeRelease
    spec: dict[str, Any]


class Manifest(BaseModel):
    """A model manifest; top-level keys beyond ours (a training job's) are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)
    model_type: Literal["textgen", "embedding"]
    serving: Serving
    artifact: ArtifactRef

    def body(self) -> bytes:
        return canonical(self.model_dump(mode="json"))


class Published(Doc):
    model_id: str
    manifest_sha256: str
    model_type: Literal["textgen", "embedding"]
    release: str
    published_at: str


class Removed(Doc):
    model_id: str
    removed_at: str
    reason: str | None = None


class ModelState(Doc):
    model_id: str
    state: Literal["active", "deprecated", "disabled"]
    successor_id: str | None = None
    changed_at: str


class EngineSet(Doc):
    name: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Release(Doc):
    name: str
    artifact: ArtifactRef
    descriptor: Descriptor
    descriptor_sha256: str
    source_commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    engine_set: EngineSet | None = None
    minted_at: str

    @property
    def engine_set_sha256(self) -> str | None:
        return self.engine_set.sha256 if self.engine_set else None

    @property
    def artifact_sha256(self) -> str:
        return self.artifact.sha256


class ReleaseState(Doc):
    name: str
    state: Literal["active", "disabled"]
    successor: str | None = None
    changed_at: str


class Deployment(Doc):
    release: str
    runtime: str
    descriptor_sha256: str
    deployed_at: str


class Alias(Doc):
    name: str
    target: str
    level: int = Field(ge=0)
    set_at: str


class Session(Doc):
    session_id: str
    state: Literal["open", "closed"]
    reason: Literal["stopped", "promoted", "expired"] | None = None
    created_at: str
    #: whole seconds (a session stored with a fractional lease reads rounded up)
    lease_s: int = Field(gt=0)
    lease_expires_at: str
    closed_at: str | None = None
    promoted_to: str | None = None
    based_on: dict[str, Any] = Field(default_factory=dict)
    generations: int = Field(default=0, ge=0)
    current_generation: int | None = None

    @field_validator("lease_s", mode="before")
    @classmethod
    def _whole_seconds(cls, v: Any) -> Any:
        if isinstance(v, float) and math.isfinite(v):
            return math.ceil(v)
        return v


class Revision(Doc):
    session_id: str
    revision_id: str
    generation: int = Field(ge=1)
    spec: dict[str, Any]
    spec_sha256: str
    artifact: ArtifactRef
    draft_manifest: dict[str, Any]
    draft_manifest_sha256: str
    created_at: str


class Event(Doc):
    seq: int = Field(ge=0)
    type: str
    subject: str
    at: str
    object_sha256: str
    operation_id: str
    payload: dict[str, Any] = Field(default_factory=dict)
