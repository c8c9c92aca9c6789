"""Migration 0028 (decision 0024) backfills the per-version data-key counts from the
audit chain already written, on both stores: data keys issued per version, re-encryptions
off it (before `from_iv` was recorded, each counts as one blob), and nothing from hosts
(their data keys are volumes' passphrases) or from refused calls."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine, text

from keyserver.store import db
from tests.pg import scratch_database


def check_backfill(url: str) -> None:
    db.upgrade(url, "0027")
    engine = create_engine(url)
    key, other = uuid.uuid4(), uuid.uuid4()
    records = [
        ("user", key, "datakey.generate", "allowed", {"version": 1}),
        ("user", key, "datakey.generate", "allowed", {"version": 1}),
        ("user", key, "datakey.generate_without_plaintext", "allowed", {"version": 1}),
        ("user", key, "datakey.generate", "allowed", {"version": 2}),
        ("user", key, "datakey.reencrypt", "allowed", {"from_version": 1, "to_version": 2}),
        ("user", key, "datakey.generate", "denied", {"version": 1}),
        ("host:db.example.com", key, "datakey.generate", "allowed", {"version": 1}),
        ("user", other, "datakey.generate", "allowed", {"version": 3}),
        ("user", other, "datakey.decrypt", "allowed", {"version": 3}),
    ]
    try:
        with engine.begin() as conn:
            for seq, (actor, k, action, outcome, details) in enumerate(records, 1):
                conn.execute(text(
                    "INSERT INTO audit_events (seq, time, actor, actor_type, action, object_type, object_id, outcome, "
                    "details, prev_hash, hash) VALUES (:seq, :time, :actor, 'user', :action, 'key', :key, :outcome, "
                    ":details, 'p', 'h')"), {"seq": seq, "time": datetime.now(UTC), "actor": actor, "action": action,
                                             "key": str(k), "outcome": outcome, "details": json.dumps(details)})
        db.upgrade(url)
        with engine.connect() as conn:
            rows = {(uuid.UUID(str(r[0])), r[1]): (r[2], r[3]) for r in conn.execute(text(
                "SELECT key_id, version, issued, legacy_reencrypted FROM key_version_datakeys"))}
        assert rows == {(key, 1): (3, 1), (key, 2): (1, 0), (other, 3): (1, 0)}
    finally:
        engine.dispose()


def test_backfill_on_postgresql() -> None:
    with scratch_database() as url:
        check_backfill(url)


def test_backfill_on_sqlite(tmp_path: Path) -> None:
    check_backfill(f"sqlite:///{tmp_path / 'm.db'}")
