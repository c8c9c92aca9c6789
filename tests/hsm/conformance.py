"""Conformance suite for `hsm.backend.HsmBackend`: every backend must pass all of it.

Backend-agnostic: it only uses the protocol (and `cryptography` as the independent
party). Run it against a backend by defining a `backend` fixture and importing it:

    from tests.hsm.conformance import *  # noqa: F403

Each test module that imports it gets its own `kek` (module scope), so KEK creation
(slow on a real token) is paid once per module, not per test.
"""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hsm.backend import (
    RSA_OAEP_SHA1,
    RSA_OAEP_SHA256,
    HsmBackend,
    KekInfo,
    WrappedKey,
)
from hsm.errors import HsmIntegrityError, HsmInvalidInput, HsmKeyNotFound

_OAEP_HASHES = {RSA_OAEP_SHA1: hashes.SHA1, RSA_OAEP_SHA256: hashes.SHA256}


def oaep_padding(mechanism: str) -> padding.OAEP:
    """The `cryptography` padding for a stored mechanism name (the independent side)."""
    algorithm = _OAEP_HASHES[mechanism]
    return padding.OAEP(mgf=padding.MGF1(algorithm()), algorithm=algorithm(), label=None)


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _flip(data: bytes, index: int) -> bytes:
    mutable = bytearray(data)
    mutable[index] ^= 0x01
    return bytes(mutable)


@pytest.fixture(scope="module")
def kek(backend: HsmBackend) -> str:
    return backend.create_kek(_new_id("conf-kek")).kek_id


@pytest.fixture(scope="module")
def other_kek(backend: HsmBackend) -> str:
    return backend.create_kek(_new_id("conf-kek2")).kek_id


@pytest.fixture(scope="module")
def wrapped(backend: HsmBackend, kek: str) -> WrappedKey:
    return backend.generate_wrapped_key(kek_id=kek)


