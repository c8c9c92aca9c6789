"""Keys a caller brings wrapped (KMIP Register with Key Wrapping Data, PKCS#11 C_UnwrapKey):
unwrapped inside the token, wrapped under the KEK at once, and the same key afterwards —
checked by wrapping with `cryptography` in software and using the imported key."""

from __future__ import annotations

import hashlib
import hmac
import os
import uuid

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.keywrap import aes_key_wrap, aes_key_wrap_with_padding

from hsm import (
    AES_KW,
    AES_KWP,
    RSA_OAEP_SHA1,
    RSA_OAEP_SHA256,
    HsmIntegrityError,
    HsmInvalidInput,
    SealedPrivateKey,
)
from hsm.pkcs11 import Pkcs11Backend
from keyserver.core.kmip_sealed import seal


@pytest.fixture(scope="module")
def kek(hsm_backend: Pkcs11Backend) -> str:
    kek_id = f"kek-imports-{uuid.uuid4().hex[:8]}"
    hsm_backend.create_kek(kek_id)
    return kek_id


@pytest.mark.parametrize("size", [16, 24, 32])
def test_an_aes_key_wrapped_under_an_aes_key_is_imported_under_the_kek(hsm_backend: Pkcs11Backend, kek: str,
                                                                       size: int) -> None:
    wrapping_material = os.urandom(32)
    wrapping = hsm_backend.import_key(wrapping_material, kek_id=kek)
    material = os.urandom(size)
    blob = aes_key_wrap_with_padding(wrapping_material, material)
    imported = hsm_backend.import_wrapped_key(blob, unwrapping=wrapping, mechanism=AES_KWP, kek_id=kek)
    assert imported.length_bits == size * 8
    assert imported.wrapped.wrapping_key_id == kek
    assert imported.wrapped.mechanism == hsm_backend.capabilities.rsa_wrap_mechanism
    assert hsm_backend.unwrap_key(imported.wrapped) == material  # the same key, now under the KEK
    # a tampered blob is one opaque integrity failure
    with pytest.raises(HsmIntegrityError):
        hsm_backend.import_wrapped_key(blob[:-1] + bytes([blob[-1] ^ 1]), unwrapping=wrapping, mechanism=AES_KWP,
                                       kek_id=kek)


def test_rfc_3394_key_wrap_without_padding_is_unwrapped_too(hsm_backend: Pkcs11Backend, kek: str) -> None:
    """python-pkcs11's default AES wrapping mechanism (CKM_AES_KEY_WRAP)."""
    wrapping_material = os.urandom(32)
    wrapping = hsm_backend.import_key(wrapping_material, kek_id=kek)
    material = os.urandom(32)
    blob = aes_key_wrap(wrapping_material, material)
    imported = hsm_backend.import_wrapped_key(blob, unwrapping=wrapping, mechanism=AES_KW, kek_id=kek)
    assert imported.length_bits == 256 and hsm_backend.unwrap_key(imported.wrapped) == material
    with pytest.raises(HsmIntegrityError):  # an RFC 5649 blob is no RFC 3394 one
        hsm_backend.import_wrapped_key(aes_key_wrap_with_padding(wrapping_material, material), unwrapping=wrapping,
                                       mechanism=AES_KW, kek_id=kek)


def test_an_hmac_key_wrapped_under_an_aes_key_is_imported_as_a_secret(hsm_backend: Pkcs11Backend,
                                                                      kek: str) -> None:
    wrapping_material = os.urandom(16)
    wrapping = hsm_backend.import_key(wrapping_material, kek_id=kek)
    material = os.urandom(48)
    imported = hsm_backend.import_wrapped_key(aes_key_wrap_with_padding(wrapping_material, material),
                                              unwrapping=wrapping, mechanism=AES_KWP, kek_id=kek, secret=True)
    assert imported.length_bits == 384
    assert hsm_backend.hmac(imported.wrapped, b"data", hash="SHA-256") == \
        hmac.new(material, b"data", hashlib.sha256).digest()
    # its length is measured in the token, to the 8-byte block (nothing tells it closer)
    odd = os.urandom(20)
    imported = hsm_backend.import_wrapped_key(aes_key_wrap_with_padding(wrapping_material, odd),
                                              unwrapping=wrapping, mechanism=AES_KWP, kek_id=kek, secret=True)
    assert imported.length_bits == 192 and hsm_backend.unwrap_secret(imported.wrapped) == odd
    with pytest.raises(HsmInvalidInput, match="8 bytes"):
        hsm_backend.import_wrapped_key(aes_key_wrap_with_padding(wrapping_material, os.urandom(8)),
                                       unwrapping=wrapping, mechanism=AES_KWP, kek_id=kek, secret=True)
    # 48 bytes is no AES key: refused after the unwrap, inside the token
    with pytest.raises(HsmInvalidInput, match="48 bytes"):
        hsm_backend.import_wrapped_key(aes_key_wrap_with_padding(wrapping_material, material),
                                       unwrapping=wrapping, mechanism=AES_KWP, kek_id=kek)


def test_an_aes_key_wrapped_under_an_rsa_public_key_is_unwrapped_by_its_sealed_private_key(
        hsm_backend: Pkcs11Backend, kek: str) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sealed = seal(hsm_backend, private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()), kek_id=kek)
    key = SealedPrivateKey(dek=sealed.dek, material=sealed.material)
    material = os.urandom(32)
    sha1 = padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)  # noqa: S303
    blob = private.public_key().encrypt(material, sha1)
    imported = hsm_backend.import_wrapped_key(blob, unwrapping=key, mechanism=RSA_OAEP_SHA1, kek_id=kek)
    assert imported.length_bits == 256 and hsm_backend.unwrap_key(imported.wrapped) == material
    with pytest.raises(HsmIntegrityError):
        hsm_backend.import_wrapped_key(os.urandom(256), unwrapping=key, mechanism=RSA_OAEP_SHA1, kek_id=kek)
    supported = hsm_backend.capabilities.rsa_unwrap_mechanisms or {hsm_backend.capabilities.rsa_wrap_mechanism}
    if RSA_OAEP_SHA256 not in supported:  # SoftHSM2 2.6 (decision 0001): said so, not tried
        with pytest.raises(HsmInvalidInput, match="unwraps with"):
            hsm_backend.import_wrapped_key(blob, unwrapping=key, mechanism=RSA_OAEP_SHA256, kek_id=kek)
    with pytest.raises(HsmInvalidInput):
        hsm_backend.import_wrapped_key(blob, unwrapping=key, mechanism=AES_KWP, kek_id=kek)
    with pytest.raises(HsmInvalidInput):
        hsm_backend.import_wrapped_key(blob, unwrapping=key, mechanism="AES-ECB", kek_id=kek)
    # the private key still signs afterwards (the unwrap-only handle was its own)
    assert hsm_backend.private_key_sign(key, b"x", scheme="RSA-PSS", hash="SHA-256")
