"""MongoDB client-side field-level encryption with its master key in Strongroom.

The real libmongocrypt (the library bundled in pymongocrypt's wheel) at its defaults,
driven through pymongocrypt's explicit-encryption API: the bytes libmongocrypt writes
for the "kmip" KMS provider go, as they are, over a real mutual-TLS socket (built from
`kms_tls_options` by pymongo's own parser, as the driver builds it) to the real KMIP
listener, and the replies go back until libmongocrypt needs no more. No MongoDB server:
the key vault is a list of BSON documents, filtered the way the driver's `find` would.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.codec_options import CodecOptions
from kmip.core import enums
from kmip.core.factories.attributes import AttributeFactory
from kmip.core.messages import messages
from kmip.core.utils import BytearrayStream
from kmip.pie import objects as pie
from pymongo.uri_parser_shared import _parse_kms_tls_options
from pymongocrypt.errors import MongoCryptError
from pymongocrypt.mongocrypt import MongoCryptOptions
from pymongocrypt.synchronous.explicit_encrypter import ExplicitEncrypter
from pymongocrypt.synchronous.state_machine import MongoCryptCallback
from sqlalchemy import select

from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.kmip.listener import KmipListener
from keyserver.kmip.server import build_listener
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.kmip.conftest import ClientFiles, issue_client, make_client

OPTS: CodecOptions[Any] = CodecOptions(uuid_representation=4)  # STANDARD: data key ids are UUIDs
DETERMINISTIC = "AEAD_AES_256_CBC_HMAC_SHA_512-Deterministic"
RANDOM = "AEAD_AES_256_CBC_HMAC_SHA_512-Random"
_attrs = AttributeFactory()


def _matches(doc: dict[str, Any], flt: dict[str, Any]) -> bool:
    """The filters libmongocrypt gives the key vault: {} (rewrap everything), or
    {"$or": [{"_id": {"$in": [...]}}, {"keyAltNames": {"$in": [...]}}]}."""
    if not flt:
        return True
    if "$or" in flt:
        return any(_matches(doc, f) for f in flt["$or"])
    for field, cond in flt.items():
        wanted = cond["$in"] if isinstance(cond, dict) else [cond]
        have = doc.get(field)
        values = have if isinstance(have, list) else [have]
        if not any(v in wanted for v in values):
            return False
    return True


class KeyVault(MongoCryptCallback):  # type: ignore[misc]
    """What pymongo's driver does for libmongocrypt, minus MongoDB: KMS traffic over
    TLS, the key vault in memory. Records each KMIP request's version and operations."""

    def __init__(self, tls: ssl.SSLContext, keys: list[dict[str, Any]]) -> None:
        self.tls, self.keys = tls, keys
        self.sent: list[tuple[str, list[str]]] = []
        self.payloads: list[Any] = []  # each request's decoded payloads, in order

    def kms_request(self, kms_context: Any) -> None:
        """As pymongo's driver does it: wait the back-off libmongocrypt asks for, one
        request per connection, read until libmongocrypt needs no more bytes; on a
        network error tell libmongocrypt (`fail`), which retries or gives up."""
        host, port = kms_context.endpoint.rsplit(":", 1)
        message = bytes(kms_context.message)
        request = messages.RequestMessage()
        request.read(BytearrayStream(message))
        version = request.request_header.protocol_version
        self.sent.append((f"{version.major}.{version.minor}",
                          [item.operation.value.name for item in request.batch_items]))
        self.payloads += [item.request_payload for item in request.batch_items]
        if kms_context.usleep:
            time.sleep(kms_context.usleep / 1e6)
        try:
            with socket.create_connection((host, int(port)), timeout=30) as raw, \
                    self.tls.wrap_socket(raw, server_hostname=host) as conn:
                conn.sendall(message)
                while kms_context.bytes_needed > 0:
                    data = conn.recv(kms_context.bytes_needed)
                    if not data:
                        raise OSError("KMS connection closed")
                    kms_context.feed(data)
        except OSError as exc:
            try:
                kms_context.fail()
            except MongoCryptError as final:
                raise MongoCryptError(f"{final}, last attempt failed with: {exc}", final.code) from final

    def collection_info(self, database: str, filter: bytes) -> bytes:
        raise AssertionError("explicit encryption never lists collections")

    def mark_command(self, database: str, cmd: bytes) -> bytes:
        raise AssertionError("explicit encryption never asks mongocryptd")

    def fetch_keys(self, filter: bytes) -> Iterator[bytes]:
        flt = bson.decode(filter, OPTS)
        for doc in self.keys:
            if _matches(doc, flt):
                yield bson.encode(doc, codec_options=OPTS)

    def insert_data_key(self, data_key: bytes) -> uuid.UUID:
        doc = bson.decode(data_key, OPTS)
        self.keys.append(doc)
        return uuid.UUID(str(doc["_id"]))

    def bson_encode(self, doc: Any) -> bytes:
        return bson.encode(doc, codec_options=OPTS)

    def close(self) -> None:
        pass


