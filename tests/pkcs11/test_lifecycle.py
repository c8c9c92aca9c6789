"""What a PKCS#11 consumer sees of Strongroom's key lifecycle: an Oracle-TDE-shaped use of
a master key across sessions and a rotation, and rotation and revocation of a key done
in Strongroom (services, as the console and REST do) observed through the module."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pkcs11
import pytest
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11 import exceptions as ckr
from sqlalchemy import select

from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.pkcs11.conftest import P11, ROOT, run
from tests.pkcs11.sequence import CKR_KEY_FUNCTION_NOT_PERMITTED, by_id, object_id, refused, secret_key


def uses(services: Services, key_name: str, actor: str) -> list[tuple[str, str, int | None]]:
    """(action, outcome, version) of the key's uses by `actor`, in chain order."""
    services.audit.flush()
    key_id = str(services.keys.get(system_context("tests"), key_name).id)
    with services.db() as s:
        rows = s.execute(select(AuditEvent).where(AuditEvent.object_id == key_id, AuditEvent.actor == actor,
                                                  AuditEvent.action.in_(("key.encrypt", "key.decrypt")))
                         .order_by(AuditEvent.seq)).scalars()
        return [(e.action, e.outcome, (e.details or {}).get("version")) for e in rows]


def test_an_oracle_tde_shaped_sequence(lib: Any, p11: P11, services: Services) -> None:
    """The shape of Oracle TDE with an HSM wallet (`ENCRYPTION_WALLET_LOCATION=(SOURCE=(METHOD=HSM))`,
    `ADMINISTER KEY MANAGEMENT SET KEY IDENTIFIED BY "<PIN>"`):

    1. the database logs in to the token and generates its master key with C_GenerateKey
       (CKM_AES_KEY_GEN, 256 bits) under the label `ORACLE.TDE.HSM.MK.<hex master key id>`;
    2. each table (or tablespace) key is random bytes of the database's own, kept in the
       data dictionary encrypted by C_Encrypt under the master key (CKM_AES_CBC_PAD);
    3. on every open of the wallet — a new session, later — the master key is found by
       that label (C_FindObjects) and the table keys are decrypted with C_Decrypt.

    Then the key is rotated in Strongroom: the label now finds the new version, which new
    encryptions use; the table keys encrypted before stay readable with the version they
    name (the CKA_ID recorded beside them, as Oracle records its master key id).
    """
    mk_label = f"ORACLE.TDE.HSM.MK.{uuid.uuid4().hex.upper()}{uuid.uuid4().hex[:2].upper()}"
    token = lib.get_token(token_label=p11.locked.label)
    with token.open(rw=True, user_pin=p11.locked.pin) as s:
        assert list(s.get_objects({Attribute.LABEL: mk_label})) == []
        s.generate_key(KeyType.AES, 256, label=mk_label, store=True,
                       template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False})
        master = secret_key(s, mk_label)
        table_key, iv = os.urandom(32), os.urandom(16)
        encrypted = bytes(master.encrypt(table_key, mechanism=Mechanism.AES_CBC_PAD, mechanism_param=iv))
        first_mk = object_id(master)
    assert table_key not in encrypted and len(encrypted) == 48

    # the wallet opened again: a new session finds the master key by its label
    with token.open(user_pin=p11.locked.pin) as s:
        master = secret_key(s, mk_label)
        assert object_id(master) == first_mk
        assert master[Attribute.SENSITIVE]
        with pytest.raises(ckr.AttributeSensitive):  # the master key never leaves the key server
            master[Attribute.VALUE]
        assert bytes(master.decrypt(encrypted, mechanism=Mechanism.AES_CBC_PAD, mechanism_param=iv)) == table_key

    services.keys.rotate(system_context("tests"), mk_label, reason="tde master key rotation")
    with token.open(user_pin=p11.locked.pin) as s:
        current = secret_key(s, mk_label)
        assert object_id(current) != first_mk
        assert object_id(current) == str(services.keys.get(system_context("tests"), mk_label).versions[-1].id)
        iv2 = os.urandom(16)
        new_table_key = os.urandom(32)
        rewrapped = bytes(current.encrypt(new_table_key, mechanism=Mechanism.AES_CBC_PAD, mechanism_param=iv2))
        assert bytes(current.decrypt(rewrapped, mechanism=Mechanism.AES_CBC_PAD, mechanism_param=iv2)) == new_table_key
        # the table key encrypted before the rotation opens with the version it names
        old = by_id(s, first_mk)
        assert bytes(old.decrypt(encrypted, mechanism=Mechanism.AES_CBC_PAD, mechanism_param=iv)) == table_key
        assert not old[Attribute.ENCRYPT] and old[Attribute.DECRYPT]  # it protects nothing new
    # every use is in the audit chain, with the database's identity and the version used
    assert uses(services, mk_label, f"kmip:{p11.locked.files.name}") == [
        ("key.encrypt", "allowed", 1), ("key.decrypt", "allowed", 1),
        ("key.encrypt", "allowed", 2), ("key.decrypt", "allowed", 2), ("key.decrypt", "allowed", 1)]


