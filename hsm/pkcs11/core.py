"""The backend's core: shared state, the session runner and recovery, token lookups."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

import pkcs11
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11 import exceptions as p11

from hsm import capabilities as caps
from hsm import cryptoki, faults, mechanisms, openssl_errors
from hsm.backend import KekInfo, TokenCapabilities, WrappedKey
from hsm.config import HsmConfig
from hsm.errors import HsmError, HsmIntegrityError, HsmInvalidInput, HsmKeyNotFound, HsmUnavailable
from hsm.faults import Fault
from hsm.handles import HandleCache, RsaPrivateView, RsaPublicView
from hsm.mechanisms import OaepScheme
from hsm.module import LoadedModule, current_epoch
from hsm.pkcs11.common import (
    INTEGRITY_MESSAGE,
    Kek,
    Lease,
    destroy_quietly,
    handle_cache_key,
    refused,
    session_rsa_pair,
    start_date,
)
from hsm.sessions import SessionPool

log = logging.getLogger(__name__)

T = TypeVar("T")

_USER_STATES: Final = (cryptoki.CKS_RW_USER_FUNCTIONS, cryptoki.CKS_RO_USER_FUNCTIONS)


# The attributes some tokens ignore (or refuse) in an unwrap template (TokenCapabilities.
# unwrap_sets_attributes_after).
_UNWRAP_SECURITY: Final = (Attribute.SENSITIVE, Attribute.EXTRACTABLE)
# Template attributes a module older than Cryptoki v2.40 does not know (`_known`).
_V2_40_ATTRIBUTES: Final = frozenset({Attribute.COPYABLE, Attribute.DESTROYABLE})
# The probe's throw-away key is never read: no sensitivity asked, so any token takes it.
_PROBE_UNWRAP_TEMPLATE: Final = {a: v for a, v in mechanisms.TRANSIT_KEY_TEMPLATE.items()
                                 if a not in _UNWRAP_SECURITY}


class Pkcs11Core:
    """The state every part of the backend shares, the session runner (one borrowed
    session per operation, failure translation, one re-login and retry), token object
    lookups and the RSA-OAEP wrapping primitives."""

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
            destroy=destroy_quietly,
        )
        # Hosts' public keys as session objects: a host fetches many keys, and creating
        # and destroying the object on every delivery serialises in the token.
        self._recipients = HandleCache(
            max_entries=min(config.handle_cache_size, 1024),
            ttl_seconds=config.handle_cache_ttl_seconds,
            destroy=destroy_quietly,
        )
        self._handles_lock = threading.Lock()
        self._keks: dict[str, Kek] = {}
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
        lacking = caps.missing_services(self._capabilities)
        if lacking:
            log.warning("HSM token %r lacks %s", self._label, "; ".join(lacking))

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

        def probe(lease: Lease) -> None:
            state = self._module.raw.session_state(lease.session.handle)
            if state not in _USER_STATES:
                # Reported as a lost login so that the runner logs in again once.
                raise cryptoki.CryptokiError("C_GetSessionInfo", cryptoki.CKR_USER_NOT_LOGGED_IN)
            lease.session.generate_random(64)

        self._run("check", probe, on_crypto=refused)

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

    # --- for kmsbench.hsm_ceiling and tests in this package ----------------------------------
    @contextlib.contextmanager
    def _borrow(self) -> Iterator[Any]:
        """A pooled session, for kmsbench.hsm_ceiling and the SoftHSM tests; not an API."""
        self._ensure_usable()
        with self._serialised(), self._pool.borrow() as (session, _generation):
            yield session

    # --- the runner: one borrowed session, failure translation, one retry ----------
    def _run(
        self,
        what: str,
        operation: Callable[[Lease], T],
        *,
        on_crypto: Callable[[str, str], HsmError] = refused,
    ) -> T:
        for attempt in (1, 2):
            self._ensure_usable()
            # Rebound to the borrowed session's own generation; this value only counts
            # when opening a session fails.
            generation = self._pool.generation
            try:
                with self._serialised(), self._pool.borrow() as (session, generation):
                    return operation(Lease(session, generation))
            except HsmError:
                openssl_errors.clear()  # what a failure inside the token's OpenSSL left (hsm/openssl_errors.py)
                raise
            except (p11.PKCS11Error, cryptoki.CryptokiError) as exc:
                openssl_errors.clear()
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
                raise self._translate("re-login", exc, faults.classify(exc), refused) from None
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

    def _known(self, template: dict[Attribute, Any]) -> dict[Attribute, Any]:
        """`template` without the attributes the module's Cryptoki version predates:
        CKA_COPYABLE is v2.40, and a v2.20 module (openCryptoki 3.8) answers
        CKR_ATTRIBUTE_TYPE_INVALID. Such a module has no C_CopyObject policy to set."""
        if tuple(self._module.lib.cryptoki_version) >= (2, 40):
            return template
        return {a: v for a, v in template.items() if a not in _V2_40_ATTRIBUTES}

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

    def _kek(self, session: Any, kek_id: str) -> Kek:
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
        kek = Kek(
            info=KekInfo(kek_id=kek_id, public_key_pem=pem, created_at=start_date(public)),
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

    def _unwrap(
        self,
        session: Any,
        kek: Kek,
        wrapped: WrappedKey,
        scheme: OaepScheme,
        template: dict[Attribute, Any],
        key_type: KeyType = KeyType.AES,
    ) -> Any:
        after = self._capabilities.unwrap_sets_attributes_after
        asked: dict[Attribute, Any] = (
            {a: template[a] for a in _UNWRAP_SECURITY if a in template} if after else {})
        try:
            key = RsaPrivateView(session, kek.private_handle).unwrap_key(
                ObjectClass.SECRET_KEY,
                key_type,
                bytes(wrapped.ciphertext),
                mechanism=Mechanism.RSA_PKCS_OAEP,
                mechanism_param=scheme.pkcs11_param,
                capabilities=0,
                template={a: v for a, v in template.items() if a not in asked},
            )
        except p11.PKCS11Error as exc:
            if faults.classify(exc) is Fault.CRYPTO:
                # Opaque on purpose: which check failed is nobody's business.
                raise HsmIntegrityError(INTEGRITY_MESSAGE) from None
            raise
        if asked:
            self._set_after_unwrap(key, asked)
        return key

    def _set_after_unwrap(self, key: Any, asked: dict[Attribute, Any]) -> None:
        """For a token that ignores CKA_SENSITIVE/CKA_EXTRACTABLE on unwrap: set them now
        (both changes the standard allows one way only: on, resp. off) and read them back;
        a key that does not end up as asked is destroyed, never used."""
        try:
            for attribute, value in asked.items():
                if key[attribute] != value:
                    key[attribute] = value
            if all(key[attribute] == value for attribute, value in asked.items()):
                return
        except p11.PKCS11Error:
            pass
        destroy_quietly(key)
        raise HsmUnavailable(
            f"token {self._label!r} ({self._capabilities.model}) did not give an unwrapped key "
            "the sensitivity it was asked for"
        )

    @contextlib.contextmanager
    def _working_key(self, lease: Lease, wrapped: WrappedKey, scheme: OaepScheme, *,
                     hmac: bool = False) -> Iterator[int]:
        """A leased handle of the unwrapped data key (or HMAC key), from the cache or a fresh unwrap."""
        key = handle_cache_key(wrapped)
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
    def _recipient_key(self, lease: Lease, recipient_id: str, n: int, e: int) -> Iterator[int]:
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

        def probe(lease: Lease) -> bool:
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
                        capabilities=0, template=dict(_PROBE_UNWRAP_TEMPLATE),
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
                    destroy_quietly(obj)

        return self._run("probe_oaep", probe)