class Mongo:
    """An application's client-side encryption: kms_providers + kms_tls_options, as an
    operator writes them for pymongo (docs/integrations.md, MongoDB)."""

    def __init__(self, files: ClientFiles, port: int, keys: list[dict[str, Any]], **options: Any) -> None:
        pem = files.cert.parent / "cert-and-key.pem"  # pymongo's tlsCertificateKeyFile: both in one file
        if not pem.exists():
            pem.write_text(files.cert.read_text() + files.key.read_text())
        self.kms_providers = {"kmip": {"endpoint": f"localhost:{port}"}}
        self.kms_tls_options = {"kmip": {"tlsCAFile": str(files.ca), "tlsCertificateKeyFile": str(pem)}}
        tls = _parse_kms_tls_options(self.kms_tls_options, True)["kmip"]
        self.vault = KeyVault(tls, keys)
        self.encrypter = ExplicitEncrypter(self.vault, MongoCryptOptions(self.kms_providers, **options))

    def encrypt(self, value: Any, algorithm: str, key_id: uuid.UUID) -> Binary:
        out = bson.decode(self.encrypter.encrypt(bson.encode({"v": value}), algorithm, key_id=key_id.bytes))
        return out["v"]  # type: ignore[no-any-return]

    def decrypt(self, ciphertext: Binary) -> Any:
        return bson.decode(self.encrypter.decrypt(bson.encode({"v": ciphertext})))["v"]

    def ops(self) -> list[str]:
        return [op for _, batch in self.vault.sent for op in batch]

    def close(self) -> None:
        self.encrypter.close()


DOCUMENTS = [
    {"name": "Ada", "ssn": "123-45-6789", "salary": 120_000, "notes": {"clearance": "high"}},
    {"name": "Grace", "ssn": "987-65-4321", "salary": 135_500, "notes": {"clearance": "top"}},
    {"name": "Linus", "ssn": "555-12-3456", "salary": 99_999, "notes": {"clearance": "none"}},
]


def encrypt_documents(mongo: Mongo, key_id: uuid.UUID) -> list[dict[str, Any]]:
    """Fields as an application encrypts them: ssn deterministic (queryable by equality),
    salary and notes random."""
    return [{"name": d["name"], "ssn": mongo.encrypt(d["ssn"], DETERMINISTIC, key_id),
             "salary": mongo.encrypt(d["salary"], RANDOM, key_id),
             "notes": mongo.encrypt(d["notes"], RANDOM, key_id)} for d in DOCUMENTS]


def decrypt_documents(mongo: Mongo, stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": d["name"], **{f: mongo.decrypt(d[f]) for f in ("ssn", "salary", "notes")}} for d in stored]


def template(payload: Any) -> dict[str, Any]:
    return {a.attribute_name.value: a.attribute_value.value for a in payload.template_attribute.attributes}


def audit_since(services: Services, since: int, actor: str) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.seq > since, AuditEvent.actor == actor)
                              .order_by(AuditEvent.seq)).scalars())


