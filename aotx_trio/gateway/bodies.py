"""Request bodies of the shared-conversations API (pydantic v2, ``extra="forbid"``).

Every mutation body has the four common fields of the spec; each route adds
its own.  Models only check shape (types, patterns, ranges); whether the
lineage matches, a sequence is known or a space visible is the runtime's
business.  ``schema`` is checked before the model (a missing or wrong value is
400, not 422), see :func:`aotx_trio.gateway.routes_table.validate`; which
route takes which model is :data:`aotx_trio.gateway.routes_table.MUTATION_ROUTES`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from aotx_trio.vocab import HEX32, MAX_MEDIA, MAX_MODEL_NAME

U64_MAX = (1 << 64) - 1


def _nonzero_key(v: str) -> str:
    if int(v, 16) == 0:
        raise ValueError("operation_key must be nonzero")
    return v


def _counter(v: str) -> str:
    if int(v) > U64_MAX:
        raise ValueError(f"counter must be at most {U64_MAX}")
    return v


def _positive(v: str) -> str:
    if int(v) == 0:
        raise ValueError("sequence starts at 1")
    return v


Hex32 = Annotated[str, Field(pattern=HEX32)]
OperationKey = Annotated[str, Field(pattern=HEX32), AfterValidator(_nonzero_key)]
# Decimal strings without leading zeros, 0 .. 2^64-1.
Counter = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,19})$"), AfterValidator(_counter)]
Sequence_ = Annotated[Counter, AfterValidator(_positive)]
# A resource id: its 32-hex component, or the whole "<prefix>-<lineage>-<hex>" form.
ResourceRef = Annotated[str, Field(pattern=r"^([a-z]{3}-[0-9a-f]{32}-)?[0-9a-f]{32}$")]
ParticipantRef = Annotated[str, Field(pattern=r"^par-[0-9a-f]{32}-[0-9a-f]{32}$")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Mutation(_Body):
    schema_: Literal["aotx.shared.mutation.v1"] = Field(alias="schema")
    lineage: Hex32
    operation_key: OperationKey
    sequence: Sequence_

    def fields(self) -> dict[str, Any]:
        """The route-specific fields (everything but the four common ones)."""
        return self.model_dump(exclude={"schema_", "lineage", "operation_key", "sequence"},
                               exclude_none=False)


class RegisterParticipant(Mutation):
    pass


class CreateSpace(Mutation):
    id: ResourceRef | None = None
    scope: Literal["private", "room", "instance"] = "private"


class CreateConversation(Mutation):
    id: ResourceRef | None = None


Permission = Literal["read", "write", "manage"]


class SetMember(Mutation):
    participant: ParticipantRef
    permissions: Annotated[list[Permission], Field(max_length=3)]


class Retirement(Mutation):
    retry_floor: Counter


class Cancellation(Mutation):
    """Cancel exactly the caller's operation of sequence ``target_sequence``."""

    target_sequence: Sequence_


class Publication(Mutation):
    """Copy the retained text memory ``object`` (at ``source_version``) into the space."""

    object: Annotated[str, Field(pattern=r"^mem-[0-9a-f]{32}-[0-9a-f]{32}$")]
    source_version: Counter


class MediaRef(_Body):
    type: Literal["image", "audio"]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


Number = Annotated[float, AfterValidator(_finite)]


class CreateInput(Mutation):
    """An input to a conversation: what the model is asked, and how.  Whether the model
    exists and the output fits its context is the runtime's check (422 ``unknown_model``
    / naming ``max_output_tokens``); the 2048-byte text + media-link limit the device's."""

    text: str = ""
    model: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_NAME)]
    max_output_tokens: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    pages: Annotated[int, Field(ge=0, le=1 << 20)] | None = None
    temperature: Annotated[Number, Field(ge=0)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    media: Annotated[list[MediaRef], Field(max_length=MAX_MEDIA)] | None = None
