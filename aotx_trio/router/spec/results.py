"""Spec DSL v2 results (docs/formats/spec-dsl.md): the declared result fields,
the delivery modes, the request list the results align with, and the wire rule
(binary field ``<name>`` travels as ``<name>_b64``)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aotx_trio.errors import UpstreamFailure
from aotx_trio.router.spec.values import NAME, TYPES, invalid, type_of

DELIVERIES = ("inline", "upload")
MAX_RESULT_FIELDS = 64
#: names a result field may not have: the upload receipt's own field
RESERVED_RESULT_NAMES = frozenset({"output_id"})


@dataclass(frozen=True)
class ResultField:
    name: str
    type: str
    nullable: bool = False

    @property
    def binary(self) -> bool:
        return self.type == "binary"

    @property
    def wire_name(self) -> str:
        return f"{self.name}_b64" if self.binary else self.name


@dataclass(frozen=True)
class Results:
    fields: tuple[ResultField, ...] = ()
    delivery: tuple[str, ...] = ("inline",)
    per_item: str | None = None

    @property
    def binary_fields(self) -> tuple[ResultField, ...]:
        return tuple(f for f in self.fields if f.binary)

    def check(self, results: Any, expected: int | None = None) -> list[dict[str, Any]]:
        """The runtime's results carry exactly the declared fields with their types, and
        ``expected`` of them when given (else 502 ``upstream_failure``: the runtime broke
        the contract)."""
        if not isinstance(results, list):
            raise _broken("results", "the runtime's results are not a list")
        if expected is not None and len(results) != expected:
            raise _broken("results", f"{len(results)} results where the request asks for "
                          f"{expected}")
        names = [f.name for f in self.fields]
        for i, result in enumerate(results):
            where = f"results[{i}]"
            if not isinstance(result, dict):
                raise _broken(where, f"{where} is not an object")
            extra = [k for k in result if k not in names]
            missing = [n for n in names if n not in result]
            if extra or missing:
                undeclared = [str(k)[:40] for k in extra[:8]]
                raise _broken(where, f"{where} does not carry exactly the declared fields "
                              f"(missing {missing[:8]}, undeclared {undeclared})")
            for field in self.fields:
                value = result[field.name]
                if value is None and field.nullable:
                    continue
                got = "binary" if isinstance(value, bytes | bytearray | memoryview) \
                    else type_of(value)
                if got != field.type and not (field.type == "number" and got == "integer"):
                    raise _broken(f"{where}.{field.name}",
                                  f"{where}.{field.name} is {got}, declared {field.type}")
        return results

    def wire(self, results: Any, output_ids: Sequence[str] | None = None,
             expected: int | None = None) -> list[dict[str, Any]]:
        """The HTTP JSON form: inline, binary fields as ``<name>_b64``; for upload
        delivery (``output_ids`` given, one per result) the receipts: ``output_id`` and
        the non-binary fields (the binary ones went to the targets)."""
        checked = self.check(results, expected)
        if output_ids is not None and len(output_ids) != len(checked):
            raise _broken("results", f"{len(checked)} results for {len(output_ids)} targets")
        out: list[dict[str, Any]] = []
        for i, result in enumerate(checked):
            item: dict[str, Any] = {} if output_ids is None else {"output_id": output_ids[i]}
            for field in self.fields:
                value = result[field.name]
                if field.binary:
                    if output_ids is not None:
                        continue
                    value = None if value is None else base64.b64encode(bytes(value)).decode()
                item[field.wire_name] = value
            out.append(item)
        return out

    def upload_bodies(self, results: Any) -> list[bytes]:
        """The bytes each upload target receives: the one binary field of each result."""
        checked = self.check(results)
        (field,) = self.binary_fields
        return [bytes(r[field.name] or b"") for r in checked]


def _broken(where: str, message: str) -> UpstreamFailure:
    return UpstreamFailure(f"the runtime broke the result contract: {message}",
                           code="upstream_failure", field=where, rule="results")


def parse_results(value: Any, list_params: Sequence[str]) -> Results:
    """``spec.results``; ``list_params`` are the required list params ``per_item`` may name."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise invalid("spec.results", "type", "spec.results must be an object")
    for key in value:
        if key not in ("fields", "delivery", "per_item", "description"):
            raise invalid(f"spec.results.{str(key)[:80]}", "unknown_key",
                          f"spec.results: key {str(key)[:80]!r} is not allowed")
    fields = _parse_fields(value.get("fields", []))
    delivery = value.get("delivery", ["inline"])
    if (not isinstance(delivery, list) or not delivery
            or not all(d in DELIVERIES for d in delivery) or len(set(delivery)) != len(delivery)):
        raise invalid("spec.results.delivery", "enum",
                      "spec.results.delivery must be a non-empty subset of inline, upload")
    per_item = value.get("per_item")
    if per_item is not None and per_item not in list_params:
        raise invalid("spec.results.per_item", "per_item",
                      "spec.results.per_item must name a required list param")
    results = Results(fields, tuple(delivery), per_item)
    if "upload" in delivery:
        if per_item is None:
            raise invalid("spec.results.per_item", "required",
                          "upload delivery needs spec.results.per_item")
        if len(results.binary_fields) != 1:
            raise invalid("spec.results.fields", "upload",
                          "upload delivery needs exactly one binary result field")
    return results


def _parse_fields(value: Any) -> tuple[ResultField, ...]:
    where = "spec.results.fields"
    if not isinstance(value, list) or len(value) > MAX_RESULT_FIELDS:
        raise invalid(where, "type", f"{where} must be a list of at most {MAX_RESULT_FIELDS}")
    out: list[ResultField] = []
    wire: set[str] = set()
    for i, obj in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(obj, dict):
            raise invalid(at, "type", f"{at} must be an object")
        for key in obj:
            if key not in ("name", "type", "nullable", "description", "media_type"):
                raise invalid(f"{at}.{str(key)[:80]}", "unknown_key",
                              f"{at}: key {str(key)[:80]!r} is not allowed")
        name, kind, nullable = obj.get("name"), obj.get("type"), obj.get("nullable", False)
        if not isinstance(name, str) or not NAME.match(name):
            raise invalid(f"{at}.name", "name", f"{at}.name must match [a-z][a-z0-9_]{{0,63}}")
        if name in RESERVED_RESULT_NAMES:
            raise invalid(f"{at}.name", "reserved_name", f"{at}.name {name} is reserved")
        if kind not in TYPES:
            raise invalid(f"{at}.type", "type", f"{at}.type must be one of {', '.join(TYPES)}")
        if not isinstance(nullable, bool):
            raise invalid(f"{at}.nullable", "type", f"{at}.nullable must be a boolean")
        if "media_type" in obj and (kind != "binary" or not isinstance(obj["media_type"], str)):
            raise invalid(f"{at}.media_type", "type",
                          f"{at}.media_type is a string, for binary fields only")
        field = ResultField(name, kind, nullable)
        if field.name in wire or field.wire_name in wire:
            raise invalid(f"{at}.name", "duplicate_name",
                          f"{at}: {field.wire_name} collides with another field on the wire")
        wire |= {field.name, field.wire_name}
        out.append(field)
    return tuple(out)
