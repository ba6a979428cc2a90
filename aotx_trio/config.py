"""The gateway configuration (``gateway.json``), validated by pydantic v2.

See docs/configuration.md for every key and its default.  Unknown keys are an
error everywhere (``extra="forbid"``); every error is a :class:`ConfigError`
whose message and ``key`` field name the dotted key path (``principals.0.tokn``).

Keys of the contract that nothing implements yet (:data:`UNIMPLEMENTED`) are
refused naming the key.  A relative ``service_socket`` is resolved against the
folder that holds the file when it is loaded with :func:`load_gateway_config`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from aotx_trio._fs import atomic_write_text, refuse_writable_by_others
from aotx_trio.errors import ConfigError
from aotx_trio.vocab import ACTIONS, Action  # noqa: F401  (re-exported)

MIB = 1024 * 1024
DEFAULT_DEADLINE_S = 300.0
GIB = 1024 * MIB
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"
_BIND = re.compile(r"^(?:unix:.+|(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5}))$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class Principal(_Strict):
    """One caller: a name, the SHA-256 of its bearer token, the actions it may take."""

    name: Annotated[str, Field(pattern=_NAME)]
    token_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    actions: list[Action] = Field(default_factory=list)

    @field_validator("actions")
    @classmethod
    def _unique_actions(cls, v: list[Action]) -> list[Action]:
        if len(set(v)) != len(v):
            raise ValueError("actions are listed twice")
        return v


class Limits(_Strict):
    """Resource limits the gateway enforces itself (hypercorn does not)."""

    max_body_bytes: Annotated[int, Field(ge=1024, le=1024 * MIB)] = MIB
    #: ``POST /media`` bodies (the service socket's 4 MiB frames carry them as base64,
    #: so at most 3 MiB)
    max_media_bytes: Annotated[int, Field(ge=1024, le=3 * MIB)] = 2 * MIB
    sse_queue_depth: Annotated[int, Field(ge=1, le=65536)] = 256
    sse_keepalive_s: Annotated[float, Field(gt=0, le=3600)] = 15.0
    list_limit_default: Annotated[int, Field(ge=1, le=10000)] = 50
    list_limit_max: Annotated[int, Field(ge=1, le=10000)] = 500
    execution_deadline_s: Annotated[float, Field(gt=0, le=86400)] = DEFAULT_DEADLINE_S
    retry_after_s: Annotated[int, Field(ge=1, le=3600)] = 1
    keep_alive_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    #: the journal file's cap: writes hold (429 journal_hold) before it would be passed
    #: (0 = no cap)
    journal_max_bytes: Annotated[int, Field(ge=0, le=1 << 60)] = 64 * GIB
    #: free space the journal's file system keeps: below it writes hold (0 = no floor)
    journal_min_free_bytes: Annotated[int, Field(ge=0, le=1 << 60)] = 64 * MIB
    #: per-principal quotas (429 over_quota): receipts not yet retired, spaces and
    #: conversations created, member rows of the spaces it owns, bytes of the media it
    #: uploaded, memory rows it adds (the runtime counts them; written into
    #: grants.json), and token buckets
    #: of API requests (the gateway; 0 = no rate limit): the shared API, and the
    #: OpenAI-compatible /v1/* routes apart.  The defaults leave the fixed tables
    #: (1024 receipts, 1024 spaces, 4096 conversations, 4096 member rows, 4096 memory
    #: rows) room for 8
    #: principals at full use.
    max_receipts_per_principal: Annotated[int, Field(ge=1, le=1 << 20)] = 120
    max_spaces_per_principal: Annotated[int, Field(ge=1, le=1 << 20)] = 120
    max_conversations_per_principal: Annotated[int, Field(ge=1, le=1 << 20)] = 480
    max_members_per_principal: Annotated[int, Field(ge=1, le=1 << 20)] = 480
    max_media_bytes_per_principal: Annotated[int, Field(ge=1, le=1 << 50)] = 256 * MIB
    #: active webhook subscriptions one principal may hold (the router enforces it;
    #: 8 principals at full use: 256 delivery tasks per router)
    max_webhooks: Annotated[int, Field(ge=1, le=4096)] = 32
    max_memory_rows_per_principal: Annotated[int, Field(ge=1, le=1 << 20)] = 480
    requests_per_second: Annotated[float, Field(ge=0, le=1e6)] = 200.0
    request_burst: Annotated[int, Field(ge=1, le=1 << 20)] = 400
    v1_requests_per_second: Annotated[float, Field(ge=0, le=1e6)] = 10.0
    v1_request_burst: Annotated[int, Field(ge=1, le=1 << 20)] = 20
    #: connections served at once; one more is answered 503 too_many_connections, closed
    max_connections: Annotated[int, Field(ge=1, le=1 << 20)] = 512
    #: connections one principal may hold (its latest request's), and requests it may
    #: have in flight (SSE streams included): 429 over_quota past either
    max_connections_per_principal: Annotated[int, Field(ge=1, le=1 << 20)] = 64
    max_inflight_per_principal: Annotated[int, Field(ge=1, le=1 << 20)] = 32
    #: request-body bytes buffered across all connections at once (503 body_budget)
    max_buffered_body_bytes: Annotated[int, Field(ge=1024, le=1 << 40)] = 64 * MIB
    #: cleartext HTTP/2 (h2c: the preface or Upgrade: h2c); off unless set
    allow_h2c: bool = False

    @model_validator(mode="after")
    def _list_limits(self) -> Limits:
        if self.list_limit_default > self.list_limit_max:
            raise ValueError("list_limit_default is over list_limit_max")
        return self


class Router(_Strict):
    """The serving router's own settings (docs/configuration.md, ``router``)."""

    #: how often the ``GET /models`` index follows the store's event feed
    index_refresh_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    #: the feed's rescan (heal + trim); ``aotx serve`` and the gateway run it
    rescan_interval_s: Annotated[float, Field(gt=0, le=86400)] = 3600.0
    #: how often the reaper closes scratch sessions whose lease elapsed
    reap_interval_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    #: invokes in flight at once in this gateway; one more is 429 over_capacity
    max_inflight_invokes: Annotated[int, Field(ge=1, le=65536)] = 64
    #: where upload delivery may PUT (aotx_trio.router.upload.UploadPolicy.from_config)
    upload: dict[str, Any] | None = None
    #: a folder the runtime can read: GGUF artifacts it has not loaded are exported
    #: there and loaded on demand (``None``: never; invoke answers not_ready)
    artifact_cache: Path | None = None


