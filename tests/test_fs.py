"""aotx_trio._fs and the files read with credentials or grants: temp files never follow a
planted link, and gateway.json / grants.json that group or others may write are refused
naming the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _gateway_env import ALL, make_config

from aotx_trio._fs import atomic_write_text, refuse_writable_by_others
from aotx_trio.config import load_gateway_config
from aotx_trio.errors import ConfigError
from aotx_trio.grants import load_grants
from aotx_trio.runtime.journal_file import JOURNAL_NAME, open_journal_file

LINEAGE = bytes(range(16))


def test_atomic_write_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "out.json"
    (tmp_path / f".out.json.tmp-{os.getpid()}").symlink_to(victim)
    atomic_write_text(target, "new")
    assert victim.read_text() == "keep"
    assert target.read_text() == "new" and not target.is_symlink()


def test_the_journal_temp_file_never_follows_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / (JOURNAL_NAME + ".tmp")).symlink_to(victim)
    jf = open_journal_file(tmp_path, LINEAGE)
    jf.close()
    assert victim.read_bytes() == b"keep"
    assert (tmp_path / JOURNAL_NAME).is_file() and not (tmp_path / JOURNAL_NAME).is_symlink()


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_writable_config_and_grant_files_are_refused(tmp_path: Path, mode: int) -> None:
    path, _ = make_config(tmp_path, {"alice": ALL})
    load_gateway_config(path)
    load_grants(tmp_path / "grants")
    for file, load in ((path, lambda: load_gateway_config(path)),
                       (tmp_path / "grants" / "grants.json",
                        lambda: load_grants(tmp_path / "grants"))):
        os.chmod(file, mode)
        with pytest.raises(ConfigError) as info:
            load()
        assert info.value.code == "file_permissions"
        assert str(file) in info.value.message and "chmod go-w" in info.value.message
        os.chmod(file, 0o600)
        load()


def test_a_missing_file_is_left_to_the_caller(tmp_path: Path) -> None:
    refuse_writable_by_others(tmp_path / "absent")
    with pytest.raises(ConfigError) as info:
        load_gateway_config(tmp_path / "absent")
    assert "no such file" in info.value.message