def last_seq(services: Services) -> int:
    services.audit.flush()
    with services.db() as s:
        return int(s.execute(select(AuditEvent.seq).order_by(AuditEvent.seq.desc()).limit(1)).scalar() or 0)


def failure(call: Callable[[], Any]) -> str:
    with pytest.raises(MongoCryptError) as e:
        call()
    return str(e.value)


@pytest.fixture(scope="module")
def kmip_listener(services: Services) -> Iterator[KmipListener]:
    """The KMIP port as `keyserver serve` runs it (tests/kmip/conftest.py's, for this module)."""
    listener = build_listener(services, port=0)
    listener.start()
    yield listener
    listener.stop()


APP_GROUP = "mongo-app"  # the KMIP tenancy group of the application and its key officer


@pytest.fixture(scope="module")
def kmip_files(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ClientFiles]:
    """Client identities issued by Strongroom's CA, as `keyserver kmip-client create` issues them,
    in the application's KMIP group (the officer administers the application's keys)."""
    directory = tmp_path_factory.mktemp("mongocrypt-clients")
    return lambda role: issue_client(services, directory, role, APP_GROUP)


@pytest.fixture(scope="module")
def app_files(kmip_files: Callable[[str], ClientFiles]) -> ClientFiles:
    """The application's identity: the default role of a new KMIP client."""
    return kmip_files("kmip-client")


@pytest.fixture(scope="module")
def officer_files(kmip_files: Callable[[str], ClientFiles]) -> ClientFiles:
    return kmip_files("key-officer")


@pytest.fixture
def mongo_factory(app_files: ClientFiles, kmip_listener: KmipListener) -> Iterator[Callable[..., Mongo]]:
    made: list[Mongo] = []

    def make(keys: list[dict[str, Any]], files: ClientFiles | None = None) -> Mongo:
        made.append(Mongo(files or app_files, kmip_listener.port, keys))
        return made[-1]

    yield make
    for m in made:
        m.close()


@pytest.fixture
def officer(officer_files: ClientFiles, kmip_listener: KmipListener) -> Iterator[Any]:
    """Strongroom's administrator side over KMIP (secret data has no REST face)."""
    client = make_client(officer_files, kmip_listener.port)
    client.open()
    yield client
    client.close()


def rewrap(mongo: Mongo, **new_master: Any) -> list[dict[str, Any]]:
    """rewrap_many_data_key over every data key, stored back as the driver's bulk
    update does (keyMaterial and masterKey)."""
    result = mongo.encrypter.rewrap_many_data_key({}, **new_master)
    assert result is not None, "libmongocrypt found no data key to rewrap"
    rewrapped: list[dict[str, Any]] = bson.decode(result, OPTS)["v"]
    by_id = {doc["_id"]: doc for doc in mongo.vault.keys}
    for doc in rewrapped:
        by_id[doc["_id"]].update(keyMaterial=doc["keyMaterial"], masterKey=doc["masterKey"])
    return rewrapped


def app_actions(services: Services, since: int, files: ClientFiles) -> list[tuple[str, str | None, str]]:
    return [(e.action, e.object_id, e.outcome) for e in audit_since(services, since, f"kmip:{files.name}")]


