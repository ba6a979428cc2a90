"""Who served an invoke: the router's check of the identity a runtime reports (its
build commit, artifact and descriptor digests, computed by :mod:`aotx_trio.identity`)
against the release it expects (docs/decisions.md, "Deployment, identity and
attestation"): :func:`mismatches` lists the fields that differ (502
``attestation_mismatch`` when non-empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aotx_trio.registry.records import Release


def expected(release: Release) -> dict[str, Any]:
    """What a runtime serving ``release`` must report."""
    return {"source_commit": release.source_commit,
            "artifact_sha256": release.artifact.sha256,
            "descriptor_sha256": release.descriptor_sha256}


def mismatches(want: Mapping[str, Any], seen: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{"field", "expected", "observed"}]`` for each field that differs."""
    return [{"field": k, "expected": v, "observed": seen.get(k)}
            for k, v in want.items() if seen.get(k) != v]
