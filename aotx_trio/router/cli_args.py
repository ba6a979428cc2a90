"""The arguments of ``aotx registry`` (argparse only: ``aotx --help`` imports this, so
it must stay light).  The commands run in ``aotx_trio.router.cli``."""

from __future__ import annotations

import argparse
from typing import Any

MODEL_TYPES = ("textgen", "embedding")


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--data", help="data folder of `aotx serve` (folder store at "
                       "DIR/registry; default ./aotx-data)")
    where.add_argument("--store", metavar="URL", help="postgresql://... registry store")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _descriptor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source-commit", help="the aotx build's 40-hex commit (default: "
                   "$AOTX_SOURCE_COMMIT, else the package's git HEAD)")
    p.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=0, help="0 = one per core")
    p.add_argument("--kv-page-tokens", type=int, default=8)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--kv-type", choices=("f16", "f32"), default=None,
                   help="element type of the KV pages (default: unset, the runtime's "
                   "default, f16; setting it changes the descriptor_sha256)")


def add_registry_parser(sub: Any) -> None:
    """Add ``registry`` and its subcommands to the top-level subparsers ``sub``."""
    c = _common()
    r = sub.add_parser("registry", help="publish models, mint releases, move aliases, "
                       "scratch sessions on the registry store")
    rs = r.add_subparsers(dest="registry_command", required=True, metavar="SUBCOMMAND")

    s = rs.add_parser("publish", parents=[c], help="artifact + spec file -> published model")
    s.add_argument("model_id")
    s.add_argument("--artifact", required=True, help="GGUF file or embedding model folder")
    s.add_argument("--spec", required=True, help="JSON file: the serving spec (spec DSL v2)")
    s.add_argument("--type", required=True, choices=MODEL_TYPES, dest="model_type")
    s.add_argument("--release", required=True,
                   help="release to bind (minted from the artifact if absent)")
    s.add_argument("--manifest", help="JSON file with further manifest fields to keep")
    s.add_argument("--engine-set", metavar="NAME:SHA256",
                   help="the release's engine set (as for release mint)")
    _descriptor(s)

    s = rs.add_parser("unpublish", parents=[c], help="write the unpublication marker")
    s.add_argument("model_id")
    s.add_argument("--reason")

    s = rs.add_parser("state", parents=[c], help="set a model's lifecycle state")
    s.add_argument("model_id")
    s.add_argument("state", choices=("active", "deprecated", "disabled"))
    s.add_argument("--successor", help="successor model id")

    s = rs.add_parser("show", parents=[c], help="a model (by id or alias)")
    s.add_argument("target")

    s = rs.add_parser("list", parents=[c], help="published models")
    s.add_argument("--type", choices=MODEL_TYPES, dest="model_type")
    s.add_argument("--state", default="active",
                   choices=("active", "deprecated", "disabled", "all"))

    rel = rs.add_parser("release", help="mint, deploy, disable, show releases")
    rels = rel.add_subparsers(dest="release_command", required=True, metavar="ACTION")
    s = rels.add_parser("mint", parents=[c], help="mint an immutable release")
    s.add_argument("name")
    s.add_argument("--artifact", required=True)
    s.add_argument("--engine-set", metavar="NAME:SHA256",
                   help="the engine set the release needs (a host without it: not_ready)")
    _descriptor(s)
    s = rels.add_parser("deploy", parents=[c], help="record that a runtime loaded it")
    s.add_argument("name")
    s.add_argument("--runtime", required=True, help="runtime id")
    s = rels.add_parser("disable", parents=[c], help="withdraw a release")
    s.add_argument("name")
    s.add_argument("--successor")
    s = rels.add_parser("show", parents=[c])
    s.add_argument("name")

    al = rs.add_parser("alias", help="set or show aliases")
    als = al.add_subparsers(dest="alias_command", required=True, metavar="ACTION")
    s = als.add_parser("set", parents=[c], help="move an alias (its chain is verified)")
    s.add_argument("name")
    s.add_argument("target")
    s.add_argument("--level", type=int, required=True)
    s.add_argument("--no-verify", action="store_true", help="store without verifying")
    s = als.add_parser("show", parents=[c], help="the complete verified chain")
    s.add_argument("name")

    sc = rs.add_parser("scratch", help="scratch sessions")
    scs = sc.add_subparsers(dest="scratch_command", required=True, metavar="ACTION")
    s = scs.add_parser("open", parents=[c])
    s.add_argument("--lease-s", type=int, default=900, help="whole seconds")
    s.add_argument("--based-on", help="JSON object (descriptive)")
    s = scs.add_parser("revise", parents=[c], help="add a verified revision")
    s.add_argument("session_id")
    s.add_argument("--artifact", required=True)
    s.add_argument("--spec", required=True)
    s.add_argument("--type", required=True, choices=MODEL_TYPES, dest="model_type")
    s.add_argument("--manifest", help="JSON file: the draft manifest's further fields")
    s.add_argument("--source-commit", help="the draft's runtime_release commit (default as "
                   "for publish)")
    s = scs.add_parser("stop", parents=[c])
    s.add_argument("session_id")
    s = scs.add_parser("promote", parents=[c], help="mint a release, publish a model")
    s.add_argument("session_id")
    s.add_argument("model_id")
    s.add_argument("--release", required=True)
    _descriptor(s)
    s = scs.add_parser("show", parents=[c])
    s.add_argument("session_id")
    s = scs.add_parser("list", parents=[c])
    s.add_argument("--all", action="store_true", help="include closed sessions")

    s = rs.add_parser("events", parents=[c], help="read the event feed")
    s.add_argument("--after", type=int, default=0)
    s.add_argument("--limit", type=int, default=100)
    rs.add_parser("heal", parents=[c], help="run the feed rescan once")
