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

from aotx_trio.router.spec.dsl import Spec, parse_spec, split_envelope
from aotx_trio.router.upload import Target, UploadPolicy, check_targets, put_all, vet_targets


@dataclass(frozen=True)
class Envelope:
    request: dict[str, Any]
    output_targets: Any


def envelope(body: Any) -> Envelope:
    """The invoke body's ``request`` and ``output_targets`` (``spec_dsl.split_envelope``:
    nothing else is allowed, 422 ``invalid_params``)."""
    request, targets = split_envelope(body)
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
        if self.spec.delivery(env.output_targets) == "inline":
            return None
        checked = check_targets(env.output_targets, self.spec.result_count(effective),
                                self.policy)
        return await vet_targets(checked, self.policy)

    async def deliver(self, targets: list[Target] | None, effective: dict[str, Any],
                      results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The results on the wire: inline, or PUT to the targets (then the receipts);
        the runtime's results are checked against the contract first (502)."""
        if targets is None:
            return self.spec.wire_results(results, effective=effective)
        self.spec.wire_results(results, [t.output_id for t in targets], effective)
        bodies = self.spec.results.upload_bodies(results)
        ids = await put_all(targets, bodies, self.policy)
        return self.spec.wire_results(results, ids, effective)
