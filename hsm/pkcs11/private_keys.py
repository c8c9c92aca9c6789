"""Sealed private keys: RSA and EC pairs generated in the token, used inside it."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.util.ec import encode_named_curve_parameters

from hsm import mechanisms
from hsm.backend import (
    AES_KWP,
    ECDSA,
    RSA_OAEP_SHA256,
    RSA_PKCS1V15,
    RSA_PSS,
    SealedPrivateKey,
    WrappedKey,
    WrappedKeyPair,
)
from hsm.errors import HsmInvalidInput
from hsm.handles import AesUnwrapView, EcPrivateOpsView, RsaPrivateOpsView
from hsm.pkcs11.common import AesWrapView, Lease, der_octet_string, destroy_quietly, integrity_error, refused
from hsm.pkcs11.core import Pkcs11Core

_PRIVATE_KEY_TYPES: Final = {"RSA": KeyType.RSA, "EC": KeyType.EC}
# DER DigestInfo (RFC 8017 §9.2 note 1) up to the digest, for CKM_RSA_PKCS over a digest.
DIGEST_INFO_PREFIX: Final = {
    "SHA-256": bytes.fromhex("3031300d060960864801650304020105000420"),
    "SHA-384": bytes.fromhex("3041300d060960864801650304020205000430"),
    "SHA-512": bytes.fromhex("3051300d060960864801650304020305000440"),
}


def _check_digest(digest: bytes, hash: str) -> None:
    if hash not in DIGEST_INFO_PREFIX:
        raise HsmInvalidInput(f"signatures over a digest use SHA-256, SHA-384 or SHA-512, not {hash!r}")
    if len(digest) != mechanisms.HASH_BYTES[hash]:
        raise HsmInvalidInput(f"a {hash} digest is {mechanisms.HASH_BYTES[hash]} bytes, not {len(digest)}")


class PrivateKeyOps(Pkcs11Core):
    """KMIP key pairs: generated, sealed (PKCS#8 under a DEK under the KEK), opened only in the token."""

    def generate_wrapped_rsa_pair(self, *, kek_id: str, bits: int) -> WrappedKeyPair:
        if bits not in mechanisms.CLIENT_RSA_BITS:
            raise HsmInvalidInput(f"RSA key pairs are {', '.join(map(str, sorted(mechanisms.CLIENT_RSA_BITS)))} "
                                  f"bits long, not {bits}")
        self._require(self._capabilities.supports_aes_key_wrap_pad, "CKM_AES_KEY_WRAP_PAD")
        scheme = self._wrap_scheme

        def generate(lease: Lease) -> WrappedKeyPair:
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
                    wrapped_private = bytes(AesWrapView(session, dek.handle).wrap_key(
                        private, mechanism=Mechanism.AES_KEY_WRAP_PAD))
                    dek_blob = self._wrap(session, kek.public_handle, dek, scheme)
                finally:
                    destroy_quietly(dek)
                n = int.from_bytes(bytes(public[Attribute.MODULUS]), "big")
                e = int.from_bytes(bytes(public[Attribute.PUBLIC_EXPONENT]), "big")
            finally:
                destroy_quietly(private)
                destroy_quietly(public)
            der = rsa.RSAPublicNumbers(e, n).public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            return WrappedKeyPair(public_key_der=der,
                                  dek=WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=dek_blob),
                                  private_key=wrapped_private, mechanism=AES_KWP)

        return self._run("generate_wrapped_rsa_pair", generate, on_crypto=refused)

    def generate_wrapped_ec_pair(self, *, kek_id: str, curve: str) -> WrappedKeyPair:
        if curve not in mechanisms.CLIENT_EC_CURVES:
            raise HsmInvalidInput(f"EC key pairs are on {', '.join(mechanisms.CLIENT_EC_CURVES)}, not {curve!r}")
        p11_name, curve_obj, _ = mechanisms.CLIENT_EC_CURVES[curve]
        self._require(self._capabilities.supports_ecdsa, "CKM_EC_KEY_PAIR_GEN/CKM_ECDSA")
        self._require(self._capabilities.supports_aes_key_wrap_pad, "CKM_AES_KEY_WRAP_PAD")
        scheme = self._wrap_scheme

        def generate(lease: Lease) -> WrappedKeyPair:
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
                    wrapped_private = bytes(AesWrapView(session, dek.handle).wrap_key(
                        private, mechanism=Mechanism.AES_KEY_WRAP_PAD))
                    dek_blob = self._wrap(session, kek.public_handle, dek, scheme)
                finally:
                    destroy_quietly(dek)
                point = der_octet_string(bytes(public[Attribute.EC_POINT]))  # CKA_EC_POINT is DER-wrapped
            finally:
                destroy_quietly(private)
                destroy_quietly(public)
            der = ec.EllipticCurvePublicKey.from_encoded_point(curve_obj, point).public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            return WrappedKeyPair(public_key_der=der,
                                  dek=WrappedKey(wrapping_key_id=kek_id, mechanism=scheme.name, ciphertext=dek_blob),
                                  private_key=wrapped_private, mechanism=AES_KWP)

        return self._run("generate_wrapped_ec_pair", generate, on_crypto=refused)

    @contextlib.contextmanager
    def _opened_private_key(self, lease: Lease, key: SealedPrivateKey) -> Iterator[int]:
        """The sealed private key unwrapped inside the token (session object, sensitive,
        never extractable), cached like data keys by the hash of its sealed form."""
        self._require(self._capabilities.supports_aes_key_wrap_pad, "CKM_AES_KEY_WRAP_PAD")
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
                destroy_quietly(dek)
            entry = self._cache.adopt(cache_key, handle=opened.handle, owner=opened, generation=lease.generation)
        try:
            yield entry.handle
        finally:
            self._cache.release(entry)

    def private_key_sign(self, key: SealedPrivateKey, data: bytes, *, scheme: str, hash: str,
                         prehashed: bool = False) -> bytes:
        if key.algorithm == "EC" or scheme == ECDSA:
            return self._ecdsa_sign(key, data, scheme=scheme, hash=hash, prehashed=prehashed)
        if prehashed:
            return self._rsa_sign_digest(key, data, scheme=scheme, hash=hash)
        if scheme == RSA_PSS and hash in mechanisms.PSS_MECHANISMS:
            mechanism = mechanisms.PSS_MECHANISMS[hash]
            param: Any = (mechanisms.HASH_MECHANISMS[hash], mechanisms.HASH_MGF[hash], mechanisms.HASH_BYTES[hash])
        elif scheme == RSA_PKCS1V15 and hash in mechanisms.PKCS1_MECHANISMS:
            mechanism, param = mechanisms.PKCS1_MECHANISMS[hash], None
        else:
            raise HsmInvalidInput(f"RSA signatures are {RSA_PSS} or {RSA_PKCS1V15} with SHA-256/384/512, "
                                  f"not {scheme} with {hash}")
        message = bytes(data)

        def sign(lease: Lease) -> bytes:
            with self._opened_private_key(lease, key) as handle:
                return bytes(RsaPrivateOpsView(lease.session, handle).sign(
                    message, mechanism=mechanism, mechanism_param=param))

        return self._run("private_key_sign", sign, on_crypto=integrity_error)

    def _rsa_sign_digest(self, key: SealedPrivateKey, digest: bytes, *, scheme: str, hash: str) -> bytes:
        """A digest the caller computed, signed inside the token: CKM_RSA_PKCS_PSS (the
        digest, salt = hash length) or CKM_RSA_PKCS over the DigestInfo built here."""
        _check_digest(digest, hash)
        if scheme == RSA_PSS:
            mechanism = Mechanism.RSA_PKCS_PSS
            param: Any = (mechanisms.HASH_MECHANISMS[hash], mechanisms.HASH_MGF[hash], mechanisms.HASH_BYTES[hash])
            message = bytes(digest)
        elif scheme == RSA_PKCS1V15:
            mechanism, param, message = Mechanism.RSA_PKCS, None, DIGEST_INFO_PREFIX[hash] + bytes(digest)
        else:
            raise HsmInvalidInput(f"RSA signatures are {RSA_PSS} or {RSA_PKCS1V15}, not {scheme}")

        def sign(lease: Lease) -> bytes:
            with self._opened_private_key(lease, key) as handle:
                return bytes(RsaPrivateOpsView(lease.session, handle).sign(
                    message, mechanism=mechanism, mechanism_param=param))

        return self._run("private_key_sign", sign, on_crypto=integrity_error)

    def _ecdsa_sign(self, key: SealedPrivateKey, data: bytes, *, scheme: str, hash: str,
                    prehashed: bool = False) -> bytes:
        if key.algorithm != "EC" or scheme != ECDSA:
            raise HsmInvalidInput(f"{ECDSA} is for EC keys and EC keys sign with {ECDSA} only, "
                                  f"not {scheme} with a {key.algorithm} key")
        if hash not in mechanisms.HASH_BYTES or hash == "SHA-1":
            raise HsmInvalidInput(f"{ECDSA} hashes with SHA-256, SHA-384 or SHA-512, not {hash!r}")
        # The token has CKM_ECDSA only (no CKM_ECDSA_SHA*): the digest is computed here —
        # it is no secret — (or by the caller, `prehashed`) and signed inside the token,
        # which answers r || s.
        if prehashed:
            _check_digest(data, hash)
        digest = bytes(data) if prehashed else hashlib.new(hash.replace("-", "").lower(), bytes(data)).digest()

        def sign(lease: Lease) -> bytes:
            with self._opened_private_key(lease, key) as handle:
                return bytes(EcPrivateOpsView(lease.session, handle).sign(digest, mechanism=Mechanism.ECDSA))

        raw = self._run("private_key_sign", sign, on_crypto=integrity_error)
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

        def decrypt(lease: Lease) -> bytes:
            with self._opened_private_key(lease, key) as handle:
                return bytes(RsaPrivateOpsView(lease.session, handle).decrypt(
                    body, mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=param))

        return self._run("private_key_decrypt", decrypt, on_crypto=integrity_error)