class Webhooks(_Strict):
    """Webhook delivery (docs/configuration.md, ``webhooks``)."""

    #: the router's Ed25519 key (hex seed, mode 0600; ``aotx serve`` creates one);
    #: ``None``: registration is 503 webhooks_unconfigured and nothing is delivered
    signing_key_file: Path | None = None
    #: how long a failed post waits before the same event is posted again
    retry_interval_s: Annotated[float, Field(gt=0, le=86400)] = 30.0
    #: allow plain http and private/loopback addresses (tests and closed networks)
    allow_insecure_targets: bool = False
    #: one post's whole time (connect, TLS, send, the answer's status)
    timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    #: a CA bundle trusted for https consumers (None: the system's)
    ca_file: Path | None = None
    #: how long a router's hold on a subscription lasts unrenewed (takeover time)
    lease_s: Annotated[float, Field(ge=1, le=3600)] = 30.0


class GatewayConfig(_Strict):
    """``gateway.json``."""

    bind: str = "127.0.0.1:8080"
    #: The runtime's service socket; ``None`` = in-process device (``aotx serve``).
    service_socket: Path | None = None
    principals: list[Principal] = Field(default_factory=list)
    limits: Limits = Field(default_factory=Limits)
    #: the model registry: a folder (the folder store at ``<store>/registry``) or a
    #: ``postgresql://`` URL; ``None``: the router's routes answer 503 not_ready
    store: str | None = None
    router: Router = Field(default_factory=Router)
    webhooks: Webhooks = Field(default_factory=Webhooks)

    @field_validator("store")
    @classmethod
    def _store(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("store must be a folder path or a postgresql:// URL")
        return v

    @field_validator("bind")
    @classmethod
    def _bind(cls, v: str) -> str:
        m = _BIND.match(v)
        if m is None or (m.group(1) is not None and int(m.group(1)) > 65535):
            raise ValueError("bind must be HOST:PORT (port 0..65535) or unix:PATH")
        return v

    @model_validator(mode="after")
    def _unique_principals(self) -> GatewayConfig:
        names = [p.name for p in self.principals]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"principal name {dup!r} is listed twice")
        hashes = [p.token_sha256 for p in self.principals]
        if len(set(hashes)) != len(hashes):
            raise ValueError("two principals share one token_sha256")
        return self

    def resolved(self, base: Path) -> GatewayConfig:
        """A copy whose relative paths are resolved against ``base``."""
        def fix(p: Path | None) -> Path | None:
            return None if p is None or p.is_absolute() else base / p
        update: dict[str, Any] = {}
        if (s := fix(self.service_socket)) is not None:
            update["service_socket"] = s
        if self.store is not None and not is_store_url(self.store) \
                and (st := fix(Path(self.store))) is not None:
            update["store"] = str(st)
        hooks = {k: v for k in ("signing_key_file", "ca_file")
                 if (v := fix(getattr(self.webhooks, k))) is not None}
        if hooks:
            update["webhooks"] = self.webhooks.model_copy(update=hooks)
        if (cache := fix(self.router.artifact_cache)) is not None:
            update["router"] = self.router.model_copy(update={"artifact_cache": cache})
        return self.model_copy(update=update)


