"""AES key versions wrapped under a KEK: generation, import, export, re-wrapping."""

from __future__ import annotations

import hashlib

from pkcs11 import Attribute, KeyType, Mechanism

from hsm import mechanisms
from hsm.backend import WrappedKey
from hsm.errors import HsmIntegrityError, HsmInvalidInput
from hsm.pkcs11.common import (
    AES_WRAPPING_TEMPLATE,
    INTEGRITY_MESSAGE,
    AesWrapView,
    Lease,
    destroy_quietly,
    handle_cache_key,
    integrity_error,
    invalid_input,
    load_recipient_key,
    refused,
)
from hsm.pkcs11.core import Pkcs11Core


class WrappingOps(Pkcs11Core):
    """Managed key versions: only ever in the token as session objects, outside it wrapped."""

    def generate_wrapped_key(self, *, kek_id: str) -> WrappedKey:
        scheme = self._wrap_scheme

        def generate(lease: Lease) -> WrappedKey:
            session = lease.session
            kek = self._kek(session, kek_id)
            # A session object, never a token object: the token only ever keeps KEKs.
            key = session.generate_key(
                KeyType.AES,
                mechanisms.DATA_KEY_BITS,
                capabilities=0,
                template=dict(mechanisms.TRANSIT_KEY_TEMPLATE),
            )
            try:
                blob = self._wrap(session, kek.public_handle, key, scheme)
            finally:
                destroy_quietly(key)
            return WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=blob)

        return self._run("generate_wrapped_key", generate, on_crypto=refused)

    def import_key(self, material: bytes, *, kek_id: str) -> WrappedKey:
        if not isinstance(material, bytes | bytearray):
            raise HsmInvalidInput("key material must be bytes")
        if len(material) not in mechanisms.IMPORTABLE_KEY_SIZES:
            raise HsmInvalidInput(
                f"AES key material must be 16, 24 or 32 bytes long, got {len(material)}"
            )
        scheme = self._wrap_scheme
        kek = self._run("import_key", lambda lease: self._kek(lease.session, kek_id))
        # RSA-OAEP with the public half needs no secret, so it is done in software;
        # the token unwraps the result like one it wrapped itself (PLATFORM.md).
        blob = kek.public_key.encrypt(bytes(material), scheme.software_padding())
        return WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=blob)

    def unwrap_key(self, wrapped: WrappedKey) -> bytes:
        scheme = self._unwrap_scheme(wrapped)

        def unwrap(lease: Lease) -> bytes:
            session = lease.session
            kek = self._kek(session, wrapped.wrapping_key_id)
            key = self._unwrap(session, kek, wrapped, scheme, mechanisms.EXPORT_KEY_TEMPLATE)
            try:
                value = bytes(key[Attribute.VALUE])
            finally:
                destroy_quietly(key)
            if len(value) not in mechanisms.IMPORTABLE_KEY_SIZES:
                raise HsmIntegrityError(INTEGRITY_MESSAGE)
            return value

        return self._run("unwrap_key", unwrap, on_crypto=integrity_error)

    def rewrap_under_kek(self, wrapped: WrappedKey, *, kek_id: str) -> WrappedKey:
        source = self._unwrap_scheme(wrapped)
        target = self._wrap_scheme

        def rewrap(lease: Lease) -> WrappedKey:
            session = lease.session
            old = self._kek(session, wrapped.wrapping_key_id)
            new = self._kek(session, kek_id)
            # As a generic secret: the blob may hold an AES key or an HMAC key (any length),
            # and re-wrapping moves the bytes without caring which.
            key = self._unwrap(session, old, wrapped, source, mechanisms.HMAC_TRANSIT_TEMPLATE,
                               KeyType.GENERIC_SECRET)
            try:
                blob = self._wrap(session, new.public_handle, key, target)
            finally:
                destroy_quietly(key)
            return WrappedKey(wrapping_key_id=kek_id, mechanism=target.name, ciphertext=blob)

        return self._run("rewrap_under_kek", rewrap, on_crypto=refused)

    def rewrap_for_public_key(self, wrapped: WrappedKey, *, public_key_der: bytes) -> WrappedKey:
        recipient = load_recipient_key(public_key_der)
        numbers = recipient.public_numbers()
        recipient_id = hashlib.sha256(public_key_der).hexdigest()
        source = self._unwrap_scheme(wrapped)
        target = self._wrap_scheme

        def rewrap(lease: Lease) -> WrappedKey:
            session = lease.session
            kek = self._kek(session, wrapped.wrapping_key_id)
            with self._recipient_key(lease, recipient_id, numbers.n, numbers.e) as public_handle:
                key = self._unwrap(session, kek, wrapped, source, mechanisms.TRANSIT_KEY_TEMPLATE)
                try:
                    blob = self._wrap(session, public_handle, key, target)
                finally:
                    destroy_quietly(key)
            return WrappedKey(wrapping_key_id=recipient_id, mechanism=target.name, ciphertext=blob)

        return self._run("rewrap_for_public_key", rewrap, on_crypto=invalid_input)

    def wrap_with_key(self, wrapped: WrappedKey, *, wrapping: WrappedKey) -> bytes:
        self._require(self._capabilities.supports_aes_key_wrap_pad, "CKM_AES_KEY_WRAP_PAD")
        target_scheme = self._unwrap_scheme(wrapped)
        wrapping_scheme = self._unwrap_scheme(wrapping)

        def wrap(lease: Lease) -> bytes:
            session = lease.session
            target_kek = self._kek(session, wrapped.wrapping_key_id)
            wrapping_kek = self._kek(session, wrapping.wrapping_key_id)
            key = self._unwrap(session, target_kek, wrapped, target_scheme, mechanisms.TRANSIT_KEY_TEMPLATE)
            try:
                wrapper = self._unwrap(session, wrapping_kek, wrapping, wrapping_scheme, AES_WRAPPING_TEMPLATE)
                try:
                    return bytes(AesWrapView(session, wrapper.handle).wrap_key(
                        key, mechanism=Mechanism.AES_KEY_WRAP_PAD))
                finally:
                    destroy_quietly(wrapper)
            finally:
                destroy_quietly(key)

        return self._run("wrap_with_key", wrap, on_crypto=integrity_error)

    def forget(self, wrapped: WrappedKey) -> None:
        self._cache.forget(handle_cache_key(wrapped))