def test_create_data_key_at_the_defaults_registers_activates_and_gets_secret_data(
        services: Services, mongo_factory: Callable[..., Mongo], app_files: ClientFiles, officer: Any) -> None:
    """createDataKey("kmip") with no master key: libmongocrypt Registers 96 bytes of
    Secret Data (KMIP 1.0), Activates it and Gets it back; the data key is encrypted
    under it in the client. Every field of several documents round-trips, through the
    same encrypter and through a new one (its keys re-fetched through KMIP)."""
    keys: list[dict[str, Any]] = []
    since = last_seq(services)
    mongo = mongo_factory(keys)
    key_id = mongo.encrypter.create_data_key("kmip", key_alt_names=["payroll"])
    assert mongo.vault.sent == [("1.0", ["REGISTER"]), ("1.0", ["ACTIVATE"]), ("1.0", ["GET"])]
    register = mongo.vault.payloads[0]
    assert template(register) == {"Cryptographic Usage Mask": 0}  # no name, an empty mask
    assert register.managed_object.secret_data_type.value == enums.SecretDataType.SEED
    assert len(register.managed_object.key_block.key_value.key_material.value) == 96
    [data_key] = keys
    master = data_key["masterKey"]
    assert master == {"provider": "kmip", "keyId": master["keyId"]}  # not delegated: the default
    uid = master["keyId"]
    secret = officer.get(uid)
    assert isinstance(secret, pie.SecretData) and len(secret.value) == 96
    assert secret.data_type == enums.SecretDataType.SEED
    state = {a.attribute_name.value: a.attribute_value for a in officer.get_attributes(uid)[1]}["State"]
    assert state.value == enums.State.ACTIVE

    stored = encrypt_documents(mongo, key_id)
    for plain, enc in zip(DOCUMENTS, stored, strict=True):
        assert plain["ssn"].encode() not in bytes(enc["ssn"])
    assert mongo.encrypt(DOCUMENTS[0]["ssn"], DETERMINISTIC, key_id) == stored[0]["ssn"]
    assert mongo.encrypt(DOCUMENTS[0]["salary"], RANDOM, key_id) != stored[0]["salary"]
    assert decrypt_documents(mongo, stored) == DOCUMENTS

    fresh = mongo_factory(keys)
    assert decrypt_documents(fresh, stored) == DOCUMENTS
    assert fresh.vault.sent == [("1.0", ["GET"])]  # once: libmongocrypt caches the decrypted data key

    actions = app_actions(services, since, app_files)
    assert actions[:3] == [("kmip.register", uid, "allowed"), ("kmip.activate", uid, "allowed"),
                           ("key.export", uid, "allowed")]
    gets = [a for a in actions if a[0] == "key.export"]
    assert len(gets) == len([op for m in (mongo, fresh) for op in m.ops() if op == "GET"])
    assert {a[1] for a in actions} == {uid}



def test_create_data_key_under_a_secret_registered_in_strongroom(
        services: Services, mongo_factory: Callable[..., Mongo], app_files: ClientFiles, officer: Any) -> None:
    """An operator registers the master key (96 bytes of Secret Data) and gives its
    identifier to the application: libmongocrypt only Gets it."""
    uid = officer.register(pie.SecretData(os.urandom(96), enums.SecretDataType.SEED, name="mongo-cmk-registered"))
    officer.activate(uid)
    keys: list[dict[str, Any]] = []
    since = last_seq(services)
    mongo = mongo_factory(keys)
    key_id = mongo.encrypter.create_data_key("kmip", master_key={"keyId": uid})
    assert mongo.vault.sent == [("1.0", ["GET"])]
    assert keys[0]["masterKey"] == {"provider": "kmip", "keyId": uid}
    stored = encrypt_documents(mongo, key_id)
    assert decrypt_documents(mongo_factory(keys), stored) == DOCUMENTS
    assert {a for a in app_actions(services, since, app_files)} == {("key.export", uid, "allowed")}

    # a master key that is not 96 bytes of secret data is refused by libmongocrypt, clearly
    short = officer.register(pie.SecretData(bytes(32), enums.SecretDataType.SEED))
    officer.activate(short)
    assert "96" in failure(lambda: mongo.encrypter.create_data_key("kmip", master_key={"keyId": short}))
    missing = str(uuid.uuid4())
    message = failure(lambda: mongo.encrypter.create_data_key("kmip", master_key={"keyId": missing}))
    assert "Item Not Found" in message


def new_master_key(services: Services) -> tuple[str, str]:
    """A managed AES-256 key made in Strongroom (as REST and the console make it): its
    name, and its current version's KMIP Unique Identifier."""
    key = services.keys.create(system_context("tests"), KeySpec(name=f"mongo-cmk-{uuid.uuid4().hex[:8]}",
                                                                kmip_group=APP_GROUP))
    return key.name, str(max(key.versions, key=lambda v: v.version).id)


