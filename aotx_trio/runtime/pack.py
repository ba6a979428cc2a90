"""``aotx pack``: create or update a complete runtime file (docs/formats/ccir.md).

* a new file: the given text models and embedding folder, profile as asked;
* ``--shared`` alone on an existing file: verifies its extents and saves the
  required shared profile by rewriting only the 128-byte header in place (the
  table and every extent stay byte-identical); repeating it writes nothing;
* ``--model``/``--embedding`` on an existing file: adds or replaces components
  (same text-model file name, or the whole embedding set) and rewrites the file
  through a temporary copy and a rename, keeping the profile and lineage;
* ``--auto-memory NAME`` / ``--no-auto-memory NAME``: sets / clears the
  automatic-memory capability of the text model NAME (its component flag; shared
  memory retention mode 2): a table change, so the file is rewritten the same way
  (the extents copied and checked against their digests).  A replaced model keeps
  the flag its old component had unless one of these names it.
* ``--kv-f16 NAME`` / ``--kv-f32 NAME``: sets / clears the text model NAME's f16 KV flag
  (the runtime loads it with ``Engine.load(kv_f16=True)``: K/V pages of binary16, half
  the KV memory).  A text model new to the file gets the flag by default (``--kv-f32``
  at the same time opts out); a replaced model keeps its old flag, and an entry
  written before the flag existed keeps float32 KV until ``--kv-f16`` names it.

Lineage: drawn at random (16 bytes, nonzero) when a file first gets the shared
profile, then kept forever; ``lineage=`` (CLI ``--lineage HEX``) pins it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path

from aotx_trio._fs import flock_nb
from aotx_trio.errors import ConfigError, FormatError, InvalidInput
from aotx_trio.native.chat_template import ChatTemplate
from aotx_trio.native.gguf import GGUFFile, check_supported
from aotx_trio.runtime import ccir
from aotx_trio.runtime.ccir import (
    FLAG_AUTOMATIC_MEMORY,
    FLAG_KV_F16,
    KIND_EMBEDDING_FILE,
    KIND_TEXT_MODEL_GGUF,
    RuntimeFile,
    Source,
)

#: Files an embedding folder must hold at its top level (plus one ``*.safetensors``).
EMBEDDING_REQUIRED = ("config.json", "tokenizer.json")

_HEX32 = re.compile(r"[0-9a-f]{32}")


def parse_lineage(value: str | bytes) -> bytes:
    """16 nonzero bytes from 32 lowercase hex digits (or the bytes themselves)."""
    raw: bytes | None
    if isinstance(value, bytes):
        raw = value if len(value) == 16 else None
    else:
        raw = bytes.fromhex(value) if _HEX32.fullmatch(value) else None
    if raw is None or not any(raw):
        raise InvalidInput("lineage must be 32 lowercase hexadecimal digits, not all zero",
                           code="lineage_invalid", field="lineage")
    return raw


def new_lineage() -> bytes:
    while True:
        raw = os.urandom(16)
        if any(raw):
            return raw


def model_source(path: str | os.PathLike[str]) -> Source:
    """A GGUF text model file as a component named by its file name.  Refused when the
    engine could not run it (native/gguf.py ``check_supported``: its architecture, its
    tokenizer, a tensor's type, each named with what is supported) or its chat template
    does not compile."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            magic = f.read(4)
            length = os.fstat(f.fileno()).st_size
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        raise InvalidInput(f"--model {p.name}: not a readable file",
                           code="model_missing", field="model") from exc
    if magic != b"GGUF":
        raise InvalidInput(f"--model {p.name}: not a GGUF file (magic {magic!r})",
                           code="model_invalid", field="model")
    ccir.validate_name(p.name, "model")
    try:
        g = GGUFFile.open(p)
    except FormatError as exc:
        raise InvalidInput(f"--model {p.name}: not a readable GGUF file ({exc.message})",
                           code="model_invalid", field="model") from None
    with g:                  # what the engine cannot run is refused here, not at boot
        check_supported(g)
        template = g.string("tokenizer.chat_template")
    if template is not None:
        ChatTemplate(template, name=p.name)   # compiles, or a clear error naming the file
    return Source(KIND_TEXT_MODEL_GGUF, p.name, p, 0, length)


def embedding_sources(folder: str | os.PathLike[str]) -> list[Source]:
    """One component per regular file of an embedding folder (relative path, sorted).

    Hidden files and folders (a name starting with '.') are skipped; so are
    symlinked folders.  Symlinked files are packed by content.
    """
    root = Path(folder)
    if not root.is_dir():
        raise InvalidInput(f"--embedding {root.name}: not a folder",
                           code="embedding_missing", field="embedding")
    found: list[Source] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        base = Path(dirpath)
        for fn in sorted(filenames):
            p = base / fn
            if fn.startswith(".") or not p.is_file():
                continue
            rel = p.relative_to(root).as_posix()
            ccir.validate_name(rel, "embedding")
            found.append(Source(KIND_EMBEDDING_FILE, rel, p, 0, p.stat().st_size))
    top = {s.name for s in found}
    missing = [n for n in EMBEDDING_REQUIRED if n not in top]
    if not any(n.endswith(".safetensors") and "/" not in n for n in top):
        missing.append("*.safetensors")
    if missing:
        raise InvalidInput(f"--embedding {root.name}: missing {', '.join(missing)}",
                           code="embedding_invalid", field="embedding")
    return found


def pack(runtime: str | os.PathLike[str], *, models: Sequence[str | os.PathLike[str]] = (),
         embedding: str | os.PathLike[str] | None = None, shared: bool = False,
         lineage: str | bytes | None = None, progress: bool | None = None,
         auto_memory: Sequence[str] = (), no_auto_memory: Sequence[str] = (),
         kv_f16: Sequence[str] = (), kv_f32: Sequence[str] = ()) -> RuntimeFile:
    """Create or update a complete runtime file; returns the file as written.

    An existing file is locked exclusively first (``flock``): while a runtime holds it
    (``aotx boot`` / ``aotx serve`` keep a shared lock) this refuses with
    ``runtime_in_use`` and touches nothing.  Text models new to the file get the f16 KV
    flag unless ``kv_f32`` names them."""
    target = Path(runtime)
    if target.exists() and not target.is_file():
        raise InvalidInput(f"--runtime {target}: not a regular file", code="runtime_invalid",
                           field="runtime")
    lock = flock_nb(target, shared=False) if target.exists() else -1
    if lock is None:
        raise ConfigError(f"--runtime {target}: in use by a running runtime (aotx boot or "
                          "aotx serve); stop it first", code="runtime_in_use", field="runtime")
    try:
        asks = [_flag_ask(FLAG_AUTOMATIC_MEMORY, "auto_memory",
                          ("--auto-memory", "--no-auto-memory"), auto_memory, no_auto_memory),
                _flag_ask(FLAG_KV_F16, "kv_type", ("--kv-f16", "--kv-f32"), kv_f16, kv_f32)]
        return _pack(target, models, embedding, shared, lineage, progress, asks)
    finally:
        if lock >= 0:
            os.close(lock)


@dataclasses.dataclass(frozen=True)
class _FlagAsk:
    """One text-model flag and what the options asked of it (model name -> on/off)."""

    flag: int
    field: str            # the error's field (and code prefix: ``<field>_invalid``)
    options: tuple[str, str]   # the options that set / clear it (named in errors)
    names: dict[str, bool]


def _flag_ask(flag: int, field: str, options: tuple[str, str], on: Sequence[str],
              off: Sequence[str]) -> _FlagAsk:
    """The ask for one flag (text model name -> on/off); naming one model both ways is
    ``<field>_invalid``."""
    both = sorted(set(on) & set(off))
    if both:
        raise InvalidInput(f"{options[0]} and {options[1]} both name {both[0]!r}",
                           code=f"{field}_invalid", field=field)
    return _FlagAsk(flag, field, options,
                    {**{n: False for n in off}, **{n: True for n in on}})


def _with_flags(sources: list[Source], asks: Sequence[_FlagAsk]) -> tuple[list[Source], bool]:
    """``sources`` with each flag set/cleared as its ask says (names of text models);
    whether any flag changed."""
    texts = {s.name for s in sources if s.kind == KIND_TEXT_MODEL_GGUF}
    for ask in asks:
        for name, on in ask.names.items():
            if name not in texts:
                option = ask.options[0] if on else ask.options[1]
                raise InvalidInput(f"{option} {name}: no text model of that name in the "
                                   f"runtime file ({sorted(texts)})",
                                   code=f"{ask.field}_invalid", field=ask.field)
    out: list[Source] = []
    changed = False
    for s in sources:
        if s.kind == KIND_TEXT_MODEL_GGUF:
            flags = s.flags
            for ask in asks:
                if s.name in ask.names:
                    flags = flags | ask.flag if ask.names[s.name] else flags & ~ask.flag
            changed |= flags != s.flags
            s = dataclasses.replace(s, flags=flags)
        out.append(s)
    return out, changed


def _pack(target: Path, models: Sequence[str | os.PathLike[str]],
          embedding: str | os.PathLike[str] | None, shared: bool,
          lineage: str | bytes | None, progress: bool | None,
          asks: Sequence[_FlagAsk] = ()) -> RuntimeFile:
    existing = RuntimeFile.open(target) if target.exists() else None
    pinned = parse_lineage(lineage) if lineage is not None else None

    new_models = [model_source(m) for m in models]
    names = [s.name for s in new_models]
    if len(set(names)) != len(names):
        raise InvalidInput("two --model files have the same file name",
                           code="model_invalid", field="model")
    new_embedding = embedding_sources(embedding) if embedding is not None else None

    was_shared = existing is not None and existing.shared
    want_shared = shared or was_shared
    if pinned is not None and not want_shared:
        raise InvalidInput("--lineage needs --shared", code="lineage_invalid", field="lineage")
    if was_shared:
        assert existing is not None
        lineage_bytes = existing.header.lineage
        if pinned is not None and pinned != lineage_bytes:
            raise InvalidInput(f"{target.name} already has lineage {existing.lineage}; "
                               "a shared runtime keeps its lineage",
                               code="lineage_conflict", field="lineage")
    elif want_shared:
        lineage_bytes = pinned if pinned is not None else new_lineage()
    else:
        lineage_bytes = bytes(16)
    required = (existing.profile.required if existing else 0) | \
        (ccir.PROFILE_SHARED if want_shared else 0)

    kept: list[Source] = []
    old_flags: dict[str, int] = {}
    if existing is not None:
        for c in existing.components:
            replaced = (c.kind == KIND_TEXT_MODEL_GGUF and c.name in names) or \
                (c.kind == KIND_EMBEDDING_FILE and new_embedding is not None)
            if not replaced:
                kept.append(Source(c.kind, c.name, target, c.offset, c.length, c.sha256,
                                   c.flags))
            elif c.kind == KIND_TEXT_MODEL_GGUF:
                old_flags[c.name] = c.flags
    # A replaced model keeps its entry's flags; a model new to the file gets f16 KV.
    new_models = [dataclasses.replace(m, flags=old_flags.get(m.name, FLAG_KV_F16))
                  for m in new_models]
    sources, flags_changed = _with_flags(kept + new_models + (new_embedding or []), asks)
    if not sources:
        raise InvalidInput("a new runtime file needs --model or --embedding",
                           code="runtime_empty", field="model")
    if want_shared and not any(s.kind == KIND_EMBEDDING_FILE for s in sources):
        raise InvalidInput("the shared profile needs the text embedding model "
                           "(add --embedding DIR)", code="embedding_missing", field="embedding")

    if existing is not None and not new_models and new_embedding is None and not flags_changed:
        # Header-only change: the table and every extent stay where they are.
        existing.verify(progress)
        if required == existing.profile.required and lineage_bytes == existing.header.lineage:
            return existing
        return ccir.rewrite_header(existing, required=required,
                                   optional=existing.profile.optional, lineage=lineage_bytes)

    optional = (existing.profile.optional if existing else 0) & ccir.KNOWN_OPTIONAL
    return ccir.write_runtime(target, sources, required=required, optional=optional,
                              lineage=lineage_bytes, progress=progress)


def describe(rf: RuntimeFile) -> list[str]:
    profile = ", ".join(name for bit, name in ccir.PROFILE_NAMES.items()
                        if rf.profile.required >> bit & 1) or "none"
    lines = [f"runtime: {rf.path}", f"profile: {profile}", f"lineage: {rf.lineage}"]
    for c in rf.components:
        flags = "".join(f" [{name}]" for bit, name in ccir.FLAG_NAMES.items() if c.flags & bit)
        lines.append(f"  {c.kind_name:<16} {c.length:>12} {c.sha256_hex[:16]}  {c.name}{flags}")
    return lines


def main(args: argparse.Namespace) -> int:
    journal_dir = getattr(args, "checkpoint", None)
    if journal_dir is None or args.model or args.embedding or args.shared or \
            getattr(args, "lineage", None) is not None or \
            getattr(args, "auto_memory", None) or getattr(args, "no_auto_memory", None) or \
            getattr(args, "kv_f16", None) or getattr(args, "kv_f32", None):
        rf = pack(args.runtime, models=args.model, embedding=args.embedding, shared=args.shared,
                  lineage=getattr(args, "lineage", None),
                  auto_memory=getattr(args, "auto_memory", None) or (),
                  no_auto_memory=getattr(args, "no_auto_memory", None) or (),
                  kv_f16=getattr(args, "kv_f16", None) or (),
                  kv_f32=getattr(args, "kv_f32", None) or ())
        print("\n".join(describe(rf)))
    if journal_dir is not None:
        from aotx_trio.runtime import checkpoint  # the device and the journal: only here
        done = checkpoint.pack_checkpoint(Path(args.runtime), Path(journal_dir),
                                          full=bool(getattr(args, "full_replay", False)))
        print(f"checkpoint: {done.anchor.records} journal records ({done.section_bytes} "
              f"bytes), replayed from record {done.replayed_from}")
    return 0
