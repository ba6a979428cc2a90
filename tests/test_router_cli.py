"""``aotx registry`` through the real command line, on both store backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SPEC = {"spec_dsl": 2, "interaction": "request_response", "params": [], "results": {}}
MID = "runs/demo/r1/checkpoints/step-000200000.inference-gemma-r1.json"


def aotx(*argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AOTX_SOURCE_COMMIT": COMMIT}
    proc = subprocess.run([sys.executable, "-m", "aotx_trio", "registry", *argv],
                          capture_output=True, text=True, timeout=120, env=env)
    if ok:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(params=["folder", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "folder":
        return ["--data", str(tmp_path / "data")]
    return ["--store", request.getfixturevalue("postgres_url")]


def run_json(*argv: str, where: list[str]) -> Any:
    return json.loads(aotx(*argv, *where, "--json").stdout)


def test_registry_commands_end_to_end(tmp_path: Path, where: list[str]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\1" * 5000)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))

    got = run_json("publish", MID, "--artifact", str(model), "--spec", str(spec),
                   "--type", "textgen", "--release", "gemma-r1", "--threads", "2", where=where)
    assert got["model_id"] == MID and got["state"] == "active"
    assert got["manifest"]["serving"]["runtime_release"] == {"name": "gemma-r1",
                                                             "source_commit": COMMIT}
    assert got["manifest"]["artifact"]["size"] == 5004

    assert run_json("alias", "set", "default/text", MID, "--level", "0",
                    where=where)["target"] == MID
    assert run_json("alias", "show", "default/text", where=where)["chain"] == [
        {"name": "default/text", "level": 0, "target": MID}]
    shown = run_json("show", "default/text", where=where)
    assert shown["model_id"] == MID and len(shown["resolution_chain"]) == 1

    assert run_json("state", MID, "deprecated", "--successor", "runs/next.json",
                    where=where)["state"] == "deprecated"
    assert run_json("list", where=where)["models"] == []
    assert len(run_json("list", "--state", "all", where=where)["models"]) == 1

    assert run_json("release", "deploy", "gemma-r1", "--runtime", "host-a",
                    where=where)["runtime"] == "host-a"
    rel = run_json("release", "disable", "gemma-r1", where=where)
    assert rel["state"] == "disabled" and rel["descriptor"]["threads"] == 2
    refused = aotx("release", "deploy", "gemma-r1", "--runtime", "host-b", *where, ok=False)
    assert refused.returncode == 1 and "release_disabled" in refused.stderr

    aotx("unpublish", MID, "--reason", "test", *where)
    gone = aotx("show", MID, *where, ok=False)
    assert gone.returncode == 1 and "model_removed" in gone.stderr
    unresolved = aotx("alias", "show", "default/text", *where, ok=False)
    assert "alias_unresolved" in unresolved.stderr

    types = [e["type"] for e in run_json("events", where=where)["events"]]
    assert types == ["release.minted", "model.published", "alias.moved",
                     "model.state_changed", "release.deployed", "release.state_changed",
                     "model.unpublished"]
    assert run_json("heal", where=where)["healed"] == []


def test_scratch_commands(tmp_path: Path, where: list[str]) -> None:
    model = tmp_path / "s.gguf"
    model.write_bytes(b"GGUF" + b"\2" * 100)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    session = run_json("scratch", "open", "--lease-s", "600", where=where)
    sid = session["session_id"]
    assert session["state"] == "open"
    assert session["lease_s"] == 600 and type(session["lease_s"]) is int
    assert type(run_json("scratch", "show", sid, where=where)["lease_s"]) is int
    refused = aotx("scratch", "open", "--lease-s", "1.5", *where, ok=False)
    assert refused.returncode == 2 and "invalid int value" in refused.stderr
    rev = run_json("scratch", "revise", sid, "--artifact", str(model), "--spec", str(spec),
                   "--type", "textgen", where=where)
    assert rev["generation"] == 1 and rev["artifact"]["kind"] == "gguf"
    assert [s["session_id"] for s in run_json("scratch", "list", where=where)["sessions"]] \
        == [sid]
    promoted = run_json("scratch", "promote", sid, "runs/promoted.json", "--release",
                        "promo-r1", where=where)
    assert promoted["model_id"] == "runs/promoted.json"
    closed = run_json("scratch", "show", sid, where=where)
    assert (closed["reason"], closed["promoted_to"]) == ("promoted", "runs/promoted.json")
    refused = aotx("scratch", "stop", sid, *where, ok=False)
    assert refused.returncode == 1 and "scratch_closed" in refused.stderr
    other = run_json("scratch", "open", where=where)["session_id"]
    assert run_json("scratch", "stop", other, where=where)["reason"] == "stopped"
    assert run_json("scratch", "list", where=where)["sessions"] == []
    assert len(run_json("scratch", "list", "--all", where=where)["sessions"]) == 2


def test_bad_input_is_a_named_error(tmp_path: Path) -> None:
    data = ["--data", str(tmp_path / "data")]
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF1234")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"spec_dsl": 1}))
    proc = aotx("publish", MID, "--artifact", str(model), "--spec", str(spec), "--type",
                "textgen", "--release", "r1", *data, ok=False)
    assert proc.returncode == 1 and "invalid_params" in proc.stderr
    not_gguf = tmp_path / "x.bin"
    not_gguf.write_bytes(b"nope")
    proc = aotx("release", "mint", "r2", "--artifact", str(not_gguf), *data, ok=False)
    assert proc.returncode == 1 and "not a GGUF file" in proc.stderr
    proc = aotx("show", "nothing/here", *data, ok=False)
    assert proc.returncode == 1 and "model_not_found" in proc.stderr
    proc = aotx("show", "x", "--data", "d", "--store", "postgresql://x", ok=False)
    assert proc.returncode == 2 and "not allowed with" in proc.stderr


def test_kv_type_is_a_descriptor_field(tmp_path: Path) -> None:
    data = ["--data", str(tmp_path / "data")]
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\2" * 100)
    plain = run_json("release", "mint", "r-plain", "--artifact", str(model), where=data)
    assert "kv_type" not in plain["descriptor"]
    # the digest of the default descriptor, as before kv_type existed
    assert plain["descriptor_sha256"] == \
        "9792627ce99c3288462979be0f0e45697686c3bdb7116ca3e4f179683c066573"
    f32 = run_json("release", "mint", "r-f32", "--artifact", str(model), "--kv-type", "f32",
                   where=data)
    assert f32["descriptor"] == {"backend": "cpu", "context": 2048, "kv_page_tokens": 8,
                                 "kv_type": "f32", "threads": 0}
    f16 = run_json("release", "mint", "r-f16", "--artifact", str(model), "--kv-type", "f16",
                   where=data)
    assert len({plain["descriptor_sha256"], f32["descriptor_sha256"],
                f16["descriptor_sha256"]}) == 3
    proc = aotx("release", "mint", "r-bad", "--artifact", str(model), "--kv-type", "bf16",
                *data, ok=False)
    assert proc.returncode == 2 and "invalid choice: 'bf16'" in proc.stderr
    proc = aotx("release", "mint", "r-bad", "--artifact", str(model), "--threads", "-1",
                *data, ok=False)
    assert proc.returncode == 1 and "descriptor.threads" in proc.stderr


def test_publish_targets_an_engine_set_release(tmp_path: Path) -> None:
    """``publish --engine-set`` mints (or reuses) a release with that engine set; a
    publish naming an engine-set release without it is refused (another release)."""
    data = ["--data", str(tmp_path / "data")]
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\3" * 100)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    h100 = "H100:" + "ab" * 32
    rel = run_json("release", "mint", "r-h100", "--artifact", str(model), "--engine-set",
                   h100, where=data)
    assert rel["engine_set"] == {"name": "H100", "sha256": "ab" * 32}
    got = run_json("publish", "m/h100", "--artifact", str(model), "--spec", str(spec),
                   "--type", "textgen", "--release", "r-h100", "--engine-set", h100,
                   where=data)
    assert got["manifest"]["serving"]["runtime_release"]["name"] == "r-h100"
    fresh = run_json("publish", "m/h200", "--artifact", str(model), "--spec", str(spec),
                     "--type", "textgen", "--release", "r-h200", "--engine-set",
                     "H200:" + "cd" * 32, where=data)
    assert fresh["model_id"] == "m/h200"
    assert run_json("release", "show", "r-h200", where=data)["engine_set"] == {
        "name": "H200", "sha256": "cd" * 32}
    proc = aotx("publish", "m/plain", "--artifact", str(model), "--spec", str(spec),
                "--type", "textgen", "--release", "r-h100", *data, ok=False)
    assert proc.returncode == 1 and "r-h100" in proc.stderr
    proc = aotx("publish", "m/bad", "--artifact", str(model), "--spec", str(spec),
                "--type", "textgen", "--release", "r-x", "--engine-set", "H100", *data,
                ok=False)
    assert proc.returncode == 1 and "NAME:SHA256" in proc.stderr


def test_help_lists_the_subcommands() -> None:
    proc = aotx("--help")
    for name in ("publish", "unpublish", "state", "release", "alias", "scratch"):
        assert name in proc.stdout