def is_store_url(store: str) -> bool:
    """A ``store`` value naming PostgreSQL (else it is a folder)."""
    return store.startswith(("postgresql://", "postgres://"))


def token_sha256(token: str) -> str:
    """The hex SHA-256 of a bearer token's UTF-8 bytes, as stored in ``token_sha256``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(x) for x in loc) or "(top level)"


#: Keys of the contract that nothing implements yet, and what will: a file that sets
#: one is refused naming it, so no setting is ever silently ignored.
UNIMPLEMENTED: dict[str, str] = {
    "limits.scratch_lease_s": "the serving router",
}


def _refuse_unimplemented(data: Any, source: str) -> None:
    if not isinstance(data, dict):
        return
    for key, owner in UNIMPLEMENTED.items():
        head, _, tail = key.partition(".")
        section = data.get(head) if tail else data
        if isinstance(section, dict) and (tail or head) in section:
            raise ConfigError(f"{source}: {key}: not implemented yet (comes with {owner}); "
                              "remove the key", code="config_unsupported", key=key)


def parse_gateway_config(data: Any, source: str = "gateway.json") -> GatewayConfig:
    """Validate already-parsed JSON; errors name the key path."""
    _refuse_unimplemented(data, source)
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = _key_path(tuple(first["loc"]))
        what = "unknown key" if first["type"] == "extra_forbidden" else \
            first["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{source}: {key}: {what}{more}", key=key) from None


def load_gateway_config(path: str | os.PathLike[str]) -> GatewayConfig:
    """Read, validate and resolve ``gateway.json``."""
    p = Path(path)
    refuse_writable_by_others(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file", key="(file)") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 (byte {exc.start})", key="(file)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                          f"{exc.msg}", key="(file)") from None
    return parse_gateway_config(data, str(p)).resolved(p.parent.resolve())


def write_gateway_config(path: str | os.PathLike[str], config: GatewayConfig) -> None:
    """Write ``gateway.json`` atomically with mode 0600 (temp + fsync + rename)."""
    p = Path(path)
    body = json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=False) + "\n"
    atomic_write_text(p, body, mode=0o600)
