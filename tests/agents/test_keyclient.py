"""The agent's identity, key cache and event spool."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from cryptography import x509

from agents.cryptfile import KeyUnavailable, KeyVersion
from agents.keyclient.cache import KeyCache, ServerUnreachable
from agents.keyclient.identity import HostIdentity, IdentityError
from agents.keyclient.spool import EventSpool
from hsm import HsmBackend


def test_identity_is_made_on_the_host_and_kept_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ident = HostIdentity.load_or_create(state)
    assert (state / "host.key").stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700
    assert ident.private_key.key_size == 2048
    again = HostIdentity.load_or_create(state)
    assert again.public_key_der() == ident.public_key_der()
    csr = x509.load_pem_x509_csr(ident.csr("host1.example"))
    assert csr.is_signature_valid
    assert csr.subject.rfc4514_string() == "CN=host1.example"
    os.chmod(state / "host.key", 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        HostIdentity.load_or_create(state)


def test_identity_refuses_a_shared_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)  # noqa: S103 - the unsafe case under test
    with pytest.raises(IdentityError, match="chmod 700"):
        HostIdentity.load_or_create(state)


def test_key_delivery_from_the_hsm_to_the_host(tmp_path: Path, hsm_backend: HsmBackend) -> None:
    """The server re-wraps a managed key inside the HSM under the host's public key;
    only the host can unwrap it, and gets the very key the HSM holds."""
    ident = HostIdentity.load_or_create(tmp_path / "state")
    kek = f"kek-delivery-{uuid.uuid4().hex[:6]}"
    hsm_backend.create_kek(kek)
    stored = hsm_backend.generate_wrapped_key(kek_id=kek)
    delivered = hsm_backend.rewrap_for_public_key(stored, public_key_der=ident.public_key_der())
    key = ident.unwrap(delivered.ciphertext, mechanism=delivered.mechanism)
    assert key == hsm_backend.unwrap_key(stored) and len(key) == 32
    other = HostIdentity.load_or_create(tmp_path / "other")
    with pytest.raises(ValueError):
        other.unwrap(delivered.ciphertext, mechanism=delivered.mechanism)
    with pytest.raises(IdentityError, match="unknown wrapping"):
        ident.unwrap(delivered.ciphertext, mechanism="ROT13")


def test_certificates_must_match_the_host_key(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ident = HostIdentity.load_or_create(tmp_path / "state")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "test ca")])

    def cert(public_key: object) -> bytes:
        now = datetime.now(UTC)
        c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public_key)  # type: ignore[arg-type]
             .serial_number(x509.random_serial_number()).not_valid_before(now)
             .not_valid_after(now + timedelta(days=1)).sign(ca_key, hashes.SHA256()))
        return c.public_bytes(serialization.Encoding.PEM)

    ca_pem = cert(ca_key.public_key())
    with pytest.raises(IdentityError, match="not for this host"):
        ident.save_certificates(ca_pem, ca_pem)
    assert not ident.enrolled
    ident.save_certificates(cert(ident.private_key.public_key()), ca_pem)
    assert ident.enrolled


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cache_serves_through_an_outage_until_the_ttl_then_fails_closed() -> None:
    clock, calls, up = Clock(), [], [True]
    kid = uuid.uuid4()

    def fetch(key_id: uuid.UUID, version: int) -> KeyVersion:
        calls.append((key_id, version))
        if not up[0]:
            raise ServerUnreachable("connection refused")
        return KeyVersion(key_id, version, bytes(32))

    cache = KeyCache(fetch, ttl_seconds=60, max_entries=10, clock=clock)
    assert cache.get(kid, 1).version == 1
    up[0] = False
    clock.now += 59
    assert cache.get(kid, 1).version == 1  # the server is down, the cache still serves
    assert len(calls) == 1
    clock.now += 2
    with pytest.raises(KeyUnavailable, match=r"unreachable.*expired"):
        cache.get(kid, 1)
    assert len(cache) == 0  # an expired key is forgotten, not kept around
    up[0] = True
    assert cache.get(kid, 1).version == 1


def test_cache_is_bounded_and_can_be_dropped() -> None:
    cache = KeyCache(lambda k, v: KeyVersion(k, v, bytes(32)), ttl_seconds=60, max_entries=3)
    kid = uuid.uuid4()
    for v in range(1, 6):
        cache.get(kid, v)
    assert len(cache) == 3
    cache.drop_all()
    assert len(cache) == 0


def test_spool_survives_outage_and_restart(tmp_path: Path) -> None:
    spool = EventSpool(tmp_path / "spool", segment_events=3)
    for i in range(7):
        spool.append({"event": "file.encrypted", "n": i})
    received: list[dict[str, object]] = []

    def down(batch: list[dict[str, object]]) -> None:
        raise ConnectionError("server down")

    with pytest.raises(ConnectionError):
        spool.send(down)
    assert spool.pending() == 7
    restarted = EventSpool(tmp_path / "spool", segment_events=3)  # the agent restarts
    restarted.append({"event": "after-restart"})
    with open(sorted((tmp_path / "spool").glob("*.jsonl"))[-1], "ab") as f:
        f.write(b'{"event": "torn')  # a crash in the middle of an append
    assert restarted.send(received.extend) == 8
    assert [e["n"] for e in received[:7]] == list(range(7))
    assert received[-1]["event"] == "after-restart"
    assert restarted.pending() == 0
