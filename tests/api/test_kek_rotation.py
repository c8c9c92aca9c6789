"""KEK rotation and retirement (issue 16): a rotation re-wraps every kind of wrapped
thing, resumably; `retire` removes a KEK from the token only when nothing names it.
On a store of its own (the session's token): rotations there must not move the
session's KEK under other tests."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.twofactor.totp import TOTP
from sqlalchemy import select

from hsm import HsmBackend, HsmKeyNotFound
from keyserver.core.errors import Conflict, NotFound
from keyserver.core.hosts import HOST_GROUP_TAG
from keyserver.core.identity import TOTP_STEP
from keyserver.core.keys import KeySpec
from keyserver.core.principal import RequestContext, system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent, Host, KmipSealedObject
from tests.api.sessions import session
from tests.api.test_health_and_faults import serve
from tests.conftest import own_store, services_on, unique

PASSWORD = "a long enough passphrase 1"
CTX = system_context("tests")


@pytest.fixture
def store(services: Services, tmp_path: Path) -> Iterator[tuple[str | None, Path]]:
    """A store of the session's kind of its own, and its data directory."""
    with own_store() as url:
        yield url, tmp_path / "data"


def _login(svc: Services, role: str) -> RequestContext:
    name = unique(role.replace("-", ""))
    svc.identity.create_user(CTX, username=name, role=role, password=PASSWORD)
    return RequestContext(svc.identity.login(name, PASSWORD, source_ip=None, request_id=None).principal)


def _enroll(svc: Services, group: str) -> tuple[Host, rsa.RSAPrivateKey, x509.Certificate]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    hostname = f"{unique('host')}.example"
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, hostname)]))
           .sign(key, hashes.SHA256()))
    secret = svc.hosts.create_token(CTX, host_group=group).secret
    enrolled = svc.hosts.enroll(token=secret, csr_pem=csr.public_bytes(serialization.Encoding.PEM).decode(),
                                hostname=hostname)
    cert = x509.load_pem_x509_certificate(enrolled.certificate_pem)
    x509.load_pem_x509_certificate(enrolled.ca_pem).public_key().verify(  # type: ignore[call-arg, union-attr]
        cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))  # type: ignore[call-arg, arg-type]
    return enrolled.host, key, cert


def _delivered(svc: Services, host: Host, host_key: rsa.RSAPrivateKey, key: str) -> bytes:
    wrapped = svc.hosts.deliver_key(CTX, host, key).wrapped
    oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)  # noqa: S303
    return host_key.decrypt(wrapped.ciphertext, oaep)


@dataclass
class World:
    """One of everything a KEK wraps, made under the first KEK, and what it must give back."""

    key: str
    data_keys: list[tuple[bytes, bytes]]
    hmac_key: str
    mac: bytes
    rsa_private: str
    rsa_public: rsa.RSAPublicKey
    ec_private: str
    ec_public: ec.EllipticCurvePublicKey
    secret_id: str
    secret: bytes
    totp_user: str
    totp_secret: bytes
    host: Host
    host_key: rsa.RSAPrivateKey
    delivered: bytes