def test_delegated_master_key_encrypts_and_decrypts_inside_the_key_server(
        services: Services, mongo_factory: Callable[..., Mongo], app_files: ClientFiles) -> None:
    """{"delegated": true} (libmongocrypt >= 1.12): the master key never leaves
    Strongroom. Without a keyId libmongocrypt Creates an AES-256 key and Activates it;
    the data key is wrapped by KMIP Encrypt and unwrapped by Decrypt (AES-CBC, PKCS5
    padding, its own IV), in the HSM. With a keyId: a managed key made over REST."""
    keys: list[dict[str, Any]] = []
    since = last_seq(services)
    mongo = mongo_factory(keys)
    created = mongo.encrypter.create_data_key("kmip", master_key={"delegated": True})
    assert mongo.vault.sent == [("1.2", ["CREATE"]), ("1.0", ["ACTIVATE"]), ("1.2", ["ENCRYPT"])]
    create, _, encrypt = mongo.vault.payloads
    assert template(create) == {"Cryptographic Algorithm": enums.CryptographicAlgorithm.AES,
                                "Cryptographic Length": 256, "Cryptographic Usage Mask": 12}  # Encrypt|Decrypt
    params = encrypt.cryptographic_parameters
    assert (params.block_cipher_mode, params.padding_method, params.random_iv, encrypt.iv_counter_nonce) == (
        enums.BlockCipherMode.CBC, enums.PaddingMethod.PKCS5, True, None)  # the HSM draws the IV
    created_uid = keys[0]["masterKey"]["keyId"]
    assert keys[0]["masterKey"] == {"provider": "kmip", "delegated": True, "keyId": created_uid}

    _, uid = new_master_key(services)
    key_id = mongo.encrypter.create_data_key("kmip", master_key={"keyId": uid, "delegated": True})
    assert keys[1]["masterKey"] == {"provider": "kmip", "delegated": True, "keyId": uid}
    stored = encrypt_documents(mongo, key_id) + encrypt_documents(mongo, created)
    fresh = mongo_factory(keys)
    assert decrypt_documents(fresh, stored) == DOCUMENTS + DOCUMENTS
    assert sorted(fresh.ops()) == ["DECRYPT", "DECRYPT"]  # one per data key: cached after
    assert all(len(p.iv_counter_nonce) == 16 for p in fresh.vault.payloads)  # the IV back in its own field

    records = audit_since(services, since, f"kmip:{app_files.name}")
    created_key = records[0].object_id
    assert [(e.action, e.object_type, e.outcome) for e in records[:3]] == [
        ("key.create", "key", "allowed"), ("key.activate", "key", "allowed"), ("key.encrypt", "key", "allowed")]
    assert {e.object_id for e in records[:3]} == {created_key}  # the managed key, under its REST id
    assert records[2].details["kmip_uid"] == created_uid and records[2].details["mechanism"] == "AES-CBC-PAD"
    decrypts = {e.details["kmip_uid"] for e in records if e.action == "key.decrypt" and e.outcome == "allowed"}
    assert decrypts == {uid, created_uid}
    assert not any(e.action == "key.export" for e in records)  # no master key material ever left


