"""The conformance suite against Pkcs11Backend on SoftHSM2, plus SoftHSM2-specific checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from pkcs11 import Attribute

from hsm.backend import RSA_OAEP_SHA1, RSA_OAEP_SHA256, WrappedKey
from hsm.pkcs11 import Pkcs11Backend
from tests.hsm.conformance import *  # noqa: F403
from tests.hsm.conformance import oaep_padding

SHA1_OAEP = oaep_padding(RSA_OAEP_SHA1)


@pytest.fixture(scope="module")
def backend(hsm_backend: Pkcs11Backend) -> Pkcs11Backend:
    return hsm_backend


def _kek_public(backend: Pkcs11Backend, kek_id: str) -> rsa.RSAPublicKey:
    public = serialization.load_pem_public_key(backend.get_kek(kek_id).public_key_pem)
    assert isinstance(public, rsa.RSAPublicKey)
    return public


# --- capability detection -----------------------------------------------------------
def test_softhsm2_is_recognised_by_the_quirk_table(backend: Pkcs11Backend) -> None:
    capabilities = backend.capabilities
    assert capabilities.manufacturer == "SoftHSM project"
    assert capabilities.model == "SoftHSM v2"
    assert capabilities.firmware.startswith("2.")
    assert capabilities.rsa_wrap_mechanism == RSA_OAEP_SHA1
    assert capabilities.rsa_unwrap_mechanisms == frozenset({RSA_OAEP_SHA1})


def test_quirk_table_agrees_with_the_real_token(backend: Pkcs11Backend) -> None:
    # If a SoftHSM2 release ever fixes OAEP-SHA-256, this fails and the quirk entry
    # should get an upper firmware bound.
    assert backend.probe_oaep(RSA_OAEP_SHA1)
    assert not backend.probe_oaep(RSA_OAEP_SHA256)


def test_sha256_blobs_are_refused_up_front(backend: Pkcs11Backend, kek: str) -> None:
    from hsm.errors import HsmInvalidInput

    public = _kek_public(backend, kek)
    oaep256 = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    blob = WrappedKey(kek, RSA_OAEP_SHA256, public.encrypt(bytes(32), oaep256))
    with pytest.raises(HsmInvalidInput, match="cannot unwrap RSA-OAEP-SHA256"):
        backend.unwrap_key(blob)


# --- RSA-OAEP interop, both directions -------------------------------------------------
def test_token_wrap_opens_with_cryptography(backend: Pkcs11Backend) -> None:
    """Wrap inside the token under a key whose private half we hold, unwrap in software."""
    software = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = software.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    material = bytes(range(100, 132))
    kek_id = backend.get_kek(backend.list_keks()[0].kek_id).kek_id
    delivered = backend.rewrap_for_public_key(
        backend.import_key(material, kek_id=kek_id), public_key_der=der
    )
    assert software.decrypt(delivered.ciphertext, SHA1_OAEP) == material


def test_cryptography_wrap_opens_in_the_token(backend: Pkcs11Backend, kek: str) -> None:
    """Wrap in software under the KEK public key, unwrap inside the token."""
    material = bytes.fromhex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
    blob = _kek_public(backend, kek).encrypt(material, SHA1_OAEP)
    assert backend.unwrap_key(WrappedKey(kek, RSA_OAEP_SHA1, blob)) == material


# --- token hygiene --------------------------------------------------------------------
def _session_objects(backend: Pkcs11Backend) -> int:
    with backend._borrow() as session:
        return len(list(session.get_objects({Attribute.TOKEN: False})))


def test_operations_leave_no_session_objects_behind(backend: Pkcs11Backend, kek: str) -> None:
    recipient = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = recipient.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    wrapped = backend.generate_wrapped_key(kek_id=kek)
    # A host's public key object is cached (bounded, TTL) by design: create it first.
    backend.rewrap_for_public_key(wrapped, public_key_der=der)
    before = _session_objects(backend)
    for _ in range(5):
        again = backend.generate_wrapped_key(kek_id=kek)
        backend.unwrap_key(again)
        backend.rewrap_under_kek(again, kek_id=kek)
        backend.rewrap_for_public_key(again, public_key_der=der)
        backend.import_key(bytes(16), kek_id=kek)
    for bad in (b"", wrapped.ciphertext[:-1]):
        with pytest.raises(Exception):  # noqa: B017 - any failure must clean up too
            backend.rewrap_for_public_key(
                WrappedKey(kek, wrapped.mechanism, bad), public_key_der=der
            )
    assert _session_objects(backend) == before


def test_recipient_keys_are_cached_once_per_host(hsm_token_base: Path) -> None:
    from hsm import testing
    from hsm.pkcs11 import open_backend

    backend = open_backend(testing.make_test_config(hsm_token_base, token_label="recipients"))
    try:
        backend.create_kek("k")
        wrapped = backend.generate_wrapped_key(kek_id="k")
        ders = [rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) for _ in range(2)]
        base = _session_objects(backend)
        for der in ders * 3:
            backend.rewrap_for_public_key(wrapped, public_key_der=der)
        assert _session_objects(backend) == base + 2  # one object per host, reused
        assert len(backend._recipients) == 2
    finally:
        backend.close()


def test_data_keys_are_never_token_objects(backend: Pkcs11Backend, kek: str) -> None:
    with backend._borrow() as session:
        before = len(list(session.get_objects({Attribute.TOKEN: True})))
    wrapped = backend.generate_wrapped_key(kek_id=kek)
    backend.encrypt_with(wrapped, b"x", aad=b"")
    backend.unwrap_key(wrapped)
    with backend._borrow() as session:
        assert len(list(session.get_objects({Attribute.TOKEN: True}))) == before


def test_cached_handle_is_non_extractable(backend: Pkcs11Backend, kek: str) -> None:
    wrapped = backend.generate_wrapped_key(kek_id=kek)
    backend.encrypt_with(wrapped, b"x", aad=b"")
    entry = backend._cache.lease(
        (wrapped.wrapping_key_id, wrapped.mechanism, __import__("hashlib").sha256(
            wrapped.ciphertext).digest())
    )
    assert entry is not None
    try:
        attrs = entry.owner.get_attributes(
            [Attribute.SENSITIVE, Attribute.EXTRACTABLE, Attribute.TOKEN, Attribute.WRAP]
        )
    finally:
        backend._cache.release(entry)
    assert attrs == {
        Attribute.SENSITIVE: True,
        Attribute.EXTRACTABLE: False,
        Attribute.TOKEN: False,
        Attribute.WRAP: False,
    }
