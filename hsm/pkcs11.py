"""`HsmBackend` for any PKCS#11 module (SoftHSM2 by default).

Layers, bottom up: `hsm.cryptoki` (raw calls python-pkcs11 lacks), `hsm.module` (one
initialised module and one login per token, process-wide), `hsm.sessions` (a pool of
plain sessions), `hsm.handles` (cached unwrapped data keys), `hsm.capabilities` (token
quirks). This module is the policy on top: which templates and mechanisms each
operation uses, what a failure means, and when to re-open sessions and retry.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Any, Final, TypeVar

import pkcs11
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11 import exceptions as p11
from pkcs11.util.ec import encode_named_curve_parameters

from hsm import capabilities as caps
from hsm import cryptoki, faults, mechanisms
from hsm.backend import (
    AES_CBC_PAD,
    AES_GCM,
    AES_KWP,
    ECDSA,
    RSA_OAEP_SHA256,
    RSA_PKCS1V15,
    RSA_PSS,
    CipherResult,
    KekAttributes,
    KekInfo,
    SealedPrivateKey,
    TokenCapabilities,
    WrappedKey,
    WrappedKeyPair,
)
from hsm.config import HsmConfig
from hsm.errors import (
    HsmError,
    HsmIntegrityError,
    HsmInvalidInput,
    HsmKeyNotFound,
    HsmUnavailable,
)
from hsm.faults import Fault
from hsm.handles import (
    AesKeyView,
    AesUnwrapView,
    CacheKey,
    EcPrivateOpsView,
    HandleCache,
    HmacKeyView,
    RsaPrivateOpsView,
    RsaPrivateView,
    RsaPublicView,
    _SecretKey,
    _View,
    _WrapMixin,
)
from hsm.mechanisms import OaepScheme
from hsm.module import LoadedModule, current_epoch, load_module
from hsm.sessions import SessionPool

__all__ = ["Pkcs11Backend", "open_backend"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_MAX_ID_CHARS: Final = 128
_MAX_RANDOM_BYTES: Final = 1 << 20
_INTEGRITY_MESSAGE: Final = "wrapped key or ciphertext failed to unwrap or verify"
_USER_STATES: Final = (cryptoki.CKS_RW_USER_FUNCTIONS, cryptoki.CKS_RO_USER_FUNCTIONS)


@dataclass(frozen=True)
class _Kek:
    info: KekInfo
    public_handle: int
    private_handle: int
    public_key: rsa.RSAPublicKey


@dataclass(frozen=True)
class _Lease:
    """A borrowed session and the pool generation it belongs to."""

    session: Any
    generation: int


# What a CRYPTO fault (the token refused the data or the key) means, per operation.
def _integrity(_what: str, _name: str) -> HsmError:
    return HsmIntegrityError(_INTEGRITY_MESSAGE)


def _invalid(what: str, name: str) -> HsmError:
    return HsmInvalidInput(f"{what}: the token rejected the input ({name})")


def _refused(what: str, name: str) -> HsmError:
    return HsmUnavailable(f"{what}: the token refused the operation ({name})")


class _AesWrapView(_View, _WrapMixin, _SecretKey):  # type: ignore[misc]
    """An AES session key that may only wrap (wrap_with_key)."""

    key_type = KeyType.AES


# A session AES key whose one capability is wrapping; it never leaves the token.
_AES_WRAPPING_TEMPLATE: Final = {**mechanisms.TRANSIT_KEY_TEMPLATE, Attribute.EXTRACTABLE: False,
                                 Attribute.WRAP: True}


class Pkcs11Backend:
    """Thread-safe; one instance per process and token is the intended use.

    Build it with `open_backend`, which loads the module, bootstraps the token and
    logs in; the constructor expects all of that done.
    """

    def __init__(self, *, config: HsmConfig, module: LoadedModule, token: Any) -> None:
        self._config = config
        self._module = module
        self._token = token
        self._token_serial: bytes = token.serial
        self._label = config.token_label
        self._epoch = module.epoch
        self._closed = False
        self._state_lock = threading.Lock()
        self._recovery_lock = threading.Lock()
        self._create_lock = threading.Lock()
        self._pool = SessionPool(size=config.pool_size, open_session=self._opener(token))
        self._cache = HandleCache(
            max_entries=config.handle_cache_size,
            ttl_seconds=config.handle_cache_ttl_seconds,
            destroy=_destroy_quietly,
        )
        # Hosts' public keys as session objects: a host fetches many keys, and creating
        # and destroying the object on every delivery serialises in the token.
        self._recipients = HandleCache(
            max_entries=min(config.handle_cache_size, 1024),
            ttl_seconds=config.handle_cache_ttl_seconds,
            destroy=_destroy_quietly,
        )
        self._handles_lock = threading.Lock()
        self._keks: dict[str, _Kek] = {}
        self._hmac_keys: dict[str, int] = {}
        try:
            self._capabilities = self._detect_capabilities()
        except BaseException:
            self._pool.close()
            raise
        self._wrap_scheme = mechanisms.oaep_scheme(self._capabilities.rsa_wrap_mechanism)
        log.info(
            "HSM token %r ready: %s %s firmware %s, wrapping with %s",
            self._label, self._capabilities.manufacturer, self._capabilities.model,
            self._capabilities.firmware, self._capabilities.rsa_wrap_mechanism,
        )

    # --- HsmBackend: lifecycle ----------------------------------------------------
    @property
    def capabilities(self) -> TokenCapabilities:
        return self._capabilities

    def check(self) -> None:
        self._ensure_usable()
        try:
            token = self._module.find_token(self._label)
        except (p11.PKCS11Error, cryptoki.CryptokiError) as exc:
            raise HsmUnavailable(
                f"cannot enumerate tokens in module {self._config.module_path} "
                f"({faults.describe(exc)}): check that the HSM is reachable"
            ) from None
        if token is None:
            raise HsmUnavailable(
                f"token {self._label!r} not found in module {self._config.module_path}: "
                "check that the token is present, or run `keyserver init`"
            )
        if token.flags & pkcs11.TokenFlag.USER_PIN_LOCKED:
            raise HsmUnavailable(
                f"the user PIN of token {self._label!r} is locked: the security officer "
                "must reset it (C_InitPIN, e.g. with the vendor's tool)"
            )

        def probe(lease: _Lease) -> None:
            state = self._module.raw.session_state(lease.session.handle)
            if state not in _USER_STATES:
                # Reported as a lost login so that the runner logs in again once.
                raise cryptoki.CryptokiError("C_GetSessionInfo", cryptoki.CKR_USER_NOT_LOGGED_IN)
            lease.session.generate_random(64)

        self._run("check", probe, on_crypto=_refused)

    def close(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        # Destroy cached objects while their sessions are still open.
        self._cache.clear()
        self._recipients.clear()
        self._pool.close()
        try:
            self._module.logout(self._token_serial)
        except (p11.PKCS11Error, cryptoki.CryptokiError) as exc:
            log.debug("logout on close failed: %s", faults.describe(exc))

    # --- HsmBackend: key-encryption keys ------------------------------------------
    def create_kek(self, kek_id: str) -> KekInfo:
        _check_id(kek_id, what="KEK id")

        def create(lease: _Lease) -> KekInfo:
            session = lease.session
            if self._find(session, ObjectClass.PUBLIC_KEY, KeyType.RSA, kek_id) or self._find(
                session, ObjectClass.PRIVATE_KEY, KeyType.RSA, kek_id
            ):
                raise HsmInvalidInput(f"a KEK with id {kek_id!r} already exists")
            today = datetime.now(UTC).date()
            session.generate_keypair(
                KeyType.RSA,
                mechanisms.KEK_BITS,
                store=True,
                capabilities=0,
                public_template={
                    **mechanisms.kek_public_template(kek_id),
                    Attribute.START_DATE: today,
                },
                private_template={
                    **mechanisms.kek_private_template(kek_id),
                    Attribute.START_DATE: today,
                },
            )
            log.info("created KEK %r in token %r", kek_id, self._label)
            return self._kek(session, kek_id).info

        # Check-then-create must not interleave within the process.
        with self._create_lock:
            return self._run("create_kek", create, on_crypto=_refused)

    def get_kek(self, kek_id: str) -> KekInfo:
        _check_id(kek_id, what="KEK id")
        return self._run("get_kek", lambda lease: self._kek(lease.session, kek_id).info)

    def list_keks(self) -> list[KekInfo]:
        def list_all(lease: _Lease) -> list[KekInfo]:
            found = lease.session.get_objects(
                {
                    Attribute.CLASS: ObjectClass.PUBLIC_KEY,
                    Attribute.KEY_TYPE: KeyType.RSA,
                    Attribute.TOKEN: True,
                    Attribute.WRAP: True,
                }
            )
            ids = set()
            for obj in found:
                raw_id, label = obj[Attribute.ID], obj[Attribute.LABEL]
                # Ours are labelled with their id; other RSA keys on a shared token are not.
                if raw_id and raw_id == label.encode("utf-8"):
                    ids.add(label)
            keks = []
            for kek_id in sorted(ids):
                try:
                    keks.append(self._kek(lease.session, kek_id).info)
                except HsmKeyNotFound:
                    continue  # a public half without its private half is not a KEK
            return keks

        return self._run("list_keks", list_all)

    def describe_kek(self, kek_id: str) -> KekAttributes:
        _check_id(kek_id, what="KEK id")

        def describe(lease: _Lease) -> KekAttributes:
            session = lease.session
            public = self._find(session, ObjectClass.PUBLIC_KEY, KeyType.RSA, kek_id)
            private = self._find(session, ObjectClass.PRIVATE_KEY, KeyType.RSA, kek_id)
            if public is None or private is None:
                raise HsmKeyNotFound(f"KEK {kek_id!r} not found in token {self._label!r}")
            pub = public.get_attributes(
                [Attribute.MODULUS_BITS, Attribute.MODULUS, Attribute.WRAP, Attribute.ENCRYPT]
            )
            prv = private.get_attributes(
                [
                    Attribute.SENSITIVE,
                    Attribute.ALWAYS_SENSITIVE,
                    Attribute.EXTRACTABLE,
                    Attribute.NEVER_EXTRACTABLE,
                    Attribute.UNWRAP,
                    Attribute.DECRYPT,
                    Attribute.SIGN,
                ]
            )
            return KekAttributes(
                kek_id=kek_id,
                modulus_bits=int(pub.get(Attribute.MODULUS_BITS) or len(pub[Attribute.MODULUS]) * 8),
                private_sensitive=bool(prv[Attribute.SENSITIVE]),
                private_always_sensitive=bool(prv[Attribute.ALWAYS_SENSITIVE]),
                private_extractable=bool(prv[Attribute.EXTRACTABLE]),
                private_never_extractable=bool(prv[Attribute.NEVER_EXTRACTABLE]),
                private_unwrap=bool(prv[Attribute.UNWRAP]),
                private_decrypt=bool(prv[Attribute.DECRYPT]),
                private_sign=bool(prv[Attribute.SIGN]),
                public_wrap=bool(pub[Attribute.WRAP]),
                public_encrypt=bool(pub[Attribute.ENCRYPT]),
            )

        return self._run("describe_kek", describe)

    # --- HsmBackend: managed key versions -----------------------------------------
    def generate_wrapped_key(self, *, kek_id: str) -> WrappedKey:
        scheme = self._wrap_scheme

        def generate(lease: _Lease) -> WrappedKey:
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
                _destroy_quietly(key)
            return WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=blob)

        return self._run("generate_wrapped_key", generate, on_crypto=_refused)

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

        def unwrap(lease: _Lease) -> bytes:
            session = lease.session
            kek = self._kek(session, wrapped.wrapping_key_id)
            key = self._unwrap(session, kek, wrapped, scheme, mechanisms.EXPORT_KEY_TEMPLATE)
            try:
                value = bytes(key[Attribute.VALUE])
            finally:
                _destroy_quietly(key)
            if len(value) not in mechanisms.IMPORTABLE_KEY_SIZES:
                raise HsmIntegrityError(_INTEGRITY_MESSAGE)
            return value

        return self._run("unwrap_key", unwrap, on_crypto=_integrity)

    def rewrap_under_kek(self, wrapped: WrappedKey, *, kek_id: str) -> WrappedKey:
        source = self._unwrap_scheme(wrapped)
        target = self._wrap_scheme

        def rewrap(lease: _Lease) -> WrappedKey:
            session = lease.session
            old = self._kek(session, wrapped.wrapping_key_id)
            new = self._kek(session, kek_id)
            key = self._unwrap(session, old, wrapped, source, mechanisms.TRANSIT_KEY_TEMPLATE)
            try:
                blob = self._wrap(session, new.public_handle, key, target)
            finally:
                _destroy_quietly(key)
            return WrappedKey(wrapping_key_id=kek_id, mechanism=target.name, ciphertext=blob)

        return self._run("rewrap_under_kek", rewrap, on_crypto=_refused)

    def rewrap_for_public_key(self, wrapped: WrappedKey, *, public_key_der: bytes) -> WrappedKey:
        recipient = _load_recipient_key(public_key_der)
        numbers = recipient.public_numbers()
        recipient_id = hashlib.sha256(public_key_der).hexdigest()
        source = self._unwrap_scheme(wrapped)
        target = self._wrap_scheme

        def rewrap(lease: _Lease) -> WrappedKey:
            session = lease.session
            kek = self._kek(session, wrapped.wrapping_key_id)
            with self._recipient_key(lease, recipient_id, numbers.n, numbers.e) as public_handle:
                key = self._unwrap(session, kek, wrapped, source, mechanisms.TRANSIT_KEY_TEMPLATE)
                try:
                    blob = self._wrap(session, public_handle, key, target)
                finally:
                    _destroy_quietly(key)
            return WrappedKey(wrapping_key_id=recipient_id, mechanism=target.name, ciphertext=blob)

        return self._run("rewrap_for_public_key", rewrap, on_crypto=_invalid)

    def wrap_with_key(self, wrapped: WrappedKey, *, wrapping: WrappedKey) -> bytes:
        target_scheme = self._unwrap_scheme(wrapped)
        wrapping_scheme = self._unwrap_scheme(wrapping)

        def wrap(lease: _Lease) -> bytes:
            session = lease.session
            target_kek = self._kek(session, wrapped.wrapping_key_id)
            wrapping_kek = self._kek(session, wrapping.wrapping_key_id)
            key = self._unwrap(session, target_kek, wrapped, target_scheme, mechanisms.TRANSIT_KEY_TEMPLATE)
            try:
                wrapper = self._unwrap(session, wrapping_kek, wrapping, wrapping_scheme, _AES_WRAPPING_TEMPLATE)
                try:
                    return bytes(_AesWrapView(session, wrapper.handle).wrap_key(
                        key, mechanism=Mechanism.AES_KEY_WRAP_PAD))
                finally:
                    _destroy_quietly(wrapper)
            finally:
                _destroy_quietly(key)

        return self._run("wrap_with_key", wrap, on_crypto=_integrity)

    def generate_wrapped_rsa_pair(self, *, kek_id: str, bits: int) -> WrappedKeyPair:
        if bits not in mechanisms.CLIENT_RSA_BITS:
            raise HsmInvalidInput(f"RSA key pairs are {', '.join(map(str, sorted(mechanisms.CLIENT_RSA_BITS)))} "
                                  f"bits long, not {bits}")
        scheme = self._wrap_scheme

        def generate(lease: _Lease) -> WrappedKeyPair:
            session = lease.session
            kek = self._kek(session, kek_id)
            public_template, private_template = mechanisms.client_rsa_templates()
            public, private = session.generate_keypair(
                KeyType.RSA, bits, store=False, capabilities=0,
                public_template=public_template, private_template=private_template)
            try:
                dek = session.generate_key(KeyType.AES, mechanisms.DATA_KEY_BITS, capabilities=0,
                                           template=dict(mechanisms.PAIR_DEK_TEMPLATE))
                try:
                    wrapped_private = bytes(_AesWrapView(session, dek.handle).wrap_key(
                        private, mechanism=Mechanism.AES_KEY_WRAP_PAD))
                    dek_blob = self._wrap(session, kek.public_handle, dek, scheme)
                finally:
                    _destroy_quietly(dek)
                n = int.from_bytes(bytes(public[Attribute.MODULUS]), "big")
                e = int.from_bytes(bytes(public[Attribute.PUBLIC_EXPONENT]), "big")
            finally:
                _destroy_quietly(private)
                _destroy_quietly(public)
            der = rsa.RSAPublicNumbers(e, n).public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            return WrappedKeyPair(public_key_der=der,
                                  dek=WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=dek_blob),
                                  private_key=wrapped_private, mechanism=AES_KWP)

        return self._run("generate_wrapped_rsa_pair", generate, on_crypto=_refused)

    def generate_wrapped_ec_pair(self, *, kek_id: str, curve: str) -> WrappedKeyPair:
        if curve not in mechanisms.CLIENT_EC_CURVES:
            raise HsmInvalidInput(f"EC key pairs are on {', '.join(mechanisms.CLIENT_EC_CURVES)}, not {curve!r}")
        p11_name, curve_class, _ = mechanisms.CLIENT_EC_CURVES[curve]
        scheme = self._wrap_scheme

        def generate(lease: _Lease) -> WrappedKeyPair:
            session = lease.session
            kek = self._kek(session, kek_id)
            public_template, private_template = mechanisms.client_ec_templates()
            domain = session.create_domain_parameters(
                KeyType.EC, {Attribute.EC_PARAMS: encode_named_curve_parameters(p11_name)}, local=True)
            public, private = domain.generate_keypair(store=False, capabilities=0, public_template=public_template,
                                                      private_template=private_template)
            try:
                dek = session.generate_key(KeyType.AES, mechanisms.DATA_KEY_BITS, capabilities=0,
                                           template=dict(mechanisms.PAIR_DEK_TEMPLATE))
                try:
                    wrapped_private = bytes(_AesWrapView(session, dek.handle).wrap_key(
                        private, mechanism=Mechanism.AES_KEY_WRAP_PAD))
                    dek_blob = self._wrap(session, kek.public_handle, dek, scheme)
                finally:
                    _destroy_quietly(dek)
                point = _der_octet_string(bytes(public[Attribute.EC_POINT]))  # CKA_EC_POINT is DER-wrapped
            finally:
                _destroy_quietly(private)
                _destroy_quietly(public)
            der = ec.EllipticCurvePublicKey.from_encoded_point(curve_class(), point).public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            return WrappedKeyPair(public_key_der=der,
                                  dek=WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=dek_blob),
                                  private_key=wrapped_private, mechanism=AES_KWP)

        return self._run("generate_wrapped_ec_pair", generate, on_crypto=_refused)

    def forget(self, wrapped: WrappedKey) -> None:
        self._cache.forget(_cache_key(wrapped))

    # --- HsmBackend: data keys ------------------------------------------------------
    def encrypt_with(self, wrapped: WrappedKey, plaintext: bytes, *, aad: bytes) -> bytes:
        self._require(self._capabilities.supports_aes_gcm, "CKM_AES_GCM")
        scheme = self._unwrap_scheme(wrapped)
        data, associated = bytes(plaintext), bytes(aad)

        def encrypt(lease: _Lease) -> bytes:
            # A fresh IV per attempt: a retry must never reuse one.
            iv = os.urandom(mechanisms.GCM_IV_BYTES)
            params = pkcs11.GCMParams(iv, associated or None, mechanisms.GCM_TAG_BITS)
            with self._working_key(lease, wrapped, scheme) as handle:
                sealed = AesKeyView(lease.session, handle).encrypt(
                    data, mechanism=Mechanism.AES_GCM, mechanism_param=params
                )
            return iv + bytes(sealed)

        return self._run("encrypt_with", encrypt, on_crypto=_invalid)

    def decrypt_with(self, wrapped: WrappedKey, ciphertext: bytes, *, aad: bytes) -> bytes:
        self._require(self._capabilities.supports_aes_gcm, "CKM_AES_GCM")
        scheme = self._unwrap_scheme(wrapped)
        sealed = bytes(ciphertext)
        if len(sealed) < mechanisms.GCM_IV_BYTES + mechanisms.GCM_TAG_BYTES:
            raise HsmIntegrityError(_INTEGRITY_MESSAGE)
        iv, body = sealed[: mechanisms.GCM_IV_BYTES], sealed[mechanisms.GCM_IV_BYTES :]
        associated = bytes(aad)

        def decrypt(lease: _Lease) -> bytes:
            params = pkcs11.GCMParams(iv, associated or None, mechanisms.GCM_TAG_BITS)
            with self._working_key(lease, wrapped, scheme) as handle:
                return bytes(
                    AesKeyView(lease.session, handle).decrypt(
                        body, mechanism=Mechanism.AES_GCM, mechanism_param=params
                    )
                )

        return self._run("decrypt_with", decrypt, on_crypto=_integrity)

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
            raise HsmIntegrityError(_INTEGRITY_MESSAGE)
        scheme = self._unwrap_scheme(wrapped)
        body, associated = bytes(data), bytes(aad)

        def run(lease: _Lease) -> CipherResult:
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

        return self._run("symmetric_cipher", run, on_crypto=_invalid if encrypt else _integrity)

    def generate_wrapped_secret(self, *, kek_id: str, bits: int) -> WrappedKey:
        if bits not in mechanisms.HMAC_BITS:
            raise HsmInvalidInput(f"HMAC keys are {', '.join(map(str, sorted(mechanisms.HMAC_BITS)))} bits long")
        scheme = self._wrap_scheme

        def generate(lease: _Lease) -> WrappedKey:
            session = lease.session
            kek = self._kek(session, kek_id)
            key = session.generate_key(KeyType.GENERIC_SECRET, bits, capabilities=0,
                                       mechanism=Mechanism.GENERIC_SECRET_KEY_GEN,
                                       template=dict(mechanisms.HMAC_TRANSIT_TEMPLATE))
            try:
                blob = self._wrap(session, kek.public_handle, key, scheme)
            finally:
                _destroy_quietly(key)
            return WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=blob)

        return self._run("generate_wrapped_secret", generate, on_crypto=_refused)

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

        def unwrap(lease: _Lease) -> bytes:
            session = lease.session
            kek = self._kek(session, wrapped.wrapping_key_id)
            key = self._unwrap(session, kek, wrapped, scheme, template, KeyType.GENERIC_SECRET)
            try:
                return bytes(key[Attribute.VALUE])
            finally:
                _destroy_quietly(key)

        return self._run("unwrap_secret", unwrap, on_crypto=_integrity)

    def hmac(self, wrapped: WrappedKey, data: bytes, *, hash: str) -> bytes:
        mechanism = mechanisms.HMAC_MECHANISMS.get(hash)
        if mechanism is None:
            raise HsmInvalidInput(f"HMAC is computed with {', '.join(mechanisms.HMAC_MECHANISMS)}, not {hash!r}")
        scheme = self._unwrap_scheme(wrapped)
        message = bytes(data)

        def sign(lease: _Lease) -> bytes:
            with self._working_key(lease, wrapped, scheme, hmac=True) as handle:
                return bytes(HmacKeyView(lease.session, handle).sign(message, mechanism=mechanism))

        return self._run("hmac", sign, on_crypto=_integrity)

    @contextlib.contextmanager
    def _opened_private_key(self, lease: _Lease, key: SealedPrivateKey) -> Iterator[int]:
        """The sealed private key unwrapped inside the token (session object, sensitive,
        never extractable), cached like data keys by the hash of its sealed form."""
        key_type = _PRIVATE_KEY_TYPES.get(key.algorithm)
        if key_type is None:
            raise HsmInvalidInput(f"private keys are RSA or EC, not {key.algorithm!r}")
        cache_key = (f"sealed-private-{key.algorithm}", key.dek.mechanism,
                     hashlib.sha256(bytes(key.dek.ciphertext) + bytes(key.material)).digest())
        entry = self._cache.lease(cache_key)
        if entry is None:
            session = lease.session
            kek = self._kek(session, key.dek.wrapping_key_id)
            dek = self._unwrap(session, kek, key.dek, self._unwrap_scheme(key.dek), mechanisms.SEALED_DEK_TEMPLATE)
            try:
                opened = AesUnwrapView(session, dek.handle).unwrap_key(
                    ObjectClass.PRIVATE_KEY, key_type, bytes(key.material),
                    mechanism=Mechanism.AES_KEY_WRAP_PAD, capabilities=0,
                    template=mechanisms.opened_private_template(key_type))
            finally:
                _destroy_quietly(dek)
            entry = self._cache.adopt(cache_key, handle=opened.handle, owner=opened, generation=lease.generation)
        try:
            yield entry.handle
        finally:
            self._cache.release(entry)

    def private_key_sign(self, key: SealedPrivateKey, data: bytes, *, scheme: str, hash: str) -> bytes:
        if key.algorithm == "EC" or scheme == ECDSA:
            return self._ecdsa_sign(key, data, scheme=scheme, hash=hash)
        if scheme == RSA_PSS and hash in mechanisms.PSS_MECHANISMS:
            mechanism = mechanisms.PSS_MECHANISMS[hash]
            param: Any = (mechanisms.HASH_MECHANISMS[hash], mechanisms.HASH_MGF[hash], mechanisms.HASH_BYTES[hash])
        elif scheme == RSA_PKCS1V15 and hash in mechanisms.PKCS1_MECHANISMS:
            mechanism, param = mechanisms.PKCS1_MECHANISMS[hash], None
        else:
            raise HsmInvalidInput(f"RSA signatures are {RSA_PSS} or {RSA_PKCS1V15} with SHA-256/384/512, "
                                  f"not {scheme} with {hash}")
        message = bytes(data)

        def sign(lease: _Lease) -> bytes:
            with self._opened_private_key(lease, key) as handle:
                return bytes(RsaPrivateOpsView(lease.session, handle).sign(
                    message, mechanism=mechanism, mechanism_param=param))

        return self._run("private_key_sign", sign, on_crypto=_integrity)

    def _ecdsa_sign(self, key: SealedPrivateKey, data: bytes, *, scheme: str, hash: str) -> bytes:
        if key.algorithm != "EC" or scheme != ECDSA:
            raise HsmInvalidInput(f"{ECDSA} is for EC keys and EC keys sign with {ECDSA} only, "
                                  f"not {scheme} with a {key.algorithm} key")
        if hash not in mechanisms.HASH_BYTES or hash == "SHA-1":
            raise HsmInvalidInput(f"{ECDSA} hashes with SHA-256, SHA-384 or SHA-512, not {hash!r}")
        # The token has CKM_ECDSA only (no CKM_ECDSA_SHA*): the digest is computed here —
        # it is no secret — and signed inside the token, which answers r || s.
        digest = hashlib.new(hash.replace("-", "").lower(), bytes(data)).digest()

        def sign(lease: _Lease) -> bytes:
            with self._opened_private_key(lease, key) as handle:
                return bytes(EcPrivateOpsView(lease.session, handle).sign(digest, mechanism=Mechanism.ECDSA))

        raw = self._run("private_key_sign", sign, on_crypto=_integrity)
        half = len(raw) // 2
        return encode_dss_signature(int.from_bytes(raw[:half], "big"), int.from_bytes(raw[half:], "big"))

    def private_key_decrypt(self, key: SealedPrivateKey, ciphertext: bytes, *, hash: str) -> bytes:
        if key.algorithm != "RSA":
            raise HsmInvalidInput(f"only RSA private keys decrypt (RSA-OAEP), not {key.algorithm} keys")
        if hash not in ("SHA-1", "SHA-256"):
            raise HsmInvalidInput(f"RSA-OAEP decryption uses SHA-1 or SHA-256, not {hash!r}")
        supported = self._capabilities.rsa_unwrap_mechanisms or {self._capabilities.rsa_wrap_mechanism}
        if hash == "SHA-256" and RSA_OAEP_SHA256 not in supported:
            raise HsmInvalidInput(f"token {self._label!r} does RSA-OAEP with SHA-1 only (decision 0001)")
        param = (mechanisms.HASH_MECHANISMS[hash], mechanisms.HASH_MGF[hash], None)
        body = bytes(ciphertext)

        def decrypt(lease: _Lease) -> bytes:
            with self._opened_private_key(lease, key) as handle:
                return bytes(RsaPrivateOpsView(lease.session, handle).decrypt(
                    body, mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=param))

        return self._run("private_key_decrypt", decrypt, on_crypto=_integrity)

    # --- HsmBackend: audit chain ------------------------------------------------------
    def ensure_hmac_key(self, key_id: str) -> None:
        _check_id(key_id, what="HMAC key id")
        self._require(self._capabilities.supports_hmac_sha256, "CKM_SHA256_HMAC")

        def ensure(lease: _Lease) -> None:
            session = lease.session
            if self._find(session, ObjectClass.SECRET_KEY, KeyType.GENERIC_SECRET, key_id):
                return
            session.generate_key(
                KeyType.GENERIC_SECRET,
                mechanisms.HMAC_KEY_BYTES * 8,
                store=True,
                capabilities=0,
                mechanism=Mechanism.GENERIC_SECRET_KEY_GEN,
                template=mechanisms.hmac_key_template(key_id),
            )
            log.info("created HMAC key %r in token %r", key_id, self._label)

        with self._create_lock:
            self._run("ensure_hmac_key", ensure, on_crypto=_refused)

    def hmac_sha256(self, data: bytes, *, key_id: str) -> bytes:
        _check_id(key_id, what="HMAC key id")
        message = bytes(data)

        def sign(lease: _Lease) -> bytes:
            handle = self._hmac_handle(lease.session, key_id)
            return bytes(
                HmacKeyView(lease.session, handle).sign(message, mechanism=Mechanism.SHA256_HMAC)
            )

        return self._run("hmac_sha256", sign, on_crypto=_refused)

    def ensure_signing_key(self, key_id: str) -> bytes:
        _check_id(key_id, what="signing key id")

        def ensure(lease: _Lease) -> bytes:
            session = lease.session
            public = self._find(session, ObjectClass.PUBLIC_KEY, KeyType.EC, key_id)
            if public is None or self._find(session, ObjectClass.PRIVATE_KEY, KeyType.EC, key_id) is None:
                if public is not None:
                    raise HsmUnavailable(f"token {self._label!r} holds the public half of signing key {key_id!r} "
                                         "without its private half: remove it, or choose another key id")
                public_template, private_template = mechanisms.signing_key_templates(key_id)
                domain = session.create_domain_parameters(
                    KeyType.EC, {Attribute.EC_PARAMS: encode_named_curve_parameters("secp256r1")}, local=True)
                public, _ = domain.generate_keypair(store=True, capabilities=0, public_template=public_template,
                                                    private_template=private_template)
                log.info("created EC P-256 signing key %r in token %r", key_id, self._label)
            point = _der_octet_string(bytes(public[Attribute.EC_POINT]))
            return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point).public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

        with self._create_lock:
            return self._run("ensure_signing_key", ensure, on_crypto=_refused)

    def sign_p256(self, data: bytes, *, key_id: str) -> bytes:
        _check_id(key_id, what="signing key id")
        # The token has CKM_ECDSA only: the digest (no secret) is computed here.
        digest = hashlib.sha256(bytes(data)).digest()

        def sign(lease: _Lease) -> bytes:
            key = self._find(lease.session, ObjectClass.PRIVATE_KEY, KeyType.EC, key_id)
            if key is None:
                raise HsmKeyNotFound(f"signing key {key_id!r} not found in token {self._label!r}")
            return bytes(EcPrivateOpsView(lease.session, key.handle).sign(digest, mechanism=Mechanism.ECDSA))

        raw = self._run("sign_p256", sign, on_crypto=_refused)
        half = len(raw) // 2
        return encode_dss_signature(int.from_bytes(raw[:half], "big"), int.from_bytes(raw[half:], "big"))

    # --- for hsm.bench and tests in this package ----------------------------------
    @contextlib.contextmanager
    def _borrow(self) -> Iterator[Any]:
        """A pooled session, for hsm.bench and the SoftHSM tests; not an API."""
        self._ensure_usable()
        with self._serialised(), self._pool.borrow() as (session, _generation):
            yield session

    # --- the runner: one borrowed session, failure translation, one retry ----------
    def _run(
        self,
        what: str,
        operation: Callable[[_Lease], T],
        *,
        on_crypto: Callable[[str, str], HsmError] = _refused,
    ) -> T:
        for attempt in (1, 2):
            self._ensure_usable()
            # Rebound to the borrowed session's own generation; this value only counts
            # when opening a session fails.
            generation = self._pool.generation
            try:
                with self._serialised(), self._pool.borrow() as (session, generation):
                    return operation(_Lease(session, generation))
            except HsmError:
                raise
            except (p11.PKCS11Error, cryptoki.CryptokiError) as exc:
                fault = faults.classify(exc)
                name = faults.describe(exc)
                if fault is Fault.SESSION_LOST and attempt == 1:
                    log.warning(
                        "%s on token %r failed with %s: re-opening sessions, retrying once",
                        what, self._label, name,
                    )
                    self._recover(generation)
                    continue
                raise self._translate(what, exc, fault, on_crypto) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _translate(
        self,
        what: str,
        exc: BaseException,
        fault: Fault,
        on_crypto: Callable[[str, str], HsmError],
    ) -> HsmError:
        name = faults.describe(exc)
        if fault is Fault.CRYPTO:
            return on_crypto(what, name)
        if faults.is_pin_problem(exc):
            return HsmUnavailable(
                f"PIN rejected by token {self._label!r} ({name}): check the configured "
                "user PIN; a locked PIN must be reset by the security officer"
            )
        if fault is Fault.SESSION_LOST:
            return HsmUnavailable(
                f"{what}: lost the session with token {self._label!r} ({name}) and "
                "re-opening it did not help: check that the token is present and logged in"
            )
        return HsmUnavailable(f"{what}: token {self._label!r} is unusable ({name})")

    def _recover(self, failed_generation: int) -> None:
        with self._recovery_lock:
            if self._pool.generation != failed_generation:
                return  # another thread has already re-opened everything
            try:
                token = self._module.find_token(self._label)
                if token is None:
                    raise HsmUnavailable(
                        f"token {self._label!r} disappeared from module "
                        f"{self._config.module_path}: re-insert it or check the HSM"
                    )
                self._module.ensure_logged_in(token)
            except (p11.PKCS11Error, cryptoki.CryptokiError) as exc:
                raise self._translate("re-login", exc, faults.classify(exc), _refused) from None
            self._token = token
            generation = self._pool.reset(self._opener(token))
            self._cache.reset(generation)
            self._recipients.reset(generation)
            with self._handles_lock:
                # Token object handles are renumbered after a re-login (SoftHSM2 does).
                self._keks.clear()
                self._hmac_keys.clear()
            log.warning("token %r: sessions re-opened (generation %d)", self._label, generation)

    def _ensure_usable(self) -> None:
        if self._closed:
            raise HsmUnavailable("the HSM backend is closed")
        if self._epoch != current_epoch():
            raise HsmUnavailable(
                "this HSM backend was opened before fork(): open a new one in the child process"
            )

    def _serialised(self) -> contextlib.AbstractContextManager[Any]:
        lock = self._module.call_lock
        return lock if lock is not None else contextlib.nullcontext()

    @staticmethod
    def _opener(token: Any) -> Callable[[], Any]:
        return lambda: token.open(rw=True)

    def _require(self, supported: bool, mechanism: str) -> None:
        if not supported:
            raise HsmUnavailable(
                f"token {self._label!r} ({self._capabilities.model}) lacks {mechanism}"
            )

    # --- token objects ------------------------------------------------------------
    def _find(self, session: Any, object_class: ObjectClass, key_type: KeyType, key_id: str) -> Any:
        matches = list(
            session.get_objects(
                {
                    Attribute.CLASS: object_class,
                    Attribute.KEY_TYPE: key_type,
                    Attribute.TOKEN: True,
                    Attribute.ID: key_id.encode("utf-8"),
                }
            )
        )
        if len(matches) > 1:
            raise HsmUnavailable(
                f"token {self._label!r} holds {len(matches)} {object_class.name} objects "
                f"with id {key_id!r}: remove the duplicates"
            )
        return matches[0] if matches else None

    def _kek(self, session: Any, kek_id: str) -> _Kek:
        with self._handles_lock:
            cached = self._keks.get(kek_id)
        if cached is not None:
            return cached
        public = self._find(session, ObjectClass.PUBLIC_KEY, KeyType.RSA, kek_id)
        private = self._find(session, ObjectClass.PRIVATE_KEY, KeyType.RSA, kek_id)
        if public is None or private is None:
            raise HsmKeyNotFound(f"KEK {kek_id!r} not found in token {self._label!r}")
        values = public.get_attributes([Attribute.MODULUS, Attribute.PUBLIC_EXPONENT])
        public_key = rsa.RSAPublicNumbers(
            int.from_bytes(values[Attribute.PUBLIC_EXPONENT], "big"),
            int.from_bytes(values[Attribute.MODULUS], "big"),
        ).public_key()
        pem = public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        kek = _Kek(
            info=KekInfo(kek_id=kek_id, public_key_pem=pem, created_at=_start_date(public)),
            public_handle=public.handle,
            private_handle=private.handle,
            public_key=public_key,
        )
        with self._handles_lock:
            self._keks[kek_id] = kek
        return kek

    def _hmac_handle(self, session: Any, key_id: str) -> int:
        with self._handles_lock:
            handle = self._hmac_keys.get(key_id)
        if handle is not None:
            return handle
        key = self._find(session, ObjectClass.SECRET_KEY, KeyType.GENERIC_SECRET, key_id)
        if key is None:
            raise HsmKeyNotFound(f"HMAC key {key_id!r} not found in token {self._label!r}")
        with self._handles_lock:
            self._hmac_keys[key_id] = key.handle
        return int(key.handle)

    # --- wrapping primitives --------------------------------------------------------
    def _unwrap_scheme(self, wrapped: WrappedKey) -> OaepScheme:
        if not isinstance(wrapped, WrappedKey):
            raise HsmInvalidInput("expected a WrappedKey")
        scheme = mechanisms.oaep_scheme(wrapped.mechanism)
        supported = self._capabilities.rsa_unwrap_mechanisms or {
            self._capabilities.rsa_wrap_mechanism
        }
        if scheme.name not in supported:
            raise HsmInvalidInput(
                f"token {self._label!r} cannot unwrap {scheme.name} blobs (it supports "
                f"{', '.join(sorted(supported))}): re-wrap them with a token that can"
            )
        return scheme

    @staticmethod
    def _wrap(session: Any, public_handle: int, key: Any, scheme: OaepScheme) -> bytes:
        return bytes(
            RsaPublicView(session, public_handle).wrap_key(
                key, mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=scheme.pkcs11_param
            )
        )

    @staticmethod
    def _unwrap(
        session: Any,
        kek: _Kek,
        wrapped: WrappedKey,
        scheme: OaepScheme,
        template: dict[Attribute, Any],
        key_type: KeyType = KeyType.AES,
    ) -> Any:
        try:
            return RsaPrivateView(session, kek.private_handle).unwrap_key(
                ObjectClass.SECRET_KEY,
                key_type,
                bytes(wrapped.ciphertext),
                mechanism=Mechanism.RSA_PKCS_OAEP,
                mechanism_param=scheme.pkcs11_param,
                capabilities=0,
                template=dict(template),
            )
        except p11.PKCS11Error as exc:
            if faults.classify(exc) is Fault.CRYPTO:
                # Opaque on purpose: which check failed is nobody's business.
                raise HsmIntegrityError(_INTEGRITY_MESSAGE) from None
            raise

    @contextlib.contextmanager
    def _working_key(self, lease: _Lease, wrapped: WrappedKey, scheme: OaepScheme, *,
                     hmac: bool = False) -> Iterator[int]:
        """A leased handle of the unwrapped data key (or HMAC key), from the cache or a fresh unwrap."""
        key = _cache_key(wrapped)
        if hmac:  # one blob is one kind of key, but the cache must never hand one out as the other
            key = ("hmac", *key[1:])
        entry = self._cache.lease(key)
        if entry is None:
            kek = self._kek(lease.session, wrapped.wrapping_key_id)
            obj = self._unwrap(lease.session, kek, wrapped, scheme,
                               mechanisms.HMAC_WORKING_TEMPLATE if hmac else mechanisms.WORKING_KEY_TEMPLATE,
                               KeyType.GENERIC_SECRET if hmac else KeyType.AES)
            entry = self._cache.adopt(key, handle=obj.handle, owner=obj, generation=lease.generation)
        try:
            yield entry.handle
        finally:
            self._cache.release(entry)

    @contextlib.contextmanager
    def _recipient_key(self, lease: _Lease, recipient_id: str, n: int, e: int) -> Iterator[int]:
        """A leased handle of a host's public key (session object), cached by its DER hash."""
        key = ("recipient", "RSA", bytes.fromhex(recipient_id))
        entry = self._recipients.lease(key)
        if entry is None:
            obj = lease.session.create_object(mechanisms.recipient_public_template(n, e))
            entry = self._recipients.adopt(key, handle=obj.handle, owner=obj, generation=lease.generation)
        try:
            yield entry.handle
        finally:
            self._recipients.release(entry)

    # --- capabilities -----------------------------------------------------------------
    def _detect_capabilities(self) -> TokenCapabilities:
        token = self._token
        identity = caps.TokenIdentity(
            manufacturer=token.manufacturer_id,
            model=token.model,
            firmware=tuple(token.firmware_version),
        )
        try:
            available = token.slot.get_mechanisms()
            return caps.detect(identity, available, probe_oaep=self.probe_oaep)
        except caps.NoUsableOaep as exc:
            raise HsmUnavailable(
                f"token {self._label!r} ({identity.manufacturer} {identity.model}) cannot "
                f"hold Strongroom KEKs: {exc}"
            ) from None
        except (p11.PKCS11Error, cryptoki.CryptokiError) as exc:
            raise HsmUnavailable(
                f"cannot read the mechanism list of token {self._label!r} ({faults.describe(exc)})"
            ) from None

    def probe_oaep(self, mechanism: str) -> bool:
        """Does an OAEP wrap/unwrap round trip with this scheme work inside the token?

        Uses throw-away session keys only. Called for tokens without a quirk entry;
        public so that a test can check the quirk table against the real token.
        """
        scheme = mechanisms.oaep_scheme(mechanism)

        def probe(lease: _Lease) -> bool:
            session = lease.session
            public, private = session_rsa_pair(session)
            created = [public, private]
            try:
                key = session.generate_key(
                    KeyType.AES, mechanisms.DATA_KEY_BITS, capabilities=0,
                    template=dict(mechanisms.TRANSIT_KEY_TEMPLATE),
                )
                created.append(key)
                blob = self._wrap(session, public.handle, key, scheme)
                created.append(
                    private.unwrap_key(
                        ObjectClass.SECRET_KEY, KeyType.AES, blob,
                        mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=scheme.pkcs11_param,
                        capabilities=0, template=dict(mechanisms.TRANSIT_KEY_TEMPLATE),
                    )
                )
                return True
            except p11.PKCS11Error as exc:
                if faults.classify(exc) is not Fault.CRYPTO:
                    raise
                log.info("token %r does not do %s: %s", self._label, scheme.name,
                         faults.describe(exc))
                return False
            finally:
                for obj in created:
                    _destroy_quietly(obj)

        return self._run("probe_oaep", probe)


