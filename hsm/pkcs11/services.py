"""Cryptographic services under managed keys: data keys, AES modes, HMAC keys."""

from __future__ import annotations

import os
from typing import Any, Final

import pkcs11
from pkcs11 import Attribute, KeyType, Mechanism

from hsm import mechanisms
from hsm.backend import AES_CBC_PAD, AES_GCM, CipherResult, WrappedKey
from hsm.errors import HsmIntegrityError, HsmInvalidInput
from hsm.handles import AesKeyView, HmacKeyView
from hsm.pkcs11.common import INTEGRITY_MESSAGE, Lease, destroy_quietly, integrity_error, invalid_input, refused
from hsm.pkcs11.core import Pkcs11Core

_MAX_RANDOM_BYTES: Final = 1 << 20


class CryptoServices(Pkcs11Core):
    """Encryption, decryption and MACs through cached session handles of unwrapped keys."""

    def encrypt_with(self, wrapped: WrappedKey, plaintext: bytes, *, aad: bytes) -> bytes:
        self._require(self._capabilities.supports_aes_gcm, "CKM_AES_GCM")
        scheme = self._unwrap_scheme(wrapped)
        data, associated = bytes(plaintext), bytes(aad)

        def encrypt(lease: Lease) -> bytes:
            # A fresh IV per attempt: a retry must never reuse one.
            iv = os.urandom(mechanisms.GCM_IV_BYTES)
            params = pkcs11.GCMParams(iv, associated or None, mechanisms.GCM_TAG_BITS)
            with self._working_key(lease, wrapped, scheme) as handle:
                sealed = AesKeyView(lease.session, handle).encrypt(
                    data, mechanism=Mechanism.AES_GCM, mechanism_param=params
                )
            return iv + bytes(sealed)

        return self._run("encrypt_with", encrypt, on_crypto=invalid_input)

    def decrypt_with(self, wrapped: WrappedKey, ciphertext: bytes, *, aad: bytes) -> bytes:
        self._require(self._capabilities.supports_aes_gcm, "CKM_AES_GCM")
        scheme = self._unwrap_scheme(wrapped)
        sealed = bytes(ciphertext)
        if len(sealed) < mechanisms.GCM_IV_BYTES + mechanisms.GCM_TAG_BYTES:
            raise HsmIntegrityError(INTEGRITY_MESSAGE)
        iv, body = sealed[: mechanisms.GCM_IV_BYTES], sealed[mechanisms.GCM_IV_BYTES :]
        associated = bytes(aad)

        def decrypt(lease: Lease) -> bytes:
            params = pkcs11.GCMParams(iv, associated or None, mechanisms.GCM_TAG_BITS)
            with self._working_key(lease, wrapped, scheme) as handle:
                return bytes(
                    AesKeyView(lease.session, handle).decrypt(
                        body, mechanism=Mechanism.AES_GCM, mechanism_param=params
                    )
                )

        return self._run("decrypt_with", decrypt, on_crypto=integrity_error)

    def random(self, n: int) -> bytes:
        if not 0 <= n <= _MAX_RANDOM_BYTES:
            raise HsmInvalidInput(f"random: n must be between 0 and {_MAX_RANDOM_BYTES}, got {n}")
        if n == 0:
            return b""
        return self._run("random", lambda lease: bytes(lease.session.generate_random(n * 8)))

    # --- HsmBackend: cryptographic services ------------------------------------------
    def symmetric_cipher(
        self, wrapped: WrappedKey, data: bytes, *, encrypt: bool, mode: str, iv: bytes | None = None,
        aad: bytes = b"", tag: bytes = b"", tag_bytes: int = mechanisms.GCM_TAG_BYTES,
    ) -> CipherResult:
        if mode not in (AES_GCM, AES_CBC_PAD):
            raise HsmInvalidInput(f"unknown AES mode {mode!r}; expected {AES_GCM} or {AES_CBC_PAD}")
        gcm = mode == AES_GCM
        if gcm:
            self._require(self._capabilities.supports_aes_gcm, "CKM_AES_GCM")
            if not 12 <= tag_bytes <= 16:
                raise HsmInvalidInput("a GCM tag is 12 to 16 bytes long")
        if iv is None and not encrypt:
            raise HsmInvalidInput("decryption needs the IV the data was encrypted with")
        if iv is not None and (len(iv) != 16 if not gcm else not 1 <= len(iv) <= 128):
            raise HsmInvalidInput("the IV is 16 bytes for CBC and 1 to 128 bytes (12 recommended) for GCM")
        if gcm and not encrypt and len(tag) != tag_bytes:
            raise HsmIntegrityError(INTEGRITY_MESSAGE)
        scheme = self._unwrap_scheme(wrapped)
        body, associated = bytes(data), bytes(aad)

        def run(lease: Lease) -> CipherResult:
            # A fresh IV per attempt unless the caller chose one: a retry never reuses ours.
            used = bytes(iv) if iv is not None else os.urandom(mechanisms.GCM_IV_BYTES if gcm else 16)
            param: Any
            if gcm:
                mechanism, param = Mechanism.AES_GCM, pkcs11.GCMParams(used, associated or None, tag_bytes * 8)
            else:
                mechanism, param = Mechanism.AES_CBC_PAD, used
            with self._working_key(lease, wrapped, scheme) as handle:
                view = AesKeyView(lease.session, handle)
                if encrypt:
                    out = bytes(view.encrypt(body, mechanism=mechanism, mechanism_param=param))
                    if gcm:
                        return CipherResult(data=out[:-tag_bytes], iv=used, tag=out[-tag_bytes:])
                    return CipherResult(data=out, iv=used)
                return CipherResult(data=bytes(view.decrypt(body + bytes(tag) if gcm else body,
                                                            mechanism=mechanism, mechanism_param=param)), iv=used)

        return self._run("symmetric_cipher", run, on_crypto=invalid_input if encrypt else integrity_error)

    def generate_wrapped_secret(self, *, kek_id: str, bits: int) -> WrappedKey:
        if bits not in mechanisms.HMAC_BITS:
            raise HsmInvalidInput(f"HMAC keys are {', '.join(map(str, sorted(mechanisms.HMAC_BITS)))} bits long")
        scheme = self._wrap_scheme

        def generate(lease: Lease) -> WrappedKey:
            session = lease.session
            kek = self._kek(session, kek_id)
            key = session.generate_key(KeyType.GENERIC_SECRET, bits, capabilities=0,
                                       mechanism=Mechanism.GENERIC_SECRET_KEY_GEN,
                                       template=dict(mechanisms.HMAC_TRANSIT_TEMPLATE))
            try:
                blob = self._wrap(session, kek.public_handle, key, scheme)
            finally:
                destroy_quietly(key)
            return WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=blob)

        return self._run("generate_wrapped_secret", generate, on_crypto=refused)

    def import_secret(self, material: bytes, *, kek_id: str) -> WrappedKey:
        if not isinstance(material, bytes | bytearray) or len(material) not in mechanisms.HMAC_IMPORT_BYTES:
            raise HsmInvalidInput("HMAC key material is 16 to 128 bytes long")
        scheme = self._wrap_scheme
        kek = self._run("import_secret", lambda lease: self._kek(lease.session, kek_id))
        blob = kek.public_key.encrypt(bytes(material), scheme.software_padding())
        return WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=blob)

    def unwrap_secret(self, wrapped: WrappedKey) -> bytes:
        scheme = self._unwrap_scheme(wrapped)
        template = {**mechanisms.EXPORT_KEY_TEMPLATE, Attribute.KEY_TYPE: KeyType.GENERIC_SECRET}

        def unwrap(lease: Lease) -> bytes:
            session = lease.session
            kek = self._kek(session, wrapped.wrapping_key_id)
            key = self._unwrap(session, kek, wrapped, scheme, template, KeyType.GENERIC_SECRET)
            try:
                return bytes(key[Attribute.VALUE])
            finally:
                destroy_quietly(key)

        return self._run("unwrap_secret", unwrap, on_crypto=integrity_error)

    def hmac(self, wrapped: WrappedKey, data: bytes, *, hash: str) -> bytes:
        mechanism = mechanisms.HMAC_MECHANISMS.get(hash)
        if mechanism is None:
            raise HsmInvalidInput(f"HMAC is computed with {', '.join(mechanisms.HMAC_MECHANISMS)}, not {hash!r}")
        scheme = self._unwrap_scheme(wrapped)
        message = bytes(data)

        def sign(lease: Lease) -> bytes:
            with self._working_key(lease, wrapped, scheme, hmac=True) as handle:
                return bytes(HmacKeyView(lease.session, handle).sign(message, mechanism=mechanism))

        return self._run("hmac", sign, on_crypto=integrity_error)

