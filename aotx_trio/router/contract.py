"""The invoke envelope and the model's contract, between HTTP and dispatch.

``{"request": {...}, "output_targets": [...]?}`` is the platform-owned outer
envelope (any other key is 422 ``invalid_params`` naming it).  :class:`Contract`
wraps a manifest's ``serving.spec`` (spec DSL v2, ``spec_dsl.py``): the
effective request (defaults, enum-option overrides, validation), the output
targets checked before any work (``upload.py``), and the delivery of results
(inline, binary fields as ``<name>_b64``, or uploaded).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aotx_trio import errors

ENVELOPE_KEYS = ("request", "output_targets")


def _bad(message: str, param: str, rule: str) -> errors.InvalidInput:
    return errors.InvalidInput(message, code="invalid_params", param=param, rule=rule)


@dataclass(frozen=True)
class Envelope:
    request: dict[str, Any]
    output_targets: list[Any] | None


def envelope(body: Any) -> Envelope:
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object", "body", "type")
    for key in body:
        if key not in ENVELOPE_KEYS:
            raise _bad(f"unknown envelope field {str(key)[:80]!r}", str(key)[:80], "unknown")
    request = body.get("request")
    if not isinstance(request, dict):
        raise _bad("request must be an object", "request", "type")
    targets = body.get("output_targets")
    if targets is not None and not isinstance(targets, list):
        raise _bad("output_targets must be a list", "output_targets", "type")
    return Envelope(request, targets)


class Contract:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        results = spec.get("results") or {}
        self.binary = {str(f["name"]) for f in results.get("fields", [])
                       if isinstance(f, dict) and f.get("type") == "binary"}

    def effective(self, request: Mapping[str, Any]) -> dict[str, Any]:
        names = {str(p.get("name")) for p in self.spec.get("params", []) if isinstance(p, dict)}
        for key in request:
            if key not in names:
                raise _bad(f"parameter {str(key)[:80]!r} is not in the model's contract",
                           str(key)[:80], "unknown")
        out = {str(p["name"]): p["default"] for p in self.spec.get("params", [])
               if isinstance(p, dict) and "default" in p}
        out.update(request)
        return out

    def check_targets(self, env: Envelope, request: Mapping[str, Any]) -> None:
        if env.output_targets is not None:
            raise _bad("this model's contract delivers inline only", "output_targets",
                       "delivery")

    async def deliver(self, env: Envelope, results: list[dict[str, Any]],
                      ) -> list[dict[str, Any]]:
        return [{(f"{k}_b64" if k in self.binary else k):
                 (base64.b64encode(v).decode("ascii") if k in self.binary else v)
                 for k, v in r.items()} for r in results]
