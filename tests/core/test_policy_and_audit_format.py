from __future__ import annotations

from datetime import UTC, datetime

from keyserver.core.audit import canonical_record
from keyserver.core.permissions import ROLE_PERMISSIONS, Permission, Role, permissions_for


def test_auditor_reads_but_never_changes() -> None:
    perms = ROLE_PERMISSIONS[Role.AUDITOR]
    writes = {p for p in Permission if p.value.split(":")[1] not in ("read", "verify", "own")}
    assert perms & writes == set()
    assert Permission.AUDIT_READ in perms and Permission.KEYS_READ in perms


def test_admin_has_everything_and_scopes_narrow() -> None:
    assert ROLE_PERMISSIONS[Role.ADMIN] == frozenset(Permission)
    assert permissions_for("operator", ["keys:read", "keys:destroy"]) == {Permission.KEYS_READ}


def test_canonical_record_is_stable() -> None:
    rec = canonical_record(seq=1, time=datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), actor="a",
                           actor_type="user", action="key.create", object_type="key", object_id="k",
                           outcome="allowed", source_ip=None, request_id="r", details={"b": 1, "a": "é"},
                           prev_hash="0" * 64)
    assert rec == ('{"action":"key.create","actor":"a","actor_type":"user","details":{"a":"é","b":1},'
                   '"object_id":"k","object_type":"key","outcome":"allowed","prev_hash":"' + "0" * 64 +
                   '","request_id":"r","seq":1,"source_ip":null,"time":"2026-01-02T03:04:05.000006Z"}'
                   ).encode()