@pytest.fixture(scope="module")
def recipient() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _der(key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


# --- capabilities and health ----------------------------------------------------------
def test_is_an_hsm_backend(backend: HsmBackend) -> None:
    assert isinstance(backend, HsmBackend)


def test_capabilities_name_known_mechanisms(backend: HsmBackend) -> None:
    capabilities = backend.capabilities
    assert capabilities.rsa_wrap_mechanism in _OAEP_HASHES
    assert capabilities.supports_aes_gcm
    assert capabilities.supports_hmac_sha256
    if capabilities.rsa_unwrap_mechanisms:
        assert capabilities.rsa_wrap_mechanism in capabilities.rsa_unwrap_mechanisms


def test_check_passes_on_a_healthy_token(backend: HsmBackend) -> None:
    backend.check()


# --- KEKs ---------------------------------------------------------------------------
def test_create_kek_returns_its_rsa_2048_public_key(backend: HsmBackend) -> None:
    kek_id = _new_id("conf-new")
    info = backend.create_kek(kek_id)
    assert info.kek_id == kek_id
    public = serialization.load_pem_public_key(info.public_key_pem)
    assert isinstance(public, rsa.RSAPublicKey)
    assert public.key_size == 2048
    assert public.public_numbers().e == 65537
    assert backend.get_kek(kek_id) == info
    assert info in backend.list_keks()


def test_list_keks_is_sorted_and_complete(backend: HsmBackend, kek: str, other_kek: str) -> None:
    listed = backend.list_keks()
    ids = [info.kek_id for info in listed]
    assert ids == sorted(ids)
    assert {kek, other_kek} <= set(ids)
    assert all(isinstance(info, KekInfo) for info in listed)


def test_duplicate_kek_is_refused(backend: HsmBackend, kek: str) -> None:
    before = backend.get_kek(kek)
    with pytest.raises(HsmInvalidInput):
        backend.create_kek(kek)
    assert backend.get_kek(kek) == before


def test_unknown_kek_is_not_found(backend: HsmBackend) -> None:
    missing = _new_id("missing")
    with pytest.raises(HsmKeyNotFound):
        backend.get_kek(missing)
    with pytest.raises(HsmKeyNotFound):
        backend.describe_kek(missing)
    with pytest.raises(HsmKeyNotFound):
        backend.generate_wrapped_key(kek_id=missing)
    with pytest.raises(HsmKeyNotFound):
        backend.import_key(bytes(32), kek_id=missing)
    assert missing not in {info.kek_id for info in backend.list_keks()}


@pytest.mark.parametrize("bad_id", ["", " padded", "padded ", "new\nline", "x" * 129])
def test_malformed_kek_id_is_invalid_input(backend: HsmBackend, bad_id: str) -> None:
    with pytest.raises(HsmInvalidInput):
        backend.create_kek(bad_id)


def test_kek_private_half_is_locked_down(backend: HsmBackend, kek: str) -> None:
    attributes = backend.describe_kek(kek)
    assert attributes.modulus_bits == 2048
    assert attributes.private_sensitive
    assert attributes.private_always_sensitive
    assert not attributes.private_extractable
    assert attributes.private_never_extractable
    assert attributes.private_unwrap
    assert not attributes.private_decrypt
    assert not attributes.private_sign
    assert attributes.public_wrap
    assert attributes.public_encrypt


# --- generate / import / unwrap -----------------------------------------------------
def test_generated_key_is_wrapped_under_the_kek(
    backend: HsmBackend, kek: str, wrapped: WrappedKey
) -> None:
    assert wrapped.wrapping_key_id == kek
    assert wrapped.mechanism == backend.capabilities.rsa_wrap_mechanism
    assert len(wrapped.ciphertext) == 256
    assert len(backend.unwrap_key(wrapped)) == 32


def test_generated_keys_differ(backend: HsmBackend, kek: str) -> None:
    first = backend.generate_wrapped_key(kek_id=kek)
    second = backend.generate_wrapped_key(kek_id=kek)
    assert first.ciphertext != second.ciphertext
    assert backend.unwrap_key(first) != backend.unwrap_key(second)


def test_generated_key_unwraps_with_the_kek_public_key_scheme(
    backend: HsmBackend, kek: str, wrapped: WrappedKey
) -> None:
    # Independent check of the stored format: the blob is OAEP under the KEK public key
    # with the recorded mechanism, i.e. the same length as the modulus and not raw.
    public = serialization.load_pem_public_key(backend.get_kek(kek).public_key_pem)
    assert isinstance(public, rsa.RSAPublicKey)
    assert len(wrapped.ciphertext) * 8 == public.key_size


@pytest.mark.parametrize("size", [16, 24, 32])
def test_import_then_unwrap_round_trips(backend: HsmBackend, kek: str, size: int) -> None:
    material = bytes(range(size))
    imported = backend.import_key(material, kek_id=kek)
    assert imported.wrapping_key_id == kek
    assert imported.mechanism == backend.capabilities.rsa_wrap_mechanism
    assert backend.unwrap_key(imported) == material


@pytest.mark.parametrize("size", [0, 1, 15, 17, 31, 33, 64])
def test_import_refuses_bad_lengths(backend: HsmBackend, kek: str, size: int) -> None:
    with pytest.raises(HsmInvalidInput) as caught:
        backend.import_key(b"\xa5" * size, kek_id=kek)
    assert "a5a5" not in str(caught.value).lower()


def test_unwrap_refuses_tampered_blobs(backend: HsmBackend, wrapped: WrappedKey) -> None:
    blob = wrapped.ciphertext
    for tampered in (
        _flip(blob, 0),
        _flip(blob, len(blob) // 2),
        _flip(blob, len(blob) - 1),
        blob[:-1],
        blob + b"\x00",
        b"",
    ):
        with pytest.raises(HsmIntegrityError):
            backend.unwrap_key(WrappedKey(wrapped.wrapping_key_id, wrapped.mechanism, tampered))


def test_unwrap_under_the_wrong_kek_is_an_integrity_error(
    backend: HsmBackend, wrapped: WrappedKey, other_kek: str
) -> None:
    with pytest.raises(HsmIntegrityError):
        backend.unwrap_key(WrappedKey(other_kek, wrapped.mechanism, wrapped.ciphertext))


def test_unwrap_with_unknown_kek_or_mechanism(backend: HsmBackend, wrapped: WrappedKey) -> None:
    with pytest.raises(HsmKeyNotFound):
        backend.unwrap_key(WrappedKey(_new_id("missing"), wrapped.mechanism, wrapped.ciphertext))
    with pytest.raises(HsmInvalidInput):
        backend.unwrap_key(WrappedKey(wrapped.wrapping_key_id, "ROT13", wrapped.ciphertext))


def test_integrity_errors_are_opaque(backend: HsmBackend, wrapped: WrappedKey) -> None:
    messages = set()
    for tampered in (_flip(wrapped.ciphertext, 3), wrapped.ciphertext[:100]):
        with pytest.raises(HsmIntegrityError) as caught:
            backend.unwrap_key(WrappedKey(wrapped.wrapping_key_id, wrapped.mechanism, tampered))
        messages.add(str(caught.value))
        assert caught.value.__cause__ is None
    assert len(messages) == 1


# --- re-wrapping ----------------------------------------------------------------------
def test_rewrap_under_kek_keeps_the_key(
    backend: HsmBackend, wrapped: WrappedKey, other_kek: str
) -> None:
    rewrapped = backend.rewrap_under_kek(wrapped, kek_id=other_kek)
    assert rewrapped.wrapping_key_id == other_kek
    assert rewrapped.mechanism == backend.capabilities.rsa_wrap_mechanism
    assert rewrapped.ciphertext != wrapped.ciphertext
    assert backend.unwrap_key(rewrapped) == backend.unwrap_key(wrapped)


def test_rewrap_under_kek_unhappy_paths(backend: HsmBackend, wrapped: WrappedKey) -> None:
    with pytest.raises(HsmKeyNotFound):
        backend.rewrap_under_kek(wrapped, kek_id=_new_id("missing"))
    tampered = WrappedKey(wrapped.wrapping_key_id, wrapped.mechanism, _flip(wrapped.ciphertext, 9))
    with pytest.raises(HsmIntegrityError):
        backend.rewrap_under_kek(tampered, kek_id=wrapped.wrapping_key_id)


def test_rewrap_under_kek_moves_hmac_keys_of_any_length(backend: HsmBackend, kek: str, other_kek: str) -> None:
    for size in (16, 48, 128):
        material = os.urandom(size)
        moved = backend.rewrap_under_kek(backend.import_secret(material, kek_id=kek), kek_id=other_kek)
        assert moved.wrapping_key_id == other_kek
        assert backend.unwrap_secret(moved) == material


def test_destroy_kek_removes_it_for_good(backend: HsmBackend, other_kek: str) -> None:
    doomed = backend.create_kek(_new_id("conf-doomed")).kek_id
    old = backend.generate_wrapped_key(kek_id=doomed)
    backend.encrypt_with(old, b"cached", aad=b"")  # an unwrapped handle in the cache
    moved = backend.rewrap_under_kek(old, kek_id=other_kek)
    backend.destroy_kek(doomed)
    assert doomed not in {info.kek_id for info in backend.list_keks()}
    for use in (lambda: backend.get_kek(doomed), lambda: backend.unwrap_key(old),
                lambda: backend.encrypt_with(old, b"x", aad=b""), lambda: backend.generate_wrapped_key(kek_id=doomed),
                lambda: backend.destroy_kek(doomed)):
        with pytest.raises(HsmKeyNotFound):
            use()
    sealed = backend.encrypt_with(moved, b"still here", aad=b"a")
    assert backend.decrypt_with(moved, sealed, aad=b"a") == b"still here"


def test_rewrap_for_public_key_reaches_the_recipient(
    backend: HsmBackend, wrapped: WrappedKey, recipient: rsa.RSAPrivateKey
) -> None:
    der = _der(recipient.public_key())
    delivered = backend.rewrap_for_public_key(wrapped, public_key_der=der)
    assert delivered.wrapping_key_id == hashlib.sha256(der).hexdigest()
    assert delivered.mechanism == backend.capabilities.rsa_wrap_mechanism
    plaintext = recipient.decrypt(delivered.ciphertext, oaep_padding(delivered.mechanism))
    assert plaintext == backend.unwrap_key(wrapped)


def test_rewrap_for_a_4096_bit_recipient(backend: HsmBackend, wrapped: WrappedKey) -> None:
    big = rsa.generate_private_key(public_exponent=65537, key_size=4096)
    delivered = backend.rewrap_for_public_key(wrapped, public_key_der=_der(big.public_key()))
    assert len(delivered.ciphertext) == 512
    assert big.decrypt(delivered.ciphertext, oaep_padding(delivered.mechanism)) == backend.unwrap_key(
        wrapped
    )


def test_rewrap_for_public_key_refuses_unusable_keys(
    backend: HsmBackend, wrapped: WrappedKey
) -> None:
    short = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505
    short_public = short.public_key()
    curve = ec.generate_private_key(ec.SECP256R1()).public_key()
    for der in (_der(short_public), _der(curve), b"", b"\x30\x03\x02\x01\x01", b"not DER at all"):
        with pytest.raises(HsmInvalidInput):
            backend.rewrap_for_public_key(wrapped, public_key_der=der)


def test_rewrap_for_public_key_with_a_tampered_blob(
    backend: HsmBackend, wrapped: WrappedKey, recipient: rsa.RSAPrivateKey
) -> None:
    tampered = WrappedKey(wrapped.wrapping_key_id, wrapped.mechanism, _flip(wrapped.ciphertext, 7))
    with pytest.raises(HsmIntegrityError):
        backend.rewrap_for_public_key(tampered, public_key_der=_der(recipient.public_key()))


# --- data keys ------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 16, 4096, 1 << 20])
def test_encrypt_decrypt_round_trip(backend: HsmBackend, wrapped: WrappedKey, size: int) -> None:
    plaintext = bytes(i % 251 for i in range(size))
    sealed = backend.encrypt_with(wrapped, plaintext, aad=b"context")
    assert len(sealed) == 12 + size + 16
    assert backend.decrypt_with(wrapped, sealed, aad=b"context") == plaintext


def test_encrypt_uses_a_fresh_iv(backend: HsmBackend, wrapped: WrappedKey) -> None:
    sealed = {backend.encrypt_with(wrapped, b"same", aad=b"") for _ in range(16)}
    assert len(sealed) == 16
    assert len({item[:12] for item in sealed}) == 16


def test_encrypt_format_is_iv_ciphertext_tag(backend: HsmBackend, wrapped: WrappedKey) -> None:
    # Known-answer style interop: an independent AES-GCM implementation opens it.
    key = backend.unwrap_key(wrapped)
    sealed = backend.encrypt_with(wrapped, b"interop", aad=b"aad")
    assert AESGCM(key).decrypt(sealed[:12], sealed[12:], b"aad") == b"interop"
    iv = bytes(12)
    foreign = iv + AESGCM(key).encrypt(iv, b"from outside", b"x")
    assert backend.decrypt_with(wrapped, foreign, aad=b"x") == b"from outside"


def test_empty_aad_equals_no_aad(backend: HsmBackend, wrapped: WrappedKey) -> None:
    key = backend.unwrap_key(wrapped)
    sealed = backend.encrypt_with(wrapped, b"payload", aad=b"")
    assert AESGCM(key).decrypt(sealed[:12], sealed[12:], None) == b"payload"


def test_decrypt_refuses_wrong_aad(backend: HsmBackend, wrapped: WrappedKey) -> None:
    sealed = backend.encrypt_with(wrapped, b"secret", aad=b"file-1:chunk-0")
    for aad in (b"file-1:chunk-1", b"", b"file-1:chunk-0\x00"):
        with pytest.raises(HsmIntegrityError):
            backend.decrypt_with(wrapped, sealed, aad=aad)


def test_decrypt_refuses_tampering(backend: HsmBackend, wrapped: WrappedKey) -> None:
    sealed = backend.encrypt_with(wrapped, b"some plaintext", aad=b"a")
    for tampered in (
        _flip(sealed, 0),  # IV
        _flip(sealed, 14),  # ciphertext
        _flip(sealed, len(sealed) - 1),  # tag
        sealed[:-1],
        sealed[:27],
        b"",
    ):
        with pytest.raises(HsmIntegrityError):
            backend.decrypt_with(wrapped, tampered, aad=b"a")


def test_decrypt_under_another_key_fails(backend: HsmBackend, kek: str, wrapped: WrappedKey) -> None:
    other = backend.generate_wrapped_key(kek_id=kek)
    sealed = backend.encrypt_with(wrapped, b"for the first key", aad=b"")
    with pytest.raises(HsmIntegrityError):
        backend.decrypt_with(other, sealed, aad=b"")


def test_data_key_ops_with_a_bad_wrapped_key(backend: HsmBackend, wrapped: WrappedKey) -> None:
    tampered = WrappedKey(wrapped.wrapping_key_id, wrapped.mechanism, _flip(wrapped.ciphertext, 1))
    with pytest.raises(HsmIntegrityError):
        backend.encrypt_with(tampered, b"x", aad=b"")
    with pytest.raises(HsmIntegrityError):
        backend.decrypt_with(tampered, bytes(40), aad=b"")
    with pytest.raises(HsmKeyNotFound):
        backend.encrypt_with(
            WrappedKey(_new_id("missing"), wrapped.mechanism, wrapped.ciphertext), b"x", aad=b""
        )


# --- AES key wrap (added for KMIP Get wrapped under a symmetric key) ---------------------
@pytest.mark.parametrize("size", [16, 24, 32])
def test_wrap_with_key_is_rfc5649(backend: HsmBackend, kek: str, size: int) -> None:
    """`cryptography`'s RFC 5649 implementation is the independent party."""
    from cryptography.hazmat.primitives.keywrap import aes_key_unwrap_with_padding

    material, kek_bytes = os.urandom(size), os.urandom(32)
    target = backend.import_key(material, kek_id=kek)
    wrapping = backend.import_key(kek_bytes, kek_id=kek)
    blob = backend.wrap_with_key(target, wrapping=wrapping)
    assert material not in blob
    assert aes_key_unwrap_with_padding(kek_bytes, blob) == material


def test_wrap_with_key_under_a_generated_key(backend: HsmBackend, kek: str, wrapped: WrappedKey) -> None:
    from cryptography.hazmat.primitives.keywrap import aes_key_unwrap_with_padding

    wrapping = backend.generate_wrapped_key(kek_id=kek)
    blob = backend.wrap_with_key(wrapped, wrapping=wrapping)
    assert aes_key_unwrap_with_padding(backend.unwrap_key(wrapping), blob) == backend.unwrap_key(wrapped)


def test_wrap_with_key_refuses_tampered_blobs(backend: HsmBackend, wrapped: WrappedKey) -> None:
    bad = WrappedKey(wrapped.wrapping_key_id, wrapped.mechanism,
                     wrapped.ciphertext[:-1] + bytes([wrapped.ciphertext[-1] ^ 1]))
    with pytest.raises(HsmIntegrityError):
        backend.wrap_with_key(wrapped, wrapping=bad)
    with pytest.raises(HsmIntegrityError):
        backend.wrap_with_key(bad, wrapping=wrapped)


def test_forget_drops_only_the_cached_handle(backend: HsmBackend, kek: str) -> None:
    key = backend.generate_wrapped_key(kek_id=kek)
    sealed = backend.encrypt_with(key, b"before", aad=b"")
    backend.forget(key)
    backend.forget(key)  # idempotent
    assert backend.decrypt_with(key, sealed, aad=b"") == b"before"
    backend.forget(WrappedKey("never-seen", key.mechanism, b"\x00" * 256))


# --- randomness and HMAC --------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 32, 1000])
def test_random_has_the_requested_length(backend: HsmBackend, n: int) -> None:
    assert len(backend.random(n)) == n


def test_random_is_not_repeating(backend: HsmBackend) -> None:
    assert len({backend.random(16) for _ in range(32)}) == 32


def test_random_refuses_negative(backend: HsmBackend) -> None:
    with pytest.raises(HsmInvalidInput):
        backend.random(-1)


def test_hmac_key_is_created_once_and_is_deterministic(backend: HsmBackend) -> None:
    key_id = _new_id("audit")
    backend.ensure_hmac_key(key_id)
    first = backend.hmac_sha256(b"record 1", key_id=key_id)
    backend.ensure_hmac_key(key_id)  # idempotent: same key, same MAC
    assert backend.hmac_sha256(b"record 1", key_id=key_id) == first
    assert len(first) == 32
    assert backend.hmac_sha256(b"record 2", key_id=key_id) != first


def test_hmac_keys_are_distinct(backend: HsmBackend) -> None:
    one, two = _new_id("audit"), _new_id("audit")
    backend.ensure_hmac_key(one)
    backend.ensure_hmac_key(two)
    assert backend.hmac_sha256(b"x", key_id=one) != backend.hmac_sha256(b"x", key_id=two)


def test_signing_key_is_created_once_and_its_signatures_verify_outside(backend: HsmBackend) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key_id = _new_id("checkpoint")
    public_der = backend.ensure_signing_key(key_id)
    assert backend.ensure_signing_key(key_id) == public_der  # idempotent: the same key
    public = serialization.load_der_public_key(public_der)
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    signature = backend.sign_p256(b"checkpoint 1", key_id=key_id)
    public.verify(signature, b"checkpoint 1", ec.ECDSA(hashes.SHA256()))  # no token needed to verify
    with pytest.raises(InvalidSignature):
        public.verify(signature, b"checkpoint 2", ec.ECDSA(hashes.SHA256()))
    assert backend.ensure_signing_key(_new_id("checkpoint")) != public_der
    with pytest.raises(HsmKeyNotFound):
        backend.sign_p256(b"x", key_id=_new_id("absent"))


def test_hmac_with_missing_key(backend: HsmBackend) -> None:
    with pytest.raises(HsmKeyNotFound):
        backend.hmac_sha256(b"x", key_id=_new_id("absent"))


# What `import *` brings into a backend's test module: the fixtures and every test.
__all__ = [
    "kek",
    "other_kek",
    "recipient",
    "wrapped",
    *sorted(name for name in list(globals()) if name.startswith("test_")),
]
