"""The ``aotx`` command line: parses arguments and calls one entry point per command.

Every entry point has the signature ``main(args: argparse.Namespace) -> int`` and
lives in the module named in ``_ENTRY``; it is imported only when its command
runs, so ``aotx --help`` never loads a model or the native library.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from aotx_trio.errors import AotxError

_ENTRY: dict[str, str] = {
    "serve": "aotx_trio.serve:main",
    "pack": "aotx_trio.runtime.pack:main",
    "boot": "aotx_trio.runtime.boot:main",
    "repair": "aotx_trio.runtime.repair:main",
    "gateway serve": "aotx_trio.gateway.serve:main",
    "gateway write-grants": "aotx_trio.grants:write_grants_main",
    "generate": "aotx_trio.engine_cli:generate_main",
    "embed": "aotx_trio.embed_cli:embed_main",
    "models": "aotx_trio.default_models:main",
    "devices": "aotx_trio.native.cuda:devices_main",
    "registry": "aotx_trio.router.cli:main",
}


def _byte_count(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count (0, 1, 2, ...)")
    return int(text)


def _journal_flags(s: argparse.ArgumentParser, cap: str, floor: str) -> None:
    """--journal-max-bytes / --journal-min-free-bytes (0 = none), with where the values
    come from when the flag is not given."""
    s.add_argument("--journal-max-bytes", type=_byte_count,
                   help=f"journal file cap, 0 = none (default: {cap})")
    s.add_argument("--journal-min-free-bytes", type=_byte_count,
                   help=f"free-disk floor under the journal, 0 = none (default: {floor})")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aotx",
                                description="aotx-trio: shared-conversation LLM runtime")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="embedded default: runtime + gateway in one process")
    s.add_argument("--data", default="./aotx-data", help="data folder (created on first run)")
    s.add_argument("--bind", default="127.0.0.1:8080", help="HOST:PORT to listen on")
    s.add_argument("--service-socket", action="store_true",
                   help="also open the runtime's service socket (<data>/journal/service.sock);"
                   " off by default: the gateway runs in-process")
    _journal_flags(s, "limits.journal_max_bytes of gateway.json",
                   "limits.journal_min_free_bytes of gateway.json")

    s = sub.add_parser("pack", help="create or update a complete runtime file")
    s.add_argument("--runtime", required=True, help="the runtime file to create or update")
    s.add_argument("--shared", action="store_true", help="save the required shared-state profile")
    s.add_argument("--model", action="append", default=[], help="a GGUF text model (repeatable)")
    s.add_argument("--embedding", help="an embedding model folder (safetensors + tokenizer.json)")
    s.add_argument("--lineage",
                   help="pin the lineage of a new shared profile (32 hex; default random)")
    s.add_argument("--checkpoint", metavar="JOURNAL_DIR",
                   help="write the state of a stopped runtime's journal folder into the "
                        "runtime file as its checkpoint (docs/formats/checkpoint.md)")
    s.add_argument("--full-replay", action="store_true",
                   help="with --checkpoint: replay and verify the whole journal instead of "
                        "starting from the file's current checkpoint")
    s.add_argument("--auto-memory", action="append", default=[], metavar="MODEL",
                   help="give the text model MODEL (its file name) the automatic-memory "
                        "capability: shared memory retention mode 2 (repeatable)")
    s.add_argument("--no-auto-memory", action="append", default=[], metavar="MODEL",
                   help="take the automatic-memory capability from MODEL (repeatable)")
    s.add_argument("--kv-f16", action="append", default=[], metavar="MODEL",
                   help="serve the text model MODEL with f16 KV pages (half the KV memory; "
                        "the default for models new to the file) (repeatable)")
    s.add_argument("--kv-f32", action="append", default=[], metavar="MODEL",
                   help="serve MODEL with float32 KV pages (repeatable)")

    s = sub.add_parser("boot", help="run the runtime process")
    s.add_argument("--ccir", required=True, help="the complete runtime file")
    s.add_argument("--journal", required=True, help="journal folder (service.sock lives here)")
    s.add_argument("--service-grants", required=True, help="folder with the deployment grant file")
    s.add_argument("--execution-deadline-s", type=float, default=300.0,
                   help="an input still running this long after it started ends "
                        "deadline_exceeded (default 300)")
    _journal_flags(s, "64 GiB", "64 MiB")

    s = sub.add_parser("repair", help="set aside a damaged journal's bytes from an offset on "
                       "(kept in <journal>/quarantine/) so the runtime starts on the rest")
    s.add_argument("--journal", required=True, help="journal folder (no runtime may hold it)")
    s.add_argument("--at", required=True, type=int,
                   help="the byte offset the refusal (journal_damage) named")

    g = sub.add_parser("gateway", help="the gateway process")
    gsub = g.add_subparsers(dest="gateway_command", required=True, metavar="SUBCOMMAND")
    s = gsub.add_parser("serve", help="serve HTTP (hypercorn, trio worker)")
    s.add_argument("--config", required=True, help="gateway.json")
    s = gsub.add_parser("write-grants", help="write the deployment grant file")
    s.add_argument("--config", required=True, help="gateway.json")
    s.add_argument("--out", required=True, help="folder for the grant file")

    s = sub.add_parser("generate", help="one completion on the native engine")
    s.add_argument("--model", required=True, help="GGUF file")
    s.add_argument("--prompt", required=True)
    s.add_argument("--max-tokens", type=int, default=128)
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=int, default=0, help="0 = one per core")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("embed", help="sentence embeddings (mean pooled, L2-normalised)")
    s.add_argument("--model", required=True, help="embedding model folder")
    s.add_argument("--text", nargs="+", required=True)
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("models", help="assemble and verify the default models into a cache folder")
    s.add_argument("--cache", help="cache folder (default: $AOTX_CACHE or ~/.cache/aotx-trio)")

    sub.add_parser("devices", help="list the GPUs (JSON; needs the cuda extra) and whether this "
                                   "build has the CUDA kernels")

    from aotx_trio.router.cli_args import add_registry_parser
    add_registry_parser(sub)
    return p


def _resolve(target: str) -> Callable[[argparse.Namespace], int]:
    module, _, func = target.partition(":")
    fn: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), func)
    return fn


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    key = args.command
    if key == "gateway":
        key = f"gateway {args.gateway_command}"
    try:
        fn = _resolve(_ENTRY[key])
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("aotx_trio"):
            print(f"aotx: '{key}' is not available in this build ({exc.name} missing)",
                  file=sys.stderr)
            return 2
        raise
    try:
        return fn(args)
    except AotxError as exc:
        print(f"aotx {key}: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
