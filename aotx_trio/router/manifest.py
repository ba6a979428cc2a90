"""Caller-supplied serving manifests and specs, checked whole before the registry
stores them (422 ``invalid_params`` naming the field): the one place the registry's
documents meet the spec DSL, so ``registry/`` never imports ``router/``.
"""

from __future__ import annotations

from typing import Any, cast

from pydantic import ValidationError

from aotx_trio.errors import InvalidInput
from aotx_trio.registry.records import Manifest
from aotx_trio.router.spec.dsl import parse_spec


def check_spec(spec: Any) -> dict[str, Any]:
    """``spec`` if it is a valid spec DSL v2 document (docs/formats/spec-dsl.md), checked
    whole by :func:`~aotx_trio.router.spec.dsl.parse_spec`; else 422 ``invalid_params``
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