def test_an_identity_without_key_export_serves_delegated_mode_only(
        services: Services, mongo_factory: Callable[..., Mongo], tmp_path: Path) -> None:
    """The hardening for delegated mode: an application identity with key_export "none"
    cannot Get any key material (libmongocrypt's default mode is refused, Permission
    Denied, audited), and needs none: the HSM encrypts and decrypts its data keys."""
    issued = services.kmip_clients.create(system_context("tests"), name=f"mongo-{uuid.uuid4().hex[:8]}",
                                          role="kmip-client", key_export="none", group=APP_GROUP)
    assert issued.private_key_pem is not None
    (tmp_path / "cert.pem").write_text(issued.certificate_pem)
    (tmp_path / "key.pem").write_text(issued.private_key_pem)
    (tmp_path / "ca.pem").write_text(issued.ca_certificate_pem)
    files = ClientFiles(issued.client.name, str(issued.client.id), tmp_path / "cert.pem", tmp_path / "key.pem",
                        tmp_path / "ca.pem")
    keys: list[dict[str, Any]] = []
    mongo = mongo_factory(keys, files)
    since = last_seq(services)
    message = failure(lambda: mongo.encrypter.create_data_key("kmip"))
    assert "Result Reason (12): Permission Denied" in message and "keys:export" in message, message
    refused = [(e.action, e.outcome, e.details.get("missing_permission"))
               for e in audit_since(services, since, f"kmip:{files.name}") if e.outcome == "denied"]
    assert ("key.export", "denied", "keys:export") in refused, refused

    _, uid = new_master_key(services)
    key_id = mongo.encrypter.create_data_key("kmip", master_key={"keyId": uid, "delegated": True})
    assert decrypt_documents(mongo_factory(keys, files), encrypt_documents(mongo, key_id)) == DOCUMENTS


def test_rotating_a_registered_master_key_rewraps_every_data_key(
        services: Services, mongo_factory: Callable[..., Mongo], app_files: ClientFiles, officer: Any) -> None:
    """rewrap_many_data_key to new KMIP master keys: libmongocrypt Gets the old secret,
    then Registers, Activates and Gets a new one for each data key, and re-encrypts the
    data key under it. Old ciphertexts still decrypt (the data keys themselves did not
    change), now through the new master keys only; then every data key onto one master
    key the operator registered."""
    keys: list[dict[str, Any]] = []
    mongo = mongo_factory(keys)
    key_ids = [mongo.encrypter.create_data_key("kmip") for _ in range(2)]
    old_uids = {doc["masterKey"]["keyId"] for doc in keys}
    stored = [encrypt_documents(mongo, k) for k in key_ids]

    rotator = mongo_factory(keys)
    since = last_seq(services)
    assert len(rewrap(rotator, provider="kmip", master_key={})) == 2
    ops = rotator.ops()
    assert ops.count("REGISTER") == ops.count("ACTIVATE") == 2, ops
    new_uids = {doc["masterKey"]["keyId"] for doc in keys}
    assert len(new_uids) == 2 and not new_uids & old_uids
    registered = {a[1] for a in app_actions(services, since, app_files) if a[0] == "kmip.register"}
    assert registered == new_uids

    fresh = mongo_factory(keys)
    for batch in stored:
        assert decrypt_documents(fresh, batch) == DOCUMENTS
    assert fresh.ops() == ["GET", "GET"]  # one Get per data key
    assert {v for v, _ in fresh.vault.sent} == {"1.0"}

    target = officer.register(pie.SecretData(os.urandom(96), enums.SecretDataType.SEED, name="mongo-cmk-2027"))
    officer.activate(target)
    rewrap(mongo_factory(keys), provider="kmip", master_key={"keyId": target})
    assert {doc["masterKey"]["keyId"] for doc in keys} == {target}
    fresh = mongo_factory(keys)
    for batch in stored:
        assert decrypt_documents(fresh, batch) == DOCUMENTS
    # still one Get per data key: libmongocrypt caches decrypted data keys, not master keys
    assert fresh.ops() == ["GET", "GET"]


