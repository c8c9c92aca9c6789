"""A real PostgreSQL for the test session.

Order: $DATABASE_URL (a server URL; a fresh database is created in it), else the
local server on 127.0.0.1:5432 (user postgres, trust), else a throwaway cluster made
with initdb in a temporary directory (run as the postgres user when we are root).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

LOCAL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _reachable(url: str) -> bool:
    u = make_url(url)
    try:
        with psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, password=u.password,
                             dbname=u.database or "postgres", connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _throwaway_cluster() -> Iterator[str]:
    bindir = next((p for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries: apt-get install postgresql")
    tmp = Path(tempfile.mkdtemp(prefix="strongroom-pg-"))
    data, port = tmp / "data", _free_port()
    as_postgres = ["su", "postgres", "-c"] if os.geteuid() == 0 else None
    if as_postgres:
        shutil.chown(tmp, "postgres")

    def run(cmd: str) -> None:
        subprocess.run([*as_postgres, cmd] if as_postgres else ["sh", "-c", cmd], check=True,
                       stdout=subprocess.DEVNULL)

    run(f"{bindir}/initdb -A trust -U postgres -D {data}")
    run(f"{bindir}/pg_ctl -D {data} -o '-p {port} -k {tmp} -c listen_addresses=127.0.0.1' -w start -l {tmp}/log")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(f"{bindir}/pg_ctl -D {data} -m immediate stop")
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def scratch_database() -> Iterator[str]:
    """Yield the URL of a new, empty database; drop it afterwards."""
    server = os.environ.get("DATABASE_URL")
    if server and server.startswith("postgresql://"):
        server = server.replace("postgresql://", "postgresql+psycopg://", 1)
    with _server(server) as admin_url:
        u = make_url(admin_url)
        name = f"strongroom_test_{uuid.uuid4().hex[:10]}"
        params = {"host": u.host, "port": u.port or 5432, "user": u.username, "password": u.password,
                  "dbname": u.database or "postgres", "autocommit": True}
        with psycopg.connect(**params) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield u.set(database=name).render_as_string(hide_password=False)
        finally:
            for _ in range(3):
                try:
                    with psycopg.connect(**params) as conn:
                        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    break
                except psycopg.Error:
                    time.sleep(1)


@contextmanager
def _server(server: str | None) -> Iterator[str]:
    if server:
        yield server
    elif _reachable(LOCAL):
        yield LOCAL
    else:
        with _throwaway_cluster() as url:
            yield url
