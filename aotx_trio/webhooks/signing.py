"""The router's Ed25519 key (a file holding the 32-byte seed as hex, mode 0600), the
signature of a post and the consumer's check of one (docs/webhooks.md).

The signed bytes are ``{timestamp}.{raw body}``; the headers are
``X-Serving-Timestamp: <unix seconds>`` and ``X-Serving-Signature: ed25519=<hex>``.
"""

from __future__ import annotations

import os
from pathlib import Path

import nacl.exceptions
import nacl.signing

from aotx_trio.errors import ConfigError

TOLERANCE_S = 300
TIMESTAMP_HEADER = "X-Serving-Timestamp"
SIGNATURE_HEADER = "X-Serving-Signature"


def create_key(path: str | os.PathLike[str]) -> Path:
    """A new key file at ``path`` (mode 0600, never overwriting one)."""
    p = Path(path)
    seed = nacl.signing.SigningKey.generate().encode().hex()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(seed + "\n")
        out.flush()
        os.fsync(out.fileno())
    return p


def load_key(path: str | os.PathLike[str], key: str = "webhooks.signing_key_file",
             ) -> nacl.signing.SigningKey:
    """The key of a key file (ConfigError naming ``key`` when unreadable or malformed)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="ascii").strip()
        seed = bytes.fromhex(text)
    except FileNotFoundError:
        raise ConfigError(f"{key}: {p}: no such file", key=key) from None
    except (OSError, ValueError, UnicodeDecodeError):
        raise ConfigError(f"{key}: {p}: not a hex Ed25519 seed", key=key) from None
    if len(seed) != 32:
        raise ConfigError(f"{key}: {p}: the seed must be 32 bytes (64 hex digits)", key=key)
    return nacl.signing.SigningKey(seed)


def public_hex(key: nacl.signing.SigningKey) -> str:
    return key.verify_key.encode().hex()


def sign(key: nacl.signing.SigningKey, timestamp: int, body: bytes) -> dict[str, str]:
    """The two headers of a post of ``body`` at ``timestamp``."""
    sig = key.sign(f"{timestamp}.".encode() + body).signature.hex()
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: f"ed25519={sig}"}


def verify(public_key: str, timestamp: str | None, signature: str | None, body: bytes,
           now: float, tolerance_s: float = TOLERANCE_S) -> bool:
    """A consumer's check: the signature over the exact bytes, a timestamp within
    ``tolerance_s`` of ``now``.  The code docs/webhooks.md shows."""
    if timestamp is None or signature is None or not timestamp.isdigit():
        return False
    if abs(now - int(timestamp)) > tolerance_s or not signature.startswith("ed25519="):
        return False
    try:
        nacl.signing.VerifyKey(bytes.fromhex(public_key)).verify(
            timestamp.encode() + b"." + body, bytes.fromhex(signature[len("ed25519="):]))
    except (ValueError, nacl.exceptions.BadSignatureError):
        return False
    return True
