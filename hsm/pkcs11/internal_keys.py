"""The server's own token keys: the audit chain's HMAC key and the P-256 checkpoint signing key."""

from __future__ import annotations

import hashlib
import logging

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.util.ec import encode_named_curve_parameters

from hsm import mechanisms
from hsm.errors import HsmKeyNotFound, HsmUnavailable
from hsm.handles import EcPrivateOpsView, HmacKeyView
from hsm.pkcs11.common import Lease, check_id, der_octet_string, refused
from hsm.pkcs11.core import Pkcs11Core

log = logging.getLogger(__name__)


class InternalKeys(Pkcs11Core):
    """Token objects the key server itself uses, created on first need."""

    def ensure_hmac_key(self, key_id: str) -> None:
        check_id(key_id, what="HMAC key id")
        self._require(self._capabilities.supports_hmac_sha256, "CKM_SHA256_HMAC")

        def ensure(lease: Lease) -> None:
            session = lease.session
            if self._find(session, ObjectClass.SECRET_KEY, KeyType.GENERIC_SECRET, key_id):
                return
            session.generate_key(
                KeyType.GENERIC_SECRET,
                mechanisms.HMAC_KEY_BYTES * 8,
                store=True,
                capabilities=0,
                mechanism=Mechanism.GENERIC_SECRET_KEY_GEN,
                template=self._known(mechanisms.hmac_key_template(key_id)),
            )
            log.info("created HMAC key %r in token %r", key_id, self._label)

        with self._create_lock:
            self._run("ensure_hmac_key", ensure, on_crypto=refused)

    def hmac_sha256(self, data: bytes, *, key_id: str) -> bytes:
        check_id(key_id, what="HMAC key id")
        message = bytes(data)

        def sign(lease: Lease) -> bytes:
            handle = self._hmac_handle(lease.session, key_id)
            return bytes(
                HmacKeyView(lease.session, handle).sign(message, mechanism=Mechanism.SHA256_HMAC)
            )

        return self._run("hmac_sha256", sign, on_crypto=refused)

    def ensure_signing_key(self, key_id: str) -> bytes:
        check_id(key_id, what="signing key id")
        self._require(self._capabilities.supports_ecdsa, "CKM_EC_KEY_PAIR_GEN/CKM_ECDSA")

        def ensure(lease: Lease) -> bytes:
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
            point = der_octet_string(bytes(public[Attribute.EC_POINT]))
            return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point).public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

        with self._create_lock:
            return self._run("ensure_signing_key", ensure, on_crypto=refused)

    def sign_p256(self, data: bytes, *, key_id: str) -> bytes:
        check_id(key_id, what="signing key id")
        self._require(self._capabilities.supports_ecdsa, "CKM_EC_KEY_PAIR_GEN/CKM_ECDSA")
        # The token has CKM_ECDSA only: the digest (no secret) is computed here.
        digest = hashlib.sha256(bytes(data)).digest()

        def sign(lease: Lease) -> bytes:
            key = self._find(lease.session, ObjectClass.PRIVATE_KEY, KeyType.EC, key_id)
            if key is None:
                raise HsmKeyNotFound(f"signing key {key_id!r} not found in token {self._label!r}")
            return bytes(EcPrivateOpsView(lease.session, key.handle).sign(digest, mechanism=Mechanism.ECDSA))

        raw = self._run("sign_p256", sign, on_crypto=refused)
        half = len(raw) // 2
        return encode_dss_signature(int.from_bytes(raw[:half], "big"), int.from_bytes(raw[half:], "big"))