# --- factory -----------------------------------------------------------------------
def open_backend(config: HsmConfig, *, create_token: bool = True) -> Pkcs11Backend:
    """Load the module, find (or create and initialise) the token, log in.

    With `create_token`, a missing token is initialised in a free slot with the SO
    PIN, then given the user PIN: the `keyserver init` path, and the embedded
    SoftHSM2 default that bootstraps itself on first start.
    """
    with _bootstrap_lock(config.softhsm_token_dir):
        module = load_module(config.module_path, softhsm_token_dir=config.softhsm_token_dir)
        try:
            token = _find_or_create_token(module, config, create_token=create_token)
            module.login(token, user_pin=config.user_pin)
        except (p11.PKCS11Error, cryptoki.CryptokiError) as exc:
            raise _open_error(config, exc) from None
    try:
        return Pkcs11Backend(config=config, module=module, token=token)
    except BaseException:
        module.logout(token.serial)
        raise


def _find_or_create_token(module: LoadedModule, config: HsmConfig, *, create_token: bool) -> Any:
    label, path = config.token_label, config.module_path
    token = module.find_token(label)
    if token is None:
        if not create_token:
            raise HsmUnavailable(
                f"token {label!r} not found in module {path}: run `keyserver init`"
            )
        slot = module.free_slot()
        if slot is None:
            raise HsmUnavailable(
                f"token {label!r} not found in module {path} and no uninitialised slot is "
                "free: create the token with the HSM vendor's tools"
            )
        log.info("initialising token %r in slot %s of %s", label, slot.slot_id, path)
        module.init_token(slot, label=label, so_pin=config.so_pin)
        token = module.find_token(label)
        if token is None:
            raise HsmUnavailable(f"token {label!r} did not appear after C_InitToken in {path}")
    if not token.flags & pkcs11.TokenFlag.USER_PIN_INITIALIZED:
        if not create_token:
            raise HsmUnavailable(f"token {label!r} has no user PIN yet: run `keyserver init`")
        log.info("setting the user PIN of token %r", label)
        module.init_user_pin(token, so_pin=config.so_pin, user_pin=config.user_pin)
        token = module.find_token(label) or token
    if token.flags & pkcs11.TokenFlag.USER_PIN_LOCKED:
        raise HsmUnavailable(
            f"the user PIN of token {label!r} is locked: the security officer must reset it"
        )
    return token


