"""The host's record of revocations it has seen (agents/keyclient/revocation.py), on a
real file system: what each record deletes, what makes it stale, and that a damaged one
still refuses (fail closed). The end-to-end behaviour is in test_revocation_sticky.py."""

from __future__ import annotations

import json
import stat
import uuid
from pathlib import Path

from agents.keyclient.revocation import RevocationLedger, host_revocation


def _kept(state: Path, *ids: str) -> None:
    grace = state / "volume-grace"
    grace.mkdir(mode=0o700, parents=True, exist_ok=True)
    for vid in ids:
        (grace / f"{vid}.json").write_text("{}")
    (grace / "volumes.json").write_text("[]")
    (grace / ".srtmp-0123-half-written.json").write_text("{")


def test_a_volume_record_drops_only_that_volume_and_survives_as_written(tmp_path: Path) -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    _kept(tmp_path, a, b)
    ledger = RevocationLedger(tmp_path)
    ledger.mark_volume(a, name="pg", code="volume_revoked", detail="volume 'pg' is revoked")
    assert not (tmp_path / "volume-grace" / f"{a}.json").exists()
    assert (tmp_path / "volume-grace" / f"{b}.json").exists()
    record = tmp_path / "revoked" / "volumes" / f"{a}.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.parent.parent.stat().st_mode) == 0o700
    seen = ledger.refusal(a)
    assert seen is not None and seen.code == "volume_revoked" and seen.name == "pg"
    assert ledger.refusal(b) is None
    ledger.clear_volume(a)
    assert ledger.refusal(a) is None


def test_a_host_record_drops_every_kept_passphrase_until_enrolled_again(tmp_path: Path) -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    _kept(tmp_path, a, b)
    (tmp_path / "host.crt").write_bytes(b"certificate one")
    ledger = RevocationLedger(tmp_path)
    ledger.mark_host(code="host_revoked", detail="host revoked")
    assert sorted(p.name for p in (tmp_path / "volume-grace").iterdir()) == ["volumes.json"]
    refused = host_revocation(tmp_path)
    assert refused and "host_revoked" in refused and "kms-agent enroll" in refused
    assert ledger.refusal(a) is not None  # every volume
    # A new certificate (enrolled again): the record was about the old one.
    (tmp_path / "host.crt").write_bytes(b"certificate two")
    assert host_revocation(tmp_path) is None and ledger.refusal(a) is None


def test_a_damaged_record_still_refuses(tmp_path: Path) -> None:
    vid = str(uuid.uuid4())
    ledger = RevocationLedger(tmp_path)
    ledger.mark_volume(vid, name="pg", code="volume_revoked", detail="")
    (tmp_path / "revoked" / "volumes" / f"{vid}.json").write_text('{"subject": "edited')
    seen = ledger.refusal(vid)
    assert seen is not None and seen.code == "record_damaged"
    (tmp_path / "host.crt").write_bytes(b"certificate")
    ledger.mark_host(code="host_revoked", detail="")
    host = tmp_path / "revoked" / "host.json"
    host.write_text(json.dumps({"certificate": "edited"}))  # not a record any more
    assert host_revocation(tmp_path) is not None
