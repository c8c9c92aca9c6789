"""Alembic is the only way the schema is made: up, down, up again on both databases,
and the models agree with the migrations."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from keyserver.store import db
from keyserver.store.models import Base
from tests.pg import scratch_database

TABLES = {"managed_keys", "key_versions", "users", "browser_sessions", "api_tokens", "audit_inbox",
          "audit_events", "audit_head", "keks", "kek_rotations"}


def check_roundtrip(url: str) -> None:
    db.upgrade(url)
    engine = create_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
        db.downgrade(url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        db.upgrade(url)
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()


def test_postgresql_up_down_up() -> None:
    with scratch_database() as url:
        check_roundtrip(url)


def test_sqlite_up_down_up(tmp_path: Path) -> None:
    check_roundtrip(f"sqlite:///{tmp_path / 'm.db'}")