def _make_world(svc: Services) -> World:
    group = unique("grp")
    key = svc.keys.create(CTX, KeySpec(name=unique("rot"), tags={HOST_GROUP_TAG: group})).name
    first = svc.datakeys.generate(CTX, key)
    svc.keys.rotate(CTX, key)  # two versions
    second = svc.datakeys.generate(CTX, key)
    hmac_key = svc.keys.create(CTX, KeySpec(name=unique("mac"), algorithm="HMAC-SHA512", length_bits=512)).name
    mac = svc.crypto.mac(CTX, svc.kmip_objects.uid_of(hmac_key), b"message")
    now = datetime.now(UTC)
    rsa_pair = svc.kmip_objects.create_key_pair(CTX, bits=2048, private_name=None, public_name=None,
                                                activation_date=now)
    ec_pair = svc.kmip_objects.create_key_pair(CTX, bits=256, private_name=None, public_name=None,
                                               activation_date=now, algorithm="EC")
    secret = b"correct horse battery staple"
    secret_row = svc.kmip_objects.register_object(CTX, object_type="secret-data", material=secret, name=None,
                                                  data_type="password", activation_date=now)
    user = _login(svc, "operator")
    b32, _ = svc.identity.enroll_totp(user)
    totp_secret = base64.b32decode(b32 + "=" * (-len(b32) % 8))
    svc.identity.confirm_totp(user, _code(totp_secret, 0))
    host, host_key, _ = _enroll(svc, group)
    xks = svc.xks.create(CTX, name=unique("xks"), region="eu-west-1")  # its SigV4 secret sealed under the KEK
    svc.xks.rotate_credential(CTX, xks.store.name)  # and the one being rotated out
    rsa_public, ec_public = (serialization.load_der_public_key(p.public.der) for p in (rsa_pair, ec_pair))
    assert isinstance(rsa_public, rsa.RSAPublicKey) and isinstance(ec_public, ec.EllipticCurvePublicKey)
    assert first.plaintext and second.plaintext
    return World(key=key, data_keys=[(first.blob, first.plaintext), (second.blob, second.plaintext)],
                 hmac_key=hmac_key, mac=mac, rsa_private=str(rsa_pair.private.id), rsa_public=rsa_public,
                 ec_private=str(ec_pair.private.id), ec_public=ec_public, secret_id=str(secret_row.id),
                 secret=secret, totp_user=user.principal.name, totp_secret=totp_secret, host=host,
                 host_key=host_key, delivered=_delivered(svc, host, host_key, key))


def _code(secret: bytes, ahead: int) -> str:
    """The code of the time step `ahead` of now (one step either side is accepted)."""
    step = int(time.time() // TOTP_STEP) + ahead
    return TOTP(secret, 6, hashes.SHA1(), TOTP_STEP).generate(step * TOTP_STEP).decode()  # noqa: S303


def _read_back(svc: Services, w: World) -> None:
    for blob, plaintext in w.data_keys:
        assert svc.datakeys.decrypt(CTX, blob).plaintext == plaintext
    assert svc.crypto.mac(CTX, svc.kmip_objects.uid_of(w.hmac_key), b"message") == w.mac
    signature = svc.crypto.sign(CTX, w.rsa_private, b"doc")
    w.rsa_public.verify(signature, b"doc", padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32),
                        hashes.SHA256())
    w.ec_public.verify(svc.crypto.sign(CTX, w.ec_private, b"doc"), b"doc", ec.ECDSA(hashes.SHA256()))
    secret = svc.kmip_objects.resolve_for_export(CTX, w.secret_id)
    assert isinstance(secret, KmipSealedObject)
    assert svc.kmip_objects.export_object(CTX, secret) == w.secret
    assert _delivered(svc, w.host, w.host_key, w.key) == w.delivered


def _sign_in_with_totp(svc: Services, w: World) -> None:
    # One step ahead: the confirmation used the current one, and each code opens one session.
    svc.identity.login(w.totp_user, PASSWORD, source_ip=None, request_id=None, totp_code=_code(w.totp_secret, 1))


def _retire_refused(svc: Services, kek_id: str, code: str) -> Conflict | NotFound:
    with pytest.raises((Conflict, NotFound)) as e:
        svc.keks.retire(CTX, kek_id)
    assert e.value.code == code, e.value.message
    return e.value


