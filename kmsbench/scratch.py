"""Scratch PostgreSQL databases for the benchmarks that start a key server of their own."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from sqlalchemy.engine import URL, make_url


def _admin(url: URL) -> psycopg.Connection[Any]:
    return psycopg.connect(host=url.host, port=url.port or 5432, user=url.username, password=url.password,
                           dbname=url.database or "postgres", autocommit=True, connect_timeout=5)


def create_database(postgres: str, prefix: str) -> str:
    """A new, empty database on the server `postgres` names; its SQLAlchemy URL."""
    server = make_url(postgres)
    name = f"strongroom_{prefix}_{uuid.uuid4().hex[:8]}"
    with _admin(server) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.set(database=name).render_as_string(hide_password=False)


def drop_database(postgres: str, database_url: str) -> None:
    """Drop what `create_database` made (its connections cut)."""
    with _admin(make_url(postgres)) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{make_url(database_url).database}" WITH (FORCE)')
