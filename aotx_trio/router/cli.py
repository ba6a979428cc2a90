"""``aotx registry``: the registry's admin commands over the same store the router reads.

``--data DIR`` is the folder store at ``DIR/registry`` (shared with ``aotx
serve``), ``--store postgresql://...`` the PostgreSQL store.  Each command
prints one line, or with ``--json`` one JSON object.  Arguments: ``cli_args.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from pydantic import ValidationError

from aotx_trio import identity
from aotx_trio.errors import InvalidInput
from aotx_trio.identity import Descriptor
from aotx_trio.registry.backends import open_store
from aotx_trio.registry.records import ArtifactRef, EngineSet, check_commit
from aotx_trio.router.aliases import resolve, resolve_alias, set_alias
from aotx_trio.router.artifacts import Progress, artifact_size, store_artifact
from aotx_trio.router.registry import ModelView, Registry, ReleaseView
from aotx_trio.router.scratch import Scratch

Handler = Callable[[Registry, argparse.Namespace], Awaitable[dict[str, Any]]]


def _json_file(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{what} {path}: {exc}", param=what) from None


def source_commit(args: argparse.Namespace) -> str:
    """--source-commit, else $AOTX_SOURCE_COMMIT, else the package's git HEAD."""
    value = args.source_commit or identity.source_commit()
    if not value:
        raise InvalidInput("no source commit: pass --source-commit", param="source_commit")
    return check_commit(value)


def _descriptor(args: argparse.Namespace) -> Descriptor:
    try:
        return Descriptor(backend=args.backend, threads=args.threads,
                          kv_page_tokens=args.kv_page_tokens, context=args.context,
                          kv_type=args.kv_type)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(["descriptor", *(str(p) for p in first["loc"])])
        raise InvalidInput(f"{where}: {first['msg']}", param=where) from None


async def _artifact(reg: Registry, path: str) -> ArtifactRef:
    """Copy an artifact into the store, with a progress bar on a TTY."""
    progress: Progress | None = None
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=artifact_size(path), unit="B", unit_scale=True, desc="copying")
        progress = bar.update
    try:
        return await reg.run(store_artifact, reg.store, path, progress)
    finally:
        if bar is not None:
            bar.close()


def _model(view: ModelView, chain: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"model_id": view.model_id,
                           "manifest": view.manifest.model_dump(mode="json"),
                           "manifest_sha256": view.manifest_sha256, "state": view.state,
                           "successor_id": view.successor_id,
                           "published_at": view.published.published_at}
    if chain is not None:
        out["resolution_chain"] = chain
    return out


def _release(view: ReleaseView) -> dict[str, Any]:
    return {**view.release.model_dump(mode="json"), "release_sha256": view.release_sha256,
            "engine_set_sha256": view.release.engine_set_sha256, "state": view.state,
            "successor": view.successor}


