"""The deployment grant file (``grants.json``; docs/formats/grants.md).

The gateway writes it from ``gateway.json`` (``aotx gateway write-grants``); the
runtime reads it at boot (``aotx boot --service-grants DIR``) to learn which
principals exist and what each may do. It names principals and actions only:
never a token, never a token hash.  The device keys participants by the
*principal key*, the first 16 bytes of SHA-256 of the principal's UTF-8 name
(:func:`aotx_trio.vocab.principal_key`).  A leaf below both process roles: the
gateway side writes it, the runtime side reads it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from aotx_trio._fs import atomic_write_text, refuse_writable_by_others
from aotx_trio.config import GatewayConfig, Limits, load_gateway_config
from aotx_trio.errors import ConfigError
from aotx_trio.vocab import ACTIONS, HEX32, Action, principal_key

SCHEMA = "aotx.grants.v1"
FILE_NAME = "grants.json"


class GrantPrincipal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=64)]
    principal_key: Annotated[str, Field(pattern=HEX32)]
    actions: tuple[Action, ...]

    @field_validator("actions")
    @classmethod
    def _canonical(cls, v: tuple[Action, ...]) -> tuple[Action, ...]:
        if list(v) != sorted(set(v), key=ACTIONS.index):
            raise ValueError("actions must be unique and in canonical order")
        return v

    @model_validator(mode="after")
    def _key_matches(self) -> GrantPrincipal:
        if self.principal_key != principal_key(self.name):
            raise ValueError(f"principal_key of {self.name!r} is not sha256(name)[:16]")
        return self


class Quotas(BaseModel):
    """Per-principal quotas the runtime enforces (``limits.max_*_per_principal`` of
    ``gateway.json``); a file without them gets the defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    receipts: Annotated[int, Field(ge=1)] = Limits().max_receipts_per_principal
    spaces: Annotated[int, Field(ge=1)] = Limits().max_spaces_per_principal
    conversations: Annotated[int, Field(ge=1)] = Limits().max_conversations_per_principal
    members: Annotated[int, Field(ge=1)] = Limits().max_members_per_principal
    media_bytes: Annotated[int, Field(ge=1)] = Limits().max_media_bytes_per_principal
    memory_rows: Annotated[int, Field(ge=1)] = Limits().max_memory_rows_per_principal


class Grants(BaseModel):
    """The validated grant file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: Literal["aotx.grants.v1"] = Field(alias="schema")
    principals: tuple[GrantPrincipal, ...]
    quotas: Quotas = Field(default_factory=Quotas)

    @model_validator(mode="after")
    def _unique(self) -> Grants:
        names = [p.name for p in self.principals]
        if names != sorted(set(names)):
            raise ValueError("principals must be unique and sorted by name")
        return self

    def by_key(self, key: str | bytes) -> GrantPrincipal | None:
        hexkey = key.hex() if isinstance(key, bytes) else key
        for p in self.principals:
            if p.principal_key == hexkey:
                return p
        return None

    def actions_for(self, key: str | bytes) -> frozenset[str]:
        """The actions granted to a principal key (empty for an unknown key)."""
        p = self.by_key(key)
        return frozenset(p.actions) if p is not None else frozenset()


def grants_document(config: GatewayConfig) -> dict[str, Any]:
    """The grant file's JSON object for a gateway configuration (no credentials)."""
    principals = sorted(config.principals, key=lambda p: p.name)
    return {
        "schema": SCHEMA,
        "principals": [
            {"name": p.name, "principal_key": principal_key(p.name),
             "actions": sorted(set(p.actions), key=ACTIONS.index)}
            for p in principals
        ],
        "quotas": {"receipts": config.limits.max_receipts_per_principal,
                   "spaces": config.limits.max_spaces_per_principal,
                   "conversations": config.limits.max_conversations_per_principal,
                   "members": config.limits.max_members_per_principal,
                   "media_bytes": config.limits.max_media_bytes_per_principal,
                   "memory_rows": config.limits.max_memory_rows_per_principal},
    }


def write_grants(config: GatewayConfig, out_dir: str | os.PathLike[str]) -> Path:
    """Write ``out_dir/grants.json`` atomically (temp + fsync + rename + dir fsync)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    body = json.dumps(grants_document(config), indent=2, ensure_ascii=False) + "\n"
    return atomic_write_text(out / FILE_NAME, body)


def load_grants(grants_dir: str | os.PathLike[str]) -> Grants:
    """Read and validate ``grants_dir/grants.json``; unknown fields are refused."""
    p = Path(grants_dir) / FILE_NAME
    refuse_writable_by_others(p)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: no grant file (run 'aotx gateway write-grants')",
                          code="grants_missing", key="(file)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{p}: not valid UTF-8 JSON: {exc}", code="grants_invalid",
                          key="(file)") from None
    try:
        return Grants.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(x) for x in first["loc"]) or "(top level)"
        what = "unknown key" if first["type"] == "extra_forbidden" else \
            first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{p}: {key}: {what}", code="grants_invalid", key=key) from None


def write_grants_main(args: argparse.Namespace) -> int:
    config = load_gateway_config(args.config)
    path = write_grants(config, args.out)
    print(f"grants: {path} ({len(config.principals)} principals)")
    return 0
