"""The invoke envelope and the model's contract, between HTTP and dispatch.

``{"request": {...}, "output_targets": [...]?}`` is the platform-owned outer
envelope (any other key is 422 ``invalid_params`` naming it).  :class:`Contract`
wraps a manifest's ``serving.spec`` (spec DSL v2, :mod:`.spec_dsl`): the
effective request (defaults, enum-option overrides, validation), the output
targets checked and their hosts vetted before any work (:mod:`.upload`), and
the delivery of results: inline (binary fields as ``<name>_b64``) or PUT to the
targets (then the receipts: ``output_id`` + the non-binary fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aotx_trio import errors
from aotx_trio.router.spec_dsl import Spec, parse_spec
from aotx_trio.router.upload import Target, UploadPolicy, check_targets, put_all, vet_targets

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
    """One model's (or scratch revision's) contract, applied to one invoke."""

    def __init__(self, spec: Mapping[str, Any] | Spec, policy: UploadPolicy) -> None:
        self.spec = spec if isinstance(spec, Spec) else parse_spec(dict(spec))
        self.policy = policy

    def effective(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return self.spec.effective(dict(request))

    async def targets(self, env: Envelope, effective: dict[str, Any]) -> list[Target] | None:
        """The vetted upload targets (None: inline delivery); before any work."""
        delivery = self.spec.results.delivery
        if env.output_targets is None:
            if "inline" not in delivery:
                raise _bad("this model delivers by upload only: output_targets is required",
                           "output_targets", "required")
            return None
        if "upload" not in delivery:
            raise _bad("this model's contract delivers inline only", "output_targets",
                       "delivery")
        checked = check_targets(env.output_targets, self.spec.result_count(effective),
                                self.policy)
        return await vet_targets(checked, self.policy)

    async def deliver(self, targets: list[Target] | None, results: list[dict[str, Any]],
                      ) -> list[dict[str, Any]]:
        if targets is None:
            return self.spec.wire_results(results)
        bodies = self.spec.results.upload_bodies(results)
        ids = await put_all(targets, bodies, self.policy)
        return self.spec.wire_results(results, ids)