def test_rotation_and_revocation_seen_by_a_consumer(lib: Any, p11: P11, services: Services) -> None:
    ctx = system_context("tests")
    name = f"p11-life-{uuid.uuid4().hex[:8]}"
    token = lib.get_token(token_label=p11.user.label)
    with token.open(rw=True) as s:
        s.generate_key(KeyType.AES, 256, label=name, store=True)
    with token.open() as s:
        v1 = secret_key(s, name)
        nonce = os.urandom(12)
        before = bytes(v1.encrypt(b"before", mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce)))
        v1_id = object_id(v1)

    services.keys.rotate(ctx, name)
    with token.open() as s:  # a new session sees the new version
        v2 = secret_key(s, name)
        v2_id = object_id(v2)
        assert v2_id != v1_id
        after = bytes(v2.encrypt(b"after", mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce)))
        old = by_id(s, v1_id)
        assert not old[Attribute.ENCRYPT] and old[Attribute.DECRYPT]
        assert bytes(old.decrypt(before, mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce))) == \
            b"before"
        # what v2 sealed, v1 cannot open: they are two keys
        with pytest.raises(ckr.EncryptedDataInvalid):
            old.decrypt(after, mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce))
    actor = f"kmip:{p11.user.files.name}"
    assert [u for u in uses(services, name, actor) if u[0] == "key.encrypt"] == [
        ("key.encrypt", "allowed", 1), ("key.encrypt", "allowed", 2)]

    # revoked while a session holds the key: the next use is refused, precisely
    with token.open() as s:
        held = secret_key(s, name)
        services.keys.revoke(ctx, name, reason="key-compromise", message="pkcs11 test")
        with refused(CKR_KEY_FUNCTION_NOT_PERMITTED):
            held.encrypt(b"x", mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce))
    with token.open() as s:  # a revoked key protects nothing: a label finds no key to encrypt with
        assert [o for o in s.get_objects({Attribute.LABEL: name, Attribute.CLASS: ObjectClass.SECRET_KEY})
                if o[Attribute.ENCRYPT]] == []
        assert bytes(by_id(s, v1_id).decrypt(before, mechanism=Mechanism.AES_GCM,
                                             mechanism_param=pkcs11.GCMParams(nonce))) == b"before"  # still opens
    # a destroyed version is gone from the token
    services.keys.destroy(ctx, name, version=1, shred=True)  # the PKCS#11 consumer used it
    with token.open() as s:
        assert [object_id(o) for o in s.get_objects({Attribute.LABEL: name})] == [v2_id]


SECURE_HEAP_PROBE = """
import ctypes, sys
import pkcs11
crypto = ctypes.CDLL("libcrypto.so.3")
crypto.CRYPTO_secure_used.restype = ctypes.c_size_t
def used():
    return crypto.CRYPTO_secure_used() if crypto.CRYPTO_secure_malloc_initialized() else -1
token = pkcs11.lib(sys.argv[1]).get_token(token_label=sys.argv[2])
before = used()
with token.open(user_pin=sys.argv[3]) as s:
    s.generate_random(64)  # a KMIP round trip: the client key is in use
    during = used()
print(before, during, used())
"""


@pytest.mark.parametrize("heap", ["65536", None])
def test_the_client_key_sits_in_openssls_secure_heap_when_asked(p11: P11, conf_for: Callable[..., Path],
                                                                heap: str | None) -> None:
    """STRONGROOM_PKCS11_SECURE_HEAP: OpenSSL keeps the decrypted client key (its
    BIGNUMs) in its locked secure arena while logged in, and frees it at logout (the
    last session closed); without it the module leaves the process's secure heap alone."""
    extra = {"STRONGROOM_PKCS11_SECURE_HEAP": heap} if heap else {}
    done = run([str(ROOT / ".venv" / "bin" / "python"), "-c", SECURE_HEAP_PROBE, str(p11.module),
                p11.locked.label, p11.locked.pin or ""], env=p11.env(conf_for(p11.locked), **extra), timeout=60)
    before, during, after = (int(x) for x in done.stdout.split())
    if heap:
        # what stays after logout is OpenSSL's own: its DRBGs' state (768 bytes here), made for TLS
        assert before == 0 and during - after >= 32 and after >= 0, done.stdout
    else:
        assert (before, during, after) == (-1, -1, -1), done.stdout