def test_rotate_twice_retire_the_first_two_keks_and_read_everything_back(
        store: tuple[str | None, Path], hsm_backend: HsmBackend) -> None:
    url, data_dir = store
    with services_on(url, data_dir, hsm_backend, kek_rewrap_batch=2) as svc, \
            services_on(url, data_dir, hsm_backend) as replica:
        replica.notifier.start()  # another replica: it must hear that the CA's key moved
        replica.ca.ensure()  # holds the CA's sealed key as it is under the first KEK
        first_kek = svc.keks.current()
        w = _make_world(svc)
        _retire_refused(svc, first_kek, "kek_active")
        _retire_refused(svc, "kek-nonexistent", "kek_not_found")

        svc.keks.start_rotation(CTX)
        svc.keks.resume_rotations(max_batches=1)
        # Mid-rotation both KEKs serve reads; the first one is refused with what it still wraps.
        _read_back(svc, w)
        refused = _retire_refused(svc, first_kek, "kek_in_use")
        assert refused.errors is not None
        kinds = {r["kind"]: r for r in refused.errors}
        assert set(kinds) == {"key_versions", "kmip_objects", "ca", "totp_secrets", "xks_credentials",
                              "xks_previous_credentials"}
        assert kinds["ca"] == {"kind": "ca", "count": 1, "first": ["kmip-ca"]}
        assert kinds["totp_secrets"]["first"] == [w.totp_user]
        assert "is re-wrapping them" in refused.message
        svc.keks.resume_rotations()
        second_kek = svc.keks.current()
        status = svc.keks.status(CTX)
        rotation = status["last_rotation"]
        assert rotation.state == "completed" and rotation.done == rotation.total  # type: ignore[attr-defined]
        assert all(p["done"] == p["total"] > 0 for p in rotation.progress.values())  # type: ignore[attr-defined]
        states = {k["kek_id"]: (k["state"], k["wrapped"]) for k in status["keks"]}  # type: ignore[attr-defined]
        assert states[first_kek] == ("superseded", {"key_versions": 0, "kmip_objects": 0, "ca": 0,
                                                    "totp_secrets": 0, "xks_credentials": 0,
                                                    "xks_previous_credentials": 0})
        assert states[second_kek][0] == "active" and states[second_kek][1]["key_versions"] >= 3

        # More under the second KEK, then the second rotation, part-way: a rotation is running.
        w.data_keys.append(((dk := svc.datakeys.generate(CTX, w.key)).blob, dk.plaintext or b""))
        svc.keks.start_rotation(CTX)
        svc.keks.resume_rotations(max_batches=1)
        _retire_refused(svc, first_kek, "rotation_running")
        _retire_refused(svc, second_kek, "kek_in_use")
        svc.keks.resume_rotations()

        svc.keks.retire(_login(svc, "admin"), first_kek)
        svc.keks.retire(CTX, second_kek)
        for gone in (first_kek, second_kek):
            with pytest.raises(HsmKeyNotFound):
                hsm_backend.get_kek(gone)
        _retire_refused(svc, first_kek, "kek_retired")
        keks = {k["kek_id"]: k for k in svc.keks.status(CTX)["keks"]}  # type: ignore[attr-defined]
        assert keks[first_kek]["state"] == "retired" and keks[first_kek]["retired_by"].startswith("admin")
        assert keks[first_kek]["retired_at"] is not None and keks[first_kek]["wrapped"] == {}

        # Everything made before both rotations reads back with both KEKs gone from the token.
        _read_back(svc, w)
        _sign_in_with_totp(svc, w)
        _enroll(svc, unique("after"))  # the CA signs
        svc.kmip_clients.create(CTX, name=unique("kc"), role="auditor")
        # The other replica read the CA's re-wrapped key again: it signs too.
        _wait_for(lambda: replica.ca._stale.is_set())
        _enroll(replica, unique("replica"))

        svc.audit.flush()
        with svc.db() as s:
            outcomes = s.execute(select(AuditEvent.object_id, AuditEvent.outcome, AuditEvent.details)
                                 .where(AuditEvent.action == "kek.retire").order_by(AuditEvent.seq)).all()
        reasons = [(o, (d or {}).get("reason")) for kek, o, d in outcomes if kek == first_kek]
        assert reasons == [("error", "kek_active"), ("error", "kek_in_use"), ("error", "rotation_running"),
                           ("allowed", None), ("error", "kek_retired")]