def _open_error(config: HsmConfig, exc: BaseException) -> HsmError:
    name = faults.describe(exc)
    if faults.is_pin_problem(exc):
        return HsmUnavailable(
            f"PIN rejected by token {config.token_label!r} ({name}): check the configured "
            "user PIN (and the SO PIN when the token is being created)"
        )
    return HsmUnavailable(
        f"cannot open token {config.token_label!r} in module {config.module_path} ({name})"
    )


@contextlib.contextmanager
def _bootstrap_lock(token_dir: Path | None) -> Iterator[None]:
    """Serialise first start across processes sharing a SoftHSM2 token directory.

    Two processes starting on an empty directory would otherwise both find a free
    slot and create two tokens with one label. Held across C_Initialize as well, since
    SoftHSM2 only sees tokens that existed when it was initialised.
    """
    if token_dir is None:
        yield
        return
    directory = token_dir.expanduser()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(directory / ".strongroom-bootstrap.lock", "a+b") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


# --- helpers -------------------------------------------------------------------------
def _cache_key(wrapped: WrappedKey) -> CacheKey:
    return (
        wrapped.wrapping_key_id,
        wrapped.mechanism,
        hashlib.sha256(wrapped.ciphertext).digest(),
    )


def _check_id(value: str, *, what: str) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_ID_CHARS:
        raise HsmInvalidInput(f"{what} must be a string of 1..{_MAX_ID_CHARS} characters")
    if value != value.strip() or not value.isprintable():
        raise HsmInvalidInput(f"{what} must be printable, without surrounding whitespace")


