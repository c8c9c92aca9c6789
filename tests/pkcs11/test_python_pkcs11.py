"""python-pkcs11 on `libstrongroom-pkcs11.so` (in this process, against the session's
KMIP listener): the main sequence, and what the module's results are worth outside it —
ciphertexts and MACs checked with the key material taken over KMIP by an identity that
may export it, sensitivity and extractability as Strongroom's export policy says."""

from __future__ import annotations

import hashlib
import hmac
import os
import uuid
from collections.abc import Callable
from typing import Any

import pkcs11
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.keywrap import aes_key_unwrap_with_padding
from pkcs11 import Attribute, KeyType, Mechanism
from pkcs11 import exceptions as ckr
from sqlalchemy import select

from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.kmip.conftest import make_client
from tests.pkcs11.conftest import P11
from tests.pkcs11.sequence import (
    CKR_KEY_FUNCTION_NOT_PERMITTED,
    DATA,
    by_id,
    gcm_roundtrip,
    main_sequence,
    object_id,
    refused,
    secret_key,
)


def test_slots_are_the_configured_identities(lib: Any, p11: P11) -> None:
    labels = [slot.get_token().label for slot in lib.get_slots(token_present=True)]
    assert labels == [p11.user.label, p11.locked.label, p11.noexport.label, p11.outage.label]
    assert pkcs11.TokenFlag.LOGIN_REQUIRED in lib.get_token(token_label=p11.locked.label).flags
    assert pkcs11.TokenFlag.LOGIN_REQUIRED not in lib.get_token(token_label=p11.user.label).flags


def test_the_main_sequence(lib: Any, p11: P11, make_key: Callable[..., str]) -> None:
    main_sequence(lib, p11.user.label, make_key("p11-aes"), make_key("p11-mac", algorithm="HMAC-SHA256"))


def test_results_are_the_server_keys(session: Any, p11: P11, make_key: Callable[..., str]) -> None:
    """What the module encrypts, MACs and wraps is done with Strongroom's key: the same key,
    taken over KMIP by an identity that may export it, opens and checks it outside."""
    aes_name, mac_name = make_key("p11-check"), make_key("p11-check-mac", algorithm="HMAC-SHA256")
    target_name = make_key("p11-target")
    aes, mac, target = (secret_key(session, n) for n in (aes_name, mac_name, target_name))
    kmip = make_client(p11.user.files, p11.port)
    kmip.open()
    try:
        aes_bytes, mac_bytes, target_bytes = (kmip.get(object_id(o)).value for o in (aes, mac, target))
    finally:
        kmip.close()
    nonce = os.urandom(12)
    sealed = bytes(aes.encrypt(DATA, mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce, b"aad")))
    assert AESGCM(aes_bytes).decrypt(nonce, sealed, b"aad") == DATA
    outside = AESGCM(aes_bytes).encrypt(nonce, b"from outside", None)
    assert bytes(aes.decrypt(outside, mechanism=Mechanism.AES_GCM,
                             mechanism_param=pkcs11.GCMParams(nonce))) == b"from outside"
    assert bytes(mac.sign(DATA, mechanism=Mechanism.SHA256_HMAC)) == hmac.new(mac_bytes, DATA, hashlib.sha256).digest()
    wrapped = bytes(aes.wrap_key(target, mechanism=Mechanism.AES_KEY_WRAP_PAD))
    assert aes_key_unwrap_with_padding(aes_bytes, wrapped) == target_bytes


