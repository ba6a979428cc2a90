"""A throwaway PostgreSQL server for the registry tests.

``postgres_server`` (session scope) runs ``initdb`` into a temp folder and
``pg_ctl start`` on a free loopback port, and stops it at the end of the
session; ``postgres_url`` gives each test its own fresh database on it.  As
root, initdb refuses to run, so the server then runs as the ``postgres`` user
(``runuser -u postgres``, else ``su postgres -c``).  Without the PostgreSQL
binaries on PATH the tests that need it are skipped, unless
``AOTX_REQUIRE_POSTGRES=1`` makes that a failure (CI sets it).
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_USER = "aotx"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    """``argv`` run as an unprivileged user when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return argv
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail("running as root and there is no 'postgres' user to run initdb as")
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *argv]
    return ["su", "postgres", "-c", shlex.join(argv)]


def _run(argv: list[str], timeout: float) -> None:
    proc = subprocess.run(_as_server_user(argv), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The base URL (``postgresql://aotx@127.0.0.1:PORT``) of a fresh server."""
    if not (shutil.which("initdb") and shutil.which("pg_ctl")):
        if os.environ.get("AOTX_REQUIRE_POSTGRES") == "1":
            pytest.fail("initdb/pg_ctl are not on PATH and AOTX_REQUIRE_POSTGRES=1")
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) are not on PATH")
    root = Path(tempfile.mkdtemp(prefix="aotx-pg-"))
    if os.geteuid() == 0:
        os.chown(root, pwd.getpwnam("postgres").pw_uid, -1)
    data, log = root / "data", root / "server.log"
    port = _free_port()
    _run(["initdb", "-D", str(data), "-U", PG_USER, "-A", "trust", "-E", "UTF8",
          "--no-sync", "--no-instructions"], timeout=120)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    _run(["pg_ctl", "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start"],
         timeout=90)
    try:
        yield f"postgresql://{PG_USER}@127.0.0.1:{port}"
    finally:
        _run(["pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop"], timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh, empty database on the session's server."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(f"{postgres_server}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{postgres_server}/{name}"