def _load_recipient_key(der: bytes) -> rsa.RSAPublicKey:
    try:
        key = serialization.load_der_public_key(bytes(der))
    except (ValueError, TypeError):
        raise HsmInvalidInput(
            "recipient public key is not a DER SubjectPublicKeyInfo"
        ) from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise HsmInvalidInput("recipient public key must be RSA")
    if key.key_size < mechanisms.MIN_RECIPIENT_RSA_BITS:
        raise HsmInvalidInput(
            f"recipient RSA key has {key.key_size} bits; at least "
            f"{mechanisms.MIN_RECIPIENT_RSA_BITS} are required"
        )
    return key


def _start_date(obj: Any) -> datetime | None:
    try:
        value = obj[Attribute.START_DATE]
    except (p11.PKCS11Error, ValueError):
        # Unset CK_DATE comes back empty, which python-pkcs11 cannot parse.
        return None
    if not isinstance(value, date):
        return None
    # CK_DATE has no time of day; midnight UTC is the honest reading of it.
    return datetime.combine(value, time.min, tzinfo=UTC)


_PRIVATE_KEY_TYPES: Final = {"RSA": KeyType.RSA, "EC": KeyType.EC}


def _der_octet_string(data: bytes) -> bytes:
    """The contents of a DER OCTET STRING (how PKCS#11 v2.20+ tokens give CKA_EC_POINT);
    a bare point (some older tokens) is returned as it is."""
    if len(data) >= 2 and data[0] == 0x04:
        length, offset = data[1], 2
        if length & 0x80:
            n = length & 0x7F
            length, offset = int.from_bytes(data[2:2 + n], "big"), 2 + n
        if offset + length == len(data):
            return data[offset:]
    return data


def _destroy_quietly(obj: Any) -> None:
    """Destroy a session object; if its session is gone, so is the object."""
    try:
        obj.destroy()
    except p11.PKCS11Error as exc:
        log.debug("destroying a session object failed: %s", faults.describe(exc))


def session_rsa_pair(session: Any) -> tuple[Any, Any]:
    """A throw-away RSA-2048 wrap/unwrap pair as session objects (probes and benchmarks)."""
    return session.generate_keypair(  # type: ignore[no-any-return]
        KeyType.RSA,
        mechanisms.KEK_BITS,
        store=False,
        capabilities=0,
        public_template={Attribute.TOKEN: False, Attribute.WRAP: True},
        private_template={
            Attribute.TOKEN: False,
            Attribute.UNWRAP: True,
            Attribute.SENSITIVE: True,
            Attribute.EXTRACTABLE: False,
        },
    )