def test_key_values_stay_in_the_server(lib: Any, p11: P11, services: Services, make_key: Callable[..., str]) -> None:
    """A key whose export policy forbids plaintext is CKA_SENSITIVE and its CKA_VALUE is
    refused (CKR_ATTRIBUTE_SENSITIVE) without asking the server; an exportable key read by
    an identity whose key_export is "none" is refused by the server (audited). Using the
    key is allowed either way."""
    exportable, sealed = make_key("p11-exportable"), make_key("p11-sealed", exportable=False)
    with lib.get_token(token_label=p11.user.label).open() as s:
        closed = secret_key(s, sealed)
        assert closed[Attribute.SENSITIVE] and not closed[Attribute.ALWAYS_SENSITIVE]
        assert closed[Attribute.EXTRACTABLE]  # wrapped by the server inside its HSM
        with pytest.raises(ckr.AttributeSensitive):
            closed[Attribute.VALUE]
        gcm_roundtrip(closed)
    with lib.get_token(token_label=p11.noexport.label).open() as s:
        key = secret_key(s, exportable)
        assert not key[Attribute.SENSITIVE]  # the key's policy; this identity's right is the server's to check
        # The length query succeeds (CKA_VALUE_LEN is public); the read then gets
        # CKR_ATTRIBUTE_SENSITIVE from the module, which python-pkcs11 reports as
        # FunctionFailed (a second call that fails); the server's refusal is audited below.
        with pytest.raises(ckr.FunctionFailed):
            key[Attribute.VALUE]
        gcm_roundtrip(key)  # using it is allowed; taking it out is not, not even wrapped
        with refused(CKR_KEY_FUNCTION_NOT_PERMITTED):
            secret_key(s, sealed).wrap_key(key, mechanism=Mechanism.AES_KEY_WRAP_PAD)
    services.audit.flush()
    with services.db() as db:
        refusals = db.execute(select(AuditEvent).where(AuditEvent.action == "key.export",
                                                       AuditEvent.actor == f"kmip:{p11.noexport.files.name}")
                              ).scalars().all()
    assert [r.outcome for r in refusals] == ["denied", "denied"]  # the CKA_VALUE read, the wrap
    assert all(not r.details.get("plaintext") for r in refusals)


def test_an_exportable_key_is_readable_by_an_identity_that_may_export(
        lib: Any, p11: P11, services: Services, make_key: Callable[..., str]) -> None:
    """CKA_VALUE of an exportable key is a plaintext KMIP Get, audited key.export; HMAC
    keys read the same way but are never wrapped (CKR_KEY_NOT_WRAPPABLE)."""
    name, mac_name = make_key("p11-readable"), make_key("p11-readable-mac", algorithm="HMAC-SHA256")
    with lib.get_token(token_label=p11.user.label).open() as s:
        key, mac = secret_key(s, name), secret_key(s, mac_name)
        value, mac_value = bytes(key[Attribute.VALUE]), bytes(mac[Attribute.VALUE])
        assert not key[Attribute.SENSITIVE] and key[Attribute.EXTRACTABLE]
        assert len(value) == key[Attribute.VALUE_LEN] == 32 and len(mac_value) == 32
        with pytest.raises(ckr.KeyNotWrappable):
            key.wrap_key(mac, mechanism=Mechanism.AES_KEY_WRAP_PAD)
        assert list(s.get_objects({Attribute.VALUE: value})) == []  # values are not searched by
        uid, mac_uid = object_id(key), object_id(mac)
    kmip = make_client(p11.user.files, p11.port)
    kmip.open()
    try:
        assert value == kmip.get(uid).value
        assert mac_value == kmip.get(mac_uid).value
    finally:
        kmip.close()
    services.audit.flush()
    key_id = str(services.keys.get(system_context("tests"), name).id)
    with services.db() as db:
        exports = db.execute(select(AuditEvent).where(AuditEvent.action == "key.export",
                                                      AuditEvent.object_id == key_id)).scalars().all()
    # the module's read and the check's Get: both plaintext, both recorded, no bytes in either
    assert [(r.outcome, r.details["plaintext"]) for r in exports] == [("allowed", True)] * 2
    assert all(value.hex() not in str(r.details) for r in exports)


def test_generated_keys_are_strongroom_keys(session: Any, services: Services) -> None:
    name = f"p11-made-{uuid.uuid4().hex[:8]}"
    made = session.generate_key(KeyType.AES, 256, label=name, store=True)
    gcm_roundtrip(made)
    key = services.keys.get(system_context("tests"), name)
    assert (key.algorithm, key.length_bits) == ("AES", 256)
    assert str(key.versions[-1].id) == object_id(made)
    assert by_id(session, object_id(made))[Attribute.LABEL] == name


def test_rsa_oaep_wraps_an_aes_key_and_the_private_half_unwraps_it(session: Any, make_key: Callable[..., str]) -> None:
    public, private = session.generate_keypair(KeyType.RSA, 2048, label=f"p11-kek-{uuid.uuid4().hex[:8]}", store=True)
    table = secret_key(session, make_key("p11-table"))
    oaep = (Mechanism.SHA_1, pkcs11.MGF.SHA1, None)
    wrapped = bytes(public.wrap_key(table, mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=oaep))
    assert len(wrapped) == 256
    back = private.unwrap_key(pkcs11.ObjectClass.SECRET_KEY, KeyType.AES, wrapped,
                              label=f"p11-back-{uuid.uuid4().hex[:8]}",
                              mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=oaep, store=True)
    nonce = os.urandom(12)
    sealed = bytes(table.encrypt(DATA, mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce)))
    assert bytes(back.decrypt(sealed, mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce))) == DATA