def test_a_strongroom_rotation_of_a_delegated_master_key_and_the_rewrap_onto_its_newest_version(
        services: Services, mongo_factory: Callable[..., Mongo], app_files: ClientFiles, officer: Any) -> None:
    """A rotation in Strongroom (REST, console, a schedule or KMIP ReKey) makes a new
    version: a new KMIP Unique Identifier, Active, while the old one is Deactivated
    (decrypt-only). Data keys keep working under the old identifier; the old one no
    longer encrypts, so a rewrap that keeps it is refused (Illegal Operation), and a
    rewrap onto the newest version — Locate by the key's name, newest first — moves them."""
    name, old_uid = new_master_key(services)
    keys: list[dict[str, Any]] = []
    mongo = mongo_factory(keys)
    key_id = mongo.encrypter.create_data_key("kmip", master_key={"keyId": old_uid, "delegated": True})
    stored = encrypt_documents(mongo, key_id)

    rotated = services.keys.rotate(system_context("tests"), name)
    new_uid = str(max(rotated.versions, key=lambda v: v.version).id)
    assert new_uid != old_uid
    assert decrypt_documents(mongo_factory(keys), stored) == DOCUMENTS  # the old version still decrypts

    since = last_seq(services)
    refused = failure(lambda: rewrap(mongo_factory(keys)))  # same master key: Encrypt under the old version
    assert "Illegal Operation" in refused and "deactivated" in refused, refused
    denied = [a for a in app_actions(services, since, app_files) if a[2] == "denied"]
    assert denied == [("key.encrypt", str(rotated.id), "denied"), ("kmip.encrypt", old_uid, "denied")]
    assert keys[0]["masterKey"]["keyId"] == old_uid  # nothing changed

    newest = officer.locate(attributes=[_attrs.create_attribute(enums.AttributeType.NAME, name)])[0]
    assert newest == new_uid
    rotator = mongo_factory(keys)
    rewrap(rotator, provider="kmip", master_key={"keyId": newest, "delegated": True})
    assert rotator.vault.sent == [("1.2", ["DECRYPT"]), ("1.2", ["ENCRYPT"])]
    assert keys[0]["masterKey"] == {"provider": "kmip", "delegated": True, "keyId": new_uid}

    fresh = mongo_factory(keys)
    assert decrypt_documents(fresh, stored) == DOCUMENTS
    assert fresh.ops() == ["DECRYPT"]
    uses = [e for e in audit_since(services, since, f"kmip:{app_files.name}") if e.action == "key.decrypt"]
    assert uses and uses[-1].details["kmip_uid"] == new_uid


def test_revocation_stops_protection_destruction_and_a_revoked_identity_stop_reading(
        services: Services, mongo_factory: Callable[..., Mongo], kmip_files: Callable[[str], ClientFiles],
        officer: Any) -> None:
    """Revocation as KMIP defines it (1.4 §3.22) and Strongroom applies it everywhere:
    a revoked master key no longer protects — no data key is made or rewrapped under it
    (delegated: Encrypt refused) — but still processes what it protected, as the old
    version of a rotated key must. Reading stops when the master key is destroyed, or
    when the application's identity is revoked: a new encrypter gets libmongocrypt's
    error carrying the KMIP result, and each refusal is audited under the application."""
    files = kmip_files("kmip-client")
    actor = f"kmip:{files.name}"

    # secret data (libmongocrypt's default master key)
    keys: list[dict[str, Any]] = []
    mongo = mongo_factory(keys, files)
    stored = encrypt_documents(mongo, mongo.encrypter.create_data_key("kmip"))
    secret_uid = keys[0]["masterKey"]["keyId"]
    officer.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, secret_uid)
    assert decrypt_documents(mongo_factory(keys, files), stored) == DOCUMENTS  # Deactivated: still processes
    officer.destroy(secret_uid)
    since = last_seq(services)
    message = failure(lambda: decrypt_documents(mongo_factory(keys, files), stored))
    assert "Result Reason (11): Illegal Operation" in message and "material is erased" in message, message
    assert [(e.action, e.object_id, e.outcome) for e in audit_since(services, since, actor)] == [
        ("kmip.get", secret_uid, "denied")]
    # an encrypter that already holds the data key keeps it (key_expiration_ms, 60 s by default)
    assert decrypt_documents(mongo, stored) == DOCUMENTS

    # a delegated master key: a managed key, revoked and destroyed from REST or the console
    name, uid = new_master_key(services)
    keys = []
    mongo = mongo_factory(keys, files)
    stored = encrypt_documents(mongo, mongo.encrypter.create_data_key(
        "kmip", master_key={"keyId": uid, "delegated": True}))
    services.keys.revoke(system_context("tests"), name, reason="key-compromise")
    assert decrypt_documents(mongo_factory(keys, files), stored) == DOCUMENTS  # Compromised: still processes
    since = last_seq(services)
    message = failure(lambda: mongo.encrypter.create_data_key("kmip", master_key={"keyId": uid, "delegated": True}))
    assert "Illegal Operation" in message and "compromised" in message, message
    assert ("kmip.encrypt", uid, "denied") in [(e.action, e.object_id, e.outcome)
                                               for e in audit_since(services, since, actor)]
    # Destroying a version the application still reads is crypto-shredding: asked for by
    # name (decision 0024), or it is refused with the holders.
    services.keys.destroy(system_context("tests"), name, shred=True)
    since = last_seq(services)
    message = failure(lambda: decrypt_documents(mongo_factory(keys, files), stored))
    assert "Result Reason (11): Illegal Operation" in message, message
    assert ("kmip.decrypt", uid, "denied") in [(e.action, e.object_id, e.outcome)
                                               for e in audit_since(services, since, actor)]

    # the application's identity revoked (console, REST or `keyserver kmip-client revoke`)
    _, live_uid = new_master_key(services)
    keys = []
    mongo = mongo_factory(keys, files)
    stored = encrypt_documents(mongo, mongo.encrypter.create_data_key(
        "kmip", master_key={"keyId": live_uid, "delegated": True}))
    services.kmip_clients.revoke(system_context("tests"), uuid.UUID(files.client_id))
    since = last_seq(services)
    message = failure(lambda: decrypt_documents(mongo_factory(keys, files), stored))
    assert "Result Reason (12): Permission Denied" in message and "is revoked" in message, message
    services.audit.flush()
    with services.db() as s:
        rejected = [(e.action, e.object_id, e.outcome, e.details.get("name"))
                    for e in s.execute(select(AuditEvent).where(AuditEvent.seq > since)).scalars()]
    assert ("kmip.reject", files.client_id, "denied", files.name) in rejected  # no identity: no actor


