"""The registry's documents (docs/formats/registry.md): canonical JSON, keys, times.

Every stored document is one of the pydantic models below, stored as its
canonical JSON (:func:`canonical`); a document that does not parse as its model
is *corrupt* (:class:`~aotx_trio.errors.FormatError`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import uuid
from typing import Any, Literal, TypeVar, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from aotx_trio.errors import FormatError, InvalidInput
from aotx_trio.router.spec_dsl import parse_spec

MODEL_TYPES = ("textgen", "embedding")
MODEL_STATES = ("active", "deprecated", "disabled")
RELEASE_STATES = ("active", "disabled")
ARTIFACT_KINDS = ("gguf", "embedding_folder")

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
MAX_KEY_CHARS = 400
MAX_SEGMENTS = 16


def canonical(value: Any) -> bytes:
    """Canonical JSON: UTF-8, keys sorted, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def body(self) -> bytes:
        return canonical(self.model_dump(mode="json"))


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


KV_TYPES = ("f16", "f32")
DEFAULT_KV_TYPE = "f16"


class Descriptor(Doc):
    """The engine settings a runtime loads a release's artifact with.

    ``kv_type`` is the element type of the KV pages: ``"f16"`` (binary16) or
    ``"f32"``; None (unset) means the runtime's default, f16 (:data:`DEFAULT_KV_TYPE`).
    An unset ``kv_type`` is left out of the document (:meth:`body`, every dump), so
    a descriptor that does not set it has the canonical body, and the
    ``descriptor_sha256``, it had before the field existed; one that sets it (even
    to the default) is another descriptor with another digest.
    """

    backend: Literal["cpu", "cuda"] = "cpu"
    threads: int = Field(default=0, ge=0, le=1024)
    kv_page_tokens: int = Field(default=8, ge=1, le=4096)
    context: int = Field(default=2048, ge=16, le=1 << 20)
    kv_type: Literal["f16", "f32"] | None = None

    @model_serializer(mode="wrap")
    def _unset_kv_type_is_absent(self, handler: SerializerFunctionWrapHandler,
                                 ) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("kv_type", "") is None:
            del out["kv_type"]
        return out

    @property
    def kv_f16(self) -> bool:
        """Whether the runtime loads the artifact with binary16 KV pages."""
        return (self.kv_type or DEFAULT_KV_TYPE) == "f16"


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
    lease_s: float = Field(gt=0)
    lease_expires_at: str
    closed_at: str | None = None
    promoted_to: str | None = None
    based_on: dict[str, Any] = Field(default_factory=dict)
    generations: int = Field(default=0, ge=0)
    current_generation: int | None = None


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


def check_spec(spec: Any) -> dict[str, Any]:
    """``spec`` if it is a valid spec DSL v2 document (docs/formats/spec-dsl.md), checked
    whole by :func:`~aotx_trio.router.spec_dsl.parse_spec`; else 422 ``invalid_params``
    with ``param`` (a path such as ``spec.params[2].default``) and ``rule``."""
    parse_spec(spec)
    return cast(dict[str, Any], spec)


def check_manifest(value: Any) -> Manifest:
    """A manifest from caller input (422 ``invalid_params`` naming the field)."""
    try:
        manifest = Manifest.model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or "manifest"
        raise InvalidInput(f"manifest: {param}: {err['msg']}", code="invalid_params",
                           param=param, rule=err["type"]) from None
    check_spec(manifest.serving.spec)
    return manifest