def _wait_for(condition: Any) -> None:
    """Until another thread (the notifier) has done its part; the bound only stops a hang."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "the replica never heard of the change"
        time.sleep(0.05)


def test_a_rotation_stopped_part_way_resumes_from_what_the_rows_say(
        store: tuple[str | None, Path], hsm_backend: HsmBackend) -> None:
    url, data_dir = store
    with services_on(url, data_dir, hsm_backend, kek_rewrap_batch=1) as svc:
        old = svc.keks.current()
        key = svc.keys.create(CTX, KeySpec(name=unique("resume"))).name
        made = [svc.datakeys.generate(CTX, key)]
        for _ in range(3):
            svc.keys.rotate(CTX, key)
            made.append(svc.datakeys.generate(CTX, key))
        svc.kmip_objects.register_object(CTX, object_type="secret-data", material=b"s3cret", name=None,
                                         data_type="password")
        rotation = svc.keks.start_rotation(CTX)
        assert rotation.progress == {"key_versions": {"done": 0, "total": 4}, "kmip_objects": {"done": 0, "total": 1},
                                     "ca": {"done": 0, "total": 1}, "totp_secrets": {"done": 0, "total": 0},
                                     "xks_credentials": {"done": 0, "total": 0},
                                     "xks_previous_credentials": {"done": 0, "total": 0}}
        # The worker stops after three batches of one, as a killed process would.
        assert svc.keks.resume_rotations(max_batches=3) == 3
        rotation = svc.keks.get_rotation(CTX, rotation.id)
        assert (rotation.state, rotation.done, rotation.total) == ("running", 3, 6)
        assert rotation.progress["key_versions"] == {"done": 3, "total": 4}
        for dk in made:  # both KEKs serve reads meanwhile
            assert svc.datakeys.decrypt(CTX, dk.blob).plaintext == dk.plaintext
        refused = _retire_refused(svc, old, "kek_in_use")
        assert [(r["kind"], r["count"]) for r in refused.errors or []] == [
            ("key_versions", 1), ("kmip_objects", 1), ("ca", 1)]
    # Another process on the same store (a restart, another replica) finishes it.
    with services_on(url, data_dir, hsm_backend, kek_rewrap_batch=1) as restarted:
        assert restarted.keks.resume_rotations() == 3
        rotation = restarted.keks.get_rotation(CTX, rotation.id)
        assert (rotation.state, rotation.done, rotation.total) == ("completed", 6, 6)
        assert all(p["done"] == p["total"] for p in rotation.progress.values())
        restarted.keks.retire(CTX, old)
        for dk in made:
            assert restarted.datakeys.decrypt(CTX, dk.blob).plaintext == dk.plaintext


def test_retire_over_rest_with_the_list_and_held_by_the_two_person_rule(
        store: tuple[str | None, Path], hsm_backend: HsmBackend) -> None:
    url, data_dir = store
    with services_on(url, data_dir, hsm_backend, kek_rewrap_batch=1, approvals={"kek.retire": 1}) as svc:
        alice, bob = _login(svc, "admin"), _login(svc, "admin")
        tokens = {c.principal.name: svc.identity.create_token(c, name="t", scopes=None, expires_in_days=1).secret
                  for c in (alice, bob)}
        for _ in range(2):
            svc.keys.create(CTX, KeySpec(name=unique("rest")))
        old = svc.keks.current()
        with serve(svc) as base:
            def as_(c: RequestContext) -> httpx.Client:
                return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {tokens[c.principal.name]}"})

            with as_(alice) as a, as_(bob) as b:
                r = a.post(f"/api/v1/system/keks/{old}/retire")
                assert r.status_code == 409 and r.json()["code"] == "kek_active", r.text
                svc.keks.start_rotation(CTX)
                svc.keks.resume_rotations(max_batches=1)
                status = a.get("/api/v1/system/kek").json()
                assert status["last_rotation"]["state"] == "running"
                assert status["last_rotation"]["progress"]["key_versions"]["done"] == 1
                r = a.post(f"/api/v1/system/keks/{old}/retire")
                assert r.status_code == 409 and r.json()["code"] == "kek_in_use", r.text
                assert {e["kind"] for e in r.json()["errors"]} == {"key_versions", "ca"}
                svc.keks.resume_rotations()
                # Nothing names it now: alice asks, bob approves, it runs as alice.
                r = a.post(f"/api/v1/system/keks/{old}/retire")
                assert r.status_code == 202 and r.json()["code"] == "approval_required", r.text
                hsm_backend.get_kek(old)  # still there
                # Approvals come from a person signed in, not from bob's token.
                with session(base, bob.principal.name, PASSWORD) as person:
                    r = person.post(f"/api/v1/approvals/{r.json()['approval']['id']}/approve")
                assert r.status_code == 200 and r.json()["executed"] is True, r.text
                keks = {k["kek_id"]: k for k in a.get("/api/v1/system/kek").json()["keks"]}
                assert keks[old]["state"] == "retired" and keks[old]["retired_by"] == alice.principal.name
                with pytest.raises(HsmKeyNotFound):
                    hsm_backend.get_kek(old)
                r = b.get(f"/api/v1/system/keks/{old}/retire")
                assert r.status_code == 405
