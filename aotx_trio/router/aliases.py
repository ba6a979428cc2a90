"""Alias resolution: the complete verified chain, or 404 ``alias_unresolved``.

A level-0 alias targets a model id; a level-N alias targets an alias of level
N-1; levels above the registry's ``max_alias_level`` are too deep.  Every
resolution re-verifies the whole chain.  A failure carries the ``chain`` up to
and including the failing link and a ``reason``: ``missing``, ``corrupt``,
``removed``, ``level_mismatch``, ``cycle`` or ``too_deep``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aotx_trio.errors import Conflict, FormatError, Gone, InvalidInput, NotFound
from aotx_trio.registry.records import Alias, check_key, parse
from aotx_trio.router.registry import ModelView, Registry


@dataclass(frozen=True)
class Resolution:
    alias: str
    model_id: str
    chain: list[dict[str, Any]]
    model: ModelView


def _unresolved(name: str, chain: list[dict[str, Any]], reason: str, at: str,
                ) -> NotFound:
    return NotFound(f"alias {name!r} does not resolve: {reason} at {at!r}",
                    code="alias_unresolved", alias=name, reason=reason, at=at,
                    chain=chain)


async def _alias(reg: Registry, key: str) -> Alias | None:
    body = await reg.run(reg.store.get, "aliases", key)
    return None if body is None else parse(Alias, body, f"aliases/{key}")


async def _is_model(reg: Registry, key: str) -> bool:
    return await reg.run(reg.store.get, "manifests", key) is not None


async def _walk(reg: Registry, name: str, first: str, level: int | None,
                chain: list[dict[str, Any]]) -> Resolution:
    """Follow ``first`` (an alias expected at ``level``, None: any) to its model."""
    seen = {c["name"] for c in chain}
    cur, expected = first, level
    while True:
        if cur in seen:
            raise _unresolved(name, chain, "cycle", cur)
        seen.add(cur)
        try:
            rec = await _alias(reg, cur)
        except FormatError:
            raise _unresolved(name, chain, "corrupt", cur) from None
        if rec is None:
            why = "level_mismatch" if chain and await _is_model(reg, cur) else "missing"
            raise _unresolved(name, chain, why, cur)
        chain.append({"name": rec.name, "level": rec.level, "target": rec.target})
        if rec.level > reg.max_alias_level or len(chain) > reg.max_alias_level + 1:
            raise _unresolved(name, chain, "too_deep", cur)
        if expected is not None and rec.level != expected:
            raise _unresolved(name, chain, "level_mismatch", cur)
        if rec.level > 0:
            cur, expected = rec.target, rec.level - 1
            continue
        target = rec.target
        if target in seen:
            raise _unresolved(name, chain, "cycle", target)
        try:
            model = await reg.get_model(target)
        except Gone:
            raise _unresolved(name, chain, "removed", target) from None
        except FormatError:
            raise _unresolved(name, chain, "corrupt", target) from None
        except NotFound:
            why = "level_mismatch" if await _alias(reg, target) else "missing"
            raise _unresolved(name, chain, why, target) from None
        return Resolution(name, target, chain, model)


async def set_alias(reg: Registry, name: str, target: str, level: int, *,
                    verify: bool = True) -> Alias:
    """Move alias ``name`` to ``target`` at ``level`` (its chain verified first unless
    ``verify`` is false), then append ``alias.moved``."""
    check_key(name, "alias")
    check_key(target, "target")
    if not 0 <= level <= reg.max_alias_level:
        raise InvalidInput(f"alias level must be 0..{reg.max_alias_level}",
                           code="invalid_params", param="level", rule="range")
    if await _is_model(reg, name):
        raise Conflict(f"{name!r} is a model id; an alias cannot shadow it")
    if verify:
        await check_target(reg, name, target, level)
    doc = Alias(name=name, target=target, level=level, set_at=reg.stamp())
    await reg.write("aliases", name, doc.body())
    await reg.emit("aliases", name, doc.body())
    return doc


async def resolve_alias(reg: Registry, name: str) -> Resolution:
    return await _walk(reg, name, name, None, [])


async def check_target(reg: Registry, name: str, target: str, level: int) -> None:
    """Refuse an alias ``name`` -> ``target`` at ``level`` whose chain would not resolve."""
    chain = [{"name": name, "level": level, "target": target}]
    if level == 0:
        try:
            await reg.get_model(target)
        except (Gone, NotFound, FormatError) as exc:
            reason = {"model_removed": "removed"}.get(exc.code, "missing")
            if isinstance(exc, FormatError):
                reason = "corrupt"
            raise _unresolved(name, chain, reason, target) from None
        return
    await _walk(reg, name, target, level - 1, chain)


async def resolve(reg: Registry, target: str) -> tuple[ModelView, Resolution | None]:
    """``GET /models/{id-or-alias}``: an exact model id first, else an alias."""
    try:
        return await reg.get_model(target), None
    except NotFound as exc:
        if exc.fields.get("reason") == "unpublished":
            raise
        try:
            is_alias = await reg.run(reg.store.get, "aliases", target) is not None
        except ValueError:
            is_alias = False
        if not is_alias:
            raise
    res = await resolve_alias(reg, target)
    return res.model, res