def test_bad_input_gets_a_precise_code(session: Any, make_key: Callable[..., str]) -> None:
    key = secret_key(session, make_key("p11-bad"))
    nonce = os.urandom(12)
    sealed = bytearray(key.encrypt(DATA, mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce)))
    sealed[0] ^= 1
    with pytest.raises(ckr.EncryptedDataInvalid):
        key.decrypt(bytes(sealed), mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(nonce))
    with pytest.raises(ckr.MechanismInvalid):
        key.encrypt(DATA, mechanism=Mechanism.AES_ECB)


def test_session_keys_end_with_their_session(lib: Any, p11: P11, services: Services) -> None:
    """CKA_TOKEN false (what Java's key generators ask for) is a key at the server like any
    other, destroyed there when the session that made it closes."""
    name = f"p11-session-{uuid.uuid4().hex[:8]}"
    with lib.get_token(token_label=p11.user.label).open(rw=True) as s:
        made = s.generate_key(KeyType.AES, 256, label=name, store=False)
        gcm_roundtrip(made)
        key_id = services.keys.get(system_context("tests"), name).id
        assert object_id(made) == str(services.keys.get(system_context("tests"), str(key_id)).versions[-1].id)
    states = [v.state for v in services.keys.get(system_context("tests"), str(key_id)).versions]
    assert states == ["destroyed"]
    with lib.get_token(token_label=p11.user.label).open() as s:
        assert list(s.get_objects({Attribute.LABEL: name})) == []


@pytest.mark.parametrize(("mechanism", "name"), [(Mechanism.SHA_1, "sha1"), (Mechanism.SHA256, "sha256"),
                                                 (Mechanism.SHA384, "sha384"), (Mechanism.SHA512, "sha512")])
def test_digests_are_computed_in_the_module(lib: Any, p11: P11, session: Any, make_key: Callable[..., str],
                                            mechanism: Mechanism, name: str) -> None:
    """C_Digest and C_DigestUpdate/C_DigestFinal, listed without CKF_HW (software, no key)."""
    info = lib.get_token(token_label=p11.user.label).slot.get_mechanism_info(mechanism)
    assert pkcs11.MechanismFlag.DIGEST in info.flags and pkcs11.MechanismFlag.HW not in info.flags
    assert bytes(session.digest(DATA, mechanism=mechanism)) == hashlib.new(name, DATA).digest()
    parts = [DATA, b"", os.urandom(70_000)]
    assert bytes(session.digest(iter(parts), mechanism=mechanism)) == hashlib.new(name, b"".join(parts)).digest()
    # a key's value stays in the server: C_DigestKey is refused
    with pytest.raises(ckr.KeyIndigestible):
        session.digest(secret_key(session, make_key("p11-digest")), mechanism=mechanism)


def test_generated_and_unwrapped_keys_take_their_policy_from_the_template(
        session: Any, services: Services, make_key: Callable[..., str]) -> None:
    """CKA_SENSITIVE in C_GenerateKey/C_UnwrapKey is the new key's export policy in
    Strongroom; absent, the key is not exportable in plaintext."""
    name = f"p11-policy-{uuid.uuid4().hex[:8]}"
    closed = session.generate_key(KeyType.AES, 256, label=name, store=True)
    opened = session.generate_key(KeyType.AES, 128, label=f"{name}-open", store=True,
                                  template={Attribute.SENSITIVE: False})
    keys = services.keys
    assert not keys.get(system_context("tests"), name).exportable and closed[Attribute.SENSITIVE]
    assert keys.get(system_context("tests"), f"{name}-open").exportable and not opened[Attribute.SENSITIVE]
    assert len(bytes(opened[Attribute.VALUE])) == 16
    with pytest.raises(ckr.AttributeSensitive):
        closed[Attribute.VALUE]
    kek = secret_key(session, make_key("p11-policy-kek"))
    blob = kek.wrap_key(closed, mechanism=Mechanism.AES_KEY_WRAP_PAD)  # a sensitive AES key still wraps
    back = kek.unwrap_key(pkcs11.ObjectClass.SECRET_KEY, KeyType.AES, blob, label=f"{name}-back", store=True,
                          mechanism=Mechanism.AES_KEY_WRAP_PAD, template={Attribute.SENSITIVE: False})
    assert keys.get(system_context("tests"), f"{name}-back").exportable and not back[Attribute.SENSITIVE]