async def _publish(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    spec = _json_file(args.spec, "spec")
    extra = _json_file(args.manifest, "manifest") if args.manifest else {}
    engine_set = _engine_set(args)
    art = await _artifact(reg, args.artifact)
    rel = await reg.mint_release(args.release, art, _descriptor(args), source_commit(args),
                                 engine_set)
    manifest = {**extra, "model_type": args.model_type, "artifact": art.model_dump(mode="json"),
                "serving": {**extra.get("serving", {}), "spec": spec,
                            "runtime_release": {"name": rel.name,
                                                "source_commit": rel.source_commit}}}
    return _model(await reg.publish(args.model_id, manifest))


async def _unpublish(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    return (await reg.unpublish(args.model_id, args.reason)).model_dump(mode="json")


async def _state(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    doc = await reg.set_model_state(args.model_id, args.state, args.successor)
    return doc.model_dump(mode="json")


async def _show(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    view, res = await resolve(reg, args.target)
    return _model(view, res.chain if res else None)


async def _list(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    views = await reg.list_models(args.model_type, args.state)
    return {"models": [_model(v) for v in views]}


def _engine_set(args: argparse.Namespace) -> EngineSet | None:
    """--engine-set NAME:SHA256 (None when not given)."""
    if not args.engine_set:
        return None
    name, _, sha = args.engine_set.partition(":")
    try:
        return EngineSet(name=name, sha256=sha)
    except ValueError:
        raise InvalidInput("--engine-set is NAME:SHA256", param="engine_set") from None


async def _mint(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    engine_set = _engine_set(args)
    art = await _artifact(reg, args.artifact)
    await reg.mint_release(args.name, art, _descriptor(args), source_commit(args), engine_set)
    return _release(await reg.get_release(args.name))


async def _deploy(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    return (await reg.deploy_release(args.name, args.runtime)).model_dump(mode="json")


async def _disable(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    await reg.set_release_state(args.name, "disabled", args.successor)
    return _release(await reg.get_release(args.name))


async def _release_show(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    return _release(await reg.get_release(args.name))


async def _alias_set(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    doc = await set_alias(reg, args.name, args.target, args.level, verify=not args.no_verify)
    return doc.model_dump(mode="json")


async def _alias_show(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    res = await resolve_alias(reg, args.name)
    return {"alias": res.alias, "model_id": res.model_id, "chain": res.chain}


async def _scratch_open(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    based_on = json.loads(args.based_on) if args.based_on else {}
    s = await Scratch(reg).open(lease_s=args.lease_s, based_on=based_on)
    return s.model_dump(mode="json")


async def _scratch_revise(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    spec = _json_file(args.spec, "spec")
    draft = _json_file(args.manifest, "manifest") if args.manifest else {}
    draft.setdefault("model_type", args.model_type)
    draft.setdefault("serving", {}).setdefault(
        "runtime_release", {"name": "scratch", "source_commit": source_commit(args)})
    art = await _artifact(reg, args.artifact)
    rev = await Scratch(reg).revise(args.session_id, spec=spec, artifact=art,
                                    draft_manifest=draft)
    return rev.model_dump(mode="json")


async def _scratch_stop(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    return (await Scratch(reg).stop(args.session_id)).model_dump(mode="json")


async def _scratch_promote(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    view = await Scratch(reg).promote(args.session_id, args.model_id, release=args.release,
                                      source_commit=source_commit(args),
                                      descriptor=_descriptor(args))
    return _model(view)


async def _scratch_show(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    return (await Scratch(reg).get(args.session_id)).model_dump(mode="json")


async def _scratch_list(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    sessions = await Scratch(reg).sessions(active=not args.all)
    return {"sessions": [s.model_dump(mode="json") for s in sessions]}


async def _events(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    return {"events": await reg.events(args.after, args.limit)}


async def _heal(reg: Registry, args: argparse.Namespace) -> dict[str, Any]:
    return {"healed": await reg.heal(), "trimmed": await reg.trim()}


HANDLERS: dict[str, Handler] = {
    "publish": _publish, "unpublish": _unpublish, "state": _state, "show": _show,
    "list": _list, "release mint": _mint, "release deploy": _deploy,
    "release disable": _disable, "release show": _release_show, "alias set": _alias_set,
    "alias show": _alias_show, "scratch open": _scratch_open,
    "scratch revise": _scratch_revise, "scratch stop": _scratch_stop,
    "scratch promote": _scratch_promote, "scratch show": _scratch_show,
    "scratch list": _scratch_list, "events": _events, "heal": _heal,
}


def _key(args: argparse.Namespace) -> str:
    cmd = str(args.registry_command)
    action = getattr(args, f"{cmd}_command", None)
    return f"{cmd} {action}" if action else cmd


def _human(result: dict[str, Any]) -> str:
    for field in ("model_id", "name", "session_id", "release"):
        if field in result:
            rest = {k: v for k, v in result.items()
                    if k in ("state", "target", "level", "reason", "generation", "runtime")}
            return f"{result[field]} " + " ".join(f"{k}={v}" for k, v in rest.items())
    return json.dumps(result, indent=2, sort_keys=True)


def main(args: argparse.Namespace) -> int:
    handler = HANDLERS[_key(args)]
    if args.store:
        store = open_store(url=args.store)
    else:
        store = open_store(data=args.data or "./aotx-data")

    async def run() -> dict[str, Any]:
        reg = Registry(store)
        try:
            return await handler(reg, args)
        finally:
            await reg.aclose()

    result = trio.run(run)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(_human(result))
    return 0

