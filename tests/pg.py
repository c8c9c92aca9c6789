"""A real PostgreSQL for the test session.

Order: $DATABASE_URL (a server URL; a fresh database is created in it), else the
local server on 127.0.0.1:5432 (user postgres, trust), else a throwaway cluster in a
temporary directory (kmsbench/pgcluster.py: the one way the tree makes a server of its own).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from kmsbench.pgcluster import Cluster

LOCAL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _reachable(url: str) -> bool:
    u = make_url(url)
    try:
        with psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, password=u.password,
                             dbname=u.database or "postgres", connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@contextmanager
def _throwaway_cluster() -> Iterator[str]:
    """A cluster of the tests' own, made as every throwaway one is (kmsbench/pgcluster.py)."""
    tmp = Path(tempfile.mkdtemp(prefix="strongroom-pg-"))
    try:
        with Cluster(tmp) as cluster:
            yield cluster.url()
    finally:
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