def test_a_key_server_outage_stops_new_encrypters_not_the_data_keys_one_holds(
        services: Services, app_files: ClientFiles) -> None:
    """While the KMIP port is down, an encrypter that holds a data key (libmongocrypt's
    cache: key_expiration_ms, 60 s by default; here 0, never expiring, so that the test
    does not race a clock) goes on encrypting and decrypting with it, in both modes; a
    new one — or one whose cache expired — cannot fetch a data key and fails at the first
    attempt (libmongocrypt retries its HTTP KMS providers, not KMIP) with the connection
    error."""
    listener = build_listener(services, port=0)
    listener.start()
    made: list[Mongo] = []
    try:
        _, uid = new_master_key(services)
        keys: list[dict[str, Any]] = []
        holder = Mongo(app_files, listener.port, keys, key_expiration_ms=0)
        made.append(holder)
        plain_key = holder.encrypter.create_data_key("kmip")
        delegated_key = holder.encrypter.create_data_key("kmip", master_key={"keyId": uid, "delegated": True})
        stored = encrypt_documents(holder, plain_key) + encrypt_documents(holder, delegated_key)
        listener.stop()

        assert decrypt_documents(holder, stored) == DOCUMENTS + DOCUMENTS
        again = encrypt_documents(holder, delegated_key)
        assert again[0]["ssn"] == stored[len(DOCUMENTS)]["ssn"]  # deterministic: same data key, same ciphertext
        sent = len(holder.vault.sent)
        assert decrypt_documents(holder, again) == DOCUMENTS and len(holder.vault.sent) == sent  # no KMIP at all

        cold = Mongo(app_files, listener.port, keys)
        made.append(cold)
        message = failure(lambda: decrypt_documents(cold, stored))
        assert "KMS request failed due to network error" in message and "Connection refused" in message, message
        assert cold.vault.sent == [("1.0", ["GET"])]  # libmongocrypt retries its HTTP KMS providers, not KMIP
    finally:
        listener.stop()
        for m in made:
            m.close()
