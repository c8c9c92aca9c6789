"""Cryptographic services with keys that never leave the HSM: encrypt and decrypt (AES-GCM,
AES-CBC with PKCS#7 padding under a key version; RSA-OAEP with a key pair), sign and
verify (RSA-PSS, RSA PKCS#1 v1.5; ECDSA with EC pairs), MAC and MAC verify (HMAC keys),
random bytes. KMIP
(Encrypt, Decrypt, Sign, SignatureVerify, MAC, MACVerify, RNGRetrieve) and REST
(/keys/{key}/encrypt ...) both call this; it knows neither.

Every use is authorised here, checked against the object's state (Active: every use;
Deactivated and Compromised: decrypt and verify only, KMIP 1.4 §3.22 "process, not
protect"; Pre-Active and destroyed: none) and its Cryptographic Usage Mask (usage.py),
and audited with the key version, never with the data. Secret-key and private-key
operations run in the token; public-key operations (RSA-OAEP encryption, signature
verification) need no secret and run in software on the public key.
"""

from __future__ import annotations

import hmac as _hmac
from dataclasses import dataclass, field
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed
from cryptography.x509 import load_der_x509_certificate

from hsm import (
    AES_CBC_PAD,
    AES_GCM,
    ECDSA,
    RSA_PKCS1V15,
    RSA_PSS,
    HsmBackend,
    HsmError,
    HsmIntegrityError,
    HsmInvalidInput,
    SealedPrivateKey,
    WrappedKey,
)
from keyserver.core.audit import PendingRecord, utcnow
from keyserver.core.errors import Conflict, IntegrityFailure, InvalidInput, hsm_failure
from keyserver.core.gcm import GcmBudget
from keyserver.core.keys import HMAC_ALGORITHMS, version_wrapped
from keyserver.core.kmip_model import (
    CERTIFICATE,
    PRIVATE_KEY,
    StandaloneObject,
    VersionObject,
    audit_details,
    audit_identity,
    object_type_of,
    usage_of,
    use_refusal,
)
from keyserver.core.kmip_objects import KmipObjectService
from keyserver.core.permissions import Permission
from keyserver.core.principal import RequestContext
from keyserver.core.states import KeyState
from keyserver.core.usage import Usage
from keyserver.store.models import KmipPublicKey, KmipSealedObject

MAX_DATA = 1 << 20  # bytes per call
MAX_RANDOM = 1 << 16
Use = Literal["encrypt", "decrypt", "sign", "verify", "mac", "mac_verify"]
# What each use needs of the object (Cryptographic Usage Mask) and of the caller.
_NEEDS: dict[str, tuple[Usage, Permission]] = {
    "encrypt": (Usage.ENCRYPT, Permission.KEYS_ENCRYPT),
    "decrypt": (Usage.DECRYPT, Permission.KEYS_DECRYPT),
    "sign": (Usage.SIGN, Permission.KEYS_ENCRYPT),
    "verify": (Usage.VERIFY, Permission.KEYS_VERIFY),
    "mac": (Usage.MAC_GENERATE, Permission.KEYS_ENCRYPT),
    "mac_verify": (Usage.MAC_VERIFY, Permission.KEYS_VERIFY),
}
PROTECT = frozenset({"encrypt", "sign", "mac"})  # Active objects only
PROCESS_STATES = frozenset({KeyState.ACTIVE, KeyState.DEACTIVATED, KeyState.COMPROMISED})
HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "SHA-1": hashes.SHA1, "SHA-256": hashes.SHA256, "SHA-384": hashes.SHA384, "SHA-512": hashes.SHA512}


@dataclass(frozen=True, slots=True)
class Ciphered:
    data: bytes = field(repr=False)
    iv: bytes = b""
    tag: bytes = b""
    version: int | None = None  # the managed key's version that encrypted (decrypt names it after a rotation)


class CryptoService:
    def __init__(self, objects: KmipObjectService, hsm: HsmBackend, gcm: GcmBudget) -> None:
        self._objects = objects
        self._hsm = hsm
        self._gcm = gcm

    # --- the checks every use passes ---------------------------------------------------
    def _subject(self, ctx: RequestContext, uid: str, use: Use) -> VersionObject | StandaloneObject:
        mask, permission = _NEEDS[use]
        # The cached resolution Get uses: state, material and attributes, dropped on every change
        obj = self._objects.resolve_for_export(ctx, uid, action=f"key.{use}", permission=permission)
        state = KeyState(obj.version.state if isinstance(obj, VersionObject) else obj.state)
        refusal = None
        if state not in PROCESS_STATES or (use in PROTECT and state is not KeyState.ACTIVE):
            allowed = "only an Active key" if use in PROTECT else "an Active, Deactivated or Compromised key"
            refusal = Conflict(f"the {object_type_of(obj)} is {state.value}: {use.replace('_', ' ')} needs "
                               f"{allowed}", code="illegal_state")
        elif not usage_of(obj) & mask:
            refusal = Conflict(f"the {object_type_of(obj)}'s Cryptographic Usage Mask does not allow "
                               f"{use.replace('_', ' ')}", code="usage_not_allowed")
        elif (dated := use_refusal(obj, use, utcnow())) is not None:
            refusal = Conflict(dated, code="illegal_state")
        if refusal is not None:
            self._record(ctx, use, obj, {"refused": refusal.message}, outcome="denied")
            raise refusal
        return obj

    def _record(self, ctx: RequestContext, use: str, obj: VersionObject | StandaloneObject,
                details: dict[str, object], *, outcome: Literal["allowed", "denied", "error"] = "allowed") -> None:
        object_type, object_id = audit_identity(obj)
        self._objects.record(PendingRecord(ctx=ctx, action=f"key.{use}", object_type=object_type,
                                           object_id=object_id, details={**audit_details(obj), **details},
                                           outcome=outcome))

    @staticmethod
    def _bounded(data: bytes, what: str = "data") -> bytes:
        if len(data) > MAX_DATA:
            raise InvalidInput(f"the {what} is {len(data)} bytes; at most {MAX_DATA} per call")
        return data

    # --- encrypt / decrypt -------------------------------------------------------------
    def encrypt(self, ctx: RequestContext, uid: str, data: bytes, *, mode: str | None = None,
                iv: bytes | None = None, aad: bytes = b"", tag_bytes: int = 16, oaep_hash: str = "SHA-1",
                details: dict[str, object] | None = None) -> Ciphered:
        """AES (`mode` AES-GCM, the default, or AES-CBC-PAD) with a symmetric key; RSA-OAEP
        (`oaep_hash`) with a public key. `details`: what a front adds to the audit record
        (the AWS request metadata of an XKS call: core/xks.py)."""
        extra = details or {}
        obj = self._subject(ctx, uid, "encrypt")
        data = self._bounded(data)
        if isinstance(obj, KmipPublicKey):
            public = self._public(obj)
            if not isinstance(public, rsa.RSAPublicKey):  # (an EC key's usage mask already refused)
                raise Conflict("an EC public key does not encrypt; use an RSA public key", code="wrong_object_type")
            out = Ciphered(data=public.encrypt(data, _oaep(oaep_hash)))
            self._record(ctx, "encrypt", obj, {"mechanism": f"RSA-OAEP-{oaep_hash}", "bytes": len(data)})
            return out
        version = self._aes(obj)
        mode = mode or AES_GCM
        if mode == AES_GCM:
            assert isinstance(obj, VersionObject)
            self._gcm.spend(obj.key.id, obj.version.version, name=obj.key.name)
        try:
            result = self._hsm.symmetric_cipher(version, data, encrypt=True, mode=mode, iv=iv, aad=aad,
                                                tag_bytes=tag_bytes)
        except HsmInvalidInput as exc:
            raise InvalidInput(str(exc)) from exc
        except HsmError as exc:
            raise hsm_failure("encrypt", exc) from exc
        self._record(ctx, "encrypt", obj, {"mechanism": mode, "bytes": len(data), "iv_chosen_by": (
            "client" if iv is not None else "token"), **extra})
        return Ciphered(data=result.data, iv=result.iv, tag=result.tag,
                        version=obj.version.version if isinstance(obj, VersionObject) else None)

    def decrypt(self, ctx: RequestContext, uid: str, data: bytes, *, mode: str | None = None,
                iv: bytes | None = None, aad: bytes = b"", tag: bytes = b"", oaep_hash: str = "SHA-1",
                details: dict[str, object] | None = None) -> bytes:
        extra = details or {}
        obj = self._subject(ctx, uid, "decrypt")
        data = self._bounded(data)
        try:
            if isinstance(obj, KmipSealedObject):
                plain = self._hsm.private_key_decrypt(self._sealed(obj), data, hash=oaep_hash)
                mechanism = f"RSA-OAEP-{oaep_hash}"
            else:
                mode = mode or AES_GCM
                plain = self._hsm.symmetric_cipher(self._aes(obj), data, encrypt=False, mode=mode, iv=iv, aad=aad,
                                                   tag=tag, tag_bytes=len(tag) or 16).data
                mechanism = mode
        except HsmIntegrityError:
            self._record(ctx, "decrypt", obj, {"bytes": len(data), **extra}, outcome="error")
            raise IntegrityFailure() from None
        except HsmInvalidInput as exc:
            raise InvalidInput(str(exc)) from exc
        except HsmError as exc:
            raise hsm_failure("decrypt", exc) from exc
        self._record(ctx, "decrypt", obj, {"mechanism": mechanism, "bytes": len(data), **extra})
        return plain

    # --- sign / verify -----------------------------------------------------------------
    def sign(self, ctx: RequestContext, uid: str, data: bytes, *, scheme: str | None = None,
             hash: str | None = None, digested: bool = False) -> bytes:
        """RSA-PSS (default) or RSA PKCS#1 v1.5 with an RSA private key, SHA-256 by default;
        ECDSA with an EC private key, by default with the hash of the curve's strength
        (P-256: SHA-256, P-384: SHA-384). `digested`: `data` is the digest the caller
        computed (of the named hash; unnamed, the hash whose length it has), signed as it is."""
        obj = self._subject(ctx, uid, "sign")
        data = self._bounded(data)
        if not isinstance(obj, KmipSealedObject) or obj.object_type != PRIVATE_KEY:
            raise Conflict(f"a {object_type_of(obj)} does not sign; use a private key", code="wrong_object_type")
        scheme, hash = _signature_choice(obj.algorithm or "RSA", obj.length_bits, scheme,
                                         _digest_hash(data, hash) if digested else hash)
        try:
            signature = self._hsm.private_key_sign(self._sealed(obj), data, scheme=scheme, hash=hash,
                                                   prehashed=digested)
        except HsmInvalidInput as exc:
            raise InvalidInput(str(exc)) from exc
        except HsmError as exc:
            raise hsm_failure("sign", exc) from exc
        self._record(ctx, "sign", obj, {"mechanism": f"{scheme}-{hash}", "bytes": len(data),
                                        **({"digested": True} if digested else {})})
        return signature

    def verify(self, ctx: RequestContext, uid: str, data: bytes, signature: bytes, *, scheme: str | None = None,
               hash: str | None = None, digested: bool = False) -> bool:
        """The inverse of sign, with a public key or a certificate (RSA or EC), in software;
        `digested` as for sign."""
        obj = self._subject(ctx, uid, "verify")
        data = self._bounded(data)
        public: rsa.RSAPublicKey | ec.EllipticCurvePublicKey
        if isinstance(obj, KmipPublicKey):
            public = self._public(obj)
        elif isinstance(obj, KmipSealedObject) and obj.object_type == CERTIFICATE and obj.material:
            key = load_der_x509_certificate(obj.material).public_key()
            if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
                raise InvalidInput("only RSA and EC certificates verify signatures here")
            public = key
        else:
            raise Conflict(f"a {object_type_of(obj)} does not verify; use a public key or a certificate",
                           code="wrong_object_type")
        if digested:
            hash = _digest_hash(data, hash)
        if isinstance(public, ec.EllipticCurvePublicKey):
            scheme, hash = _signature_choice("EC", public.curve.key_size, scheme, hash)
        else:
            scheme, hash = _signature_choice("RSA", public.key_size, scheme, hash)
        algorithm = HASHES[hash]()
        chosen: hashes.HashAlgorithm | Prehashed = Prehashed(algorithm) if digested else algorithm
        try:
            if isinstance(public, ec.EllipticCurvePublicKey):
                public.verify(signature, data, ec.ECDSA(chosen))
            else:
                pad: padding.AsymmetricPadding = (
                    padding.PSS(mgf=padding.MGF1(HASHES[hash]()), salt_length=algorithm.digest_size)
                    if scheme == RSA_PSS else padding.PKCS1v15())
                public.verify(signature, data, pad, chosen)
            valid = True
        except InvalidSignature:
            valid = False
        self._record(ctx, "verify", obj, {"mechanism": f"{scheme}-{hash}", "bytes": len(data), "valid": valid,
                                          **({"digested": True} if digested else {})})
        return valid

    # --- MAC ---------------------------------------------------------------------------
    def _mac(self, obj: VersionObject | StandaloneObject, data: bytes, hash: str | None) -> tuple[bytes, str]:
        if not isinstance(obj, VersionObject) or obj.key.algorithm not in HMAC_ALGORITHMS:
            raise Conflict(f"a {object_type_of(obj)} does not MAC; use an HMAC key", code="wrong_object_type")
        own = "SHA-" + obj.key.algorithm.removeprefix("HMAC-SHA")
        if hash not in (None, own):
            raise InvalidInput(f"this key is an {obj.key.algorithm} key: it MACs with {own} only")
        try:
            return self._hsm.hmac(version_wrapped(obj.version), self._bounded(data), hash=own), own
        except HsmInvalidInput as exc:
            raise InvalidInput(str(exc)) from exc
        except HsmError as exc:
            raise hsm_failure("compute the MAC", exc) from exc

    def mac(self, ctx: RequestContext, uid: str, data: bytes, *, hash: str | None = None) -> bytes:
        obj = self._subject(ctx, uid, "mac")
        tag, own = self._mac(obj, data, hash)
        self._record(ctx, "mac", obj, {"mechanism": f"HMAC-{own}", "bytes": len(data)})
        return tag

    def mac_verify(self, ctx: RequestContext, uid: str, data: bytes, mac: bytes, *,
                   hash: str | None = None) -> bool:
        obj = self._subject(ctx, uid, "mac_verify")
        expected, own = self._mac(obj, data, hash)
        valid = _hmac.compare_digest(expected, mac)  # constant time
        self._record(ctx, "mac_verify", obj, {"mechanism": f"HMAC-{own}", "bytes": len(data), "valid": valid})
        return valid

    # --- random ------------------------------------------------------------------------
    def random(self, ctx: RequestContext, n: int) -> bytes:
        """n bytes from the token's RNG (KMIP RNG Retrieve)."""
        self._objects.require(ctx, Permission.KEYS_READ, action="rng.retrieve")
        if not 1 <= n <= MAX_RANDOM:
            raise InvalidInput(f"ask for 1 to {MAX_RANDOM} random bytes")
        try:
            return self._hsm.random(n)
        except HsmError as exc:
            raise hsm_failure("draw random bytes", exc) from exc

    # --- helpers -----------------------------------------------------------------------
    @staticmethod
    def _aes(obj: VersionObject | StandaloneObject) -> WrappedKey:
        if not isinstance(obj, VersionObject) or obj.key.algorithm != "AES":
            raise Conflict(f"a {object_type_of(obj) if not isinstance(obj, VersionObject) else obj.key.algorithm} "
                           "key does not encrypt with AES; use an AES key (or a public key for RSA-OAEP)",
                           code="wrong_object_type")
        return version_wrapped(obj.version)

    @staticmethod
    def _sealed(obj: KmipSealedObject) -> SealedPrivateKey:
        if obj.object_type != PRIVATE_KEY or obj.material is None or obj.dek_ciphertext is None:
            raise Conflict(f"a {obj.object_type} has no private key to use", code="wrong_object_type")
        assert obj.dek_wrapping_key_id and obj.dek_mechanism
        return SealedPrivateKey(dek=WrappedKey(obj.dek_wrapping_key_id, obj.dek_mechanism, obj.dek_ciphertext),
                                material=obj.material, algorithm=obj.algorithm or "RSA")

    @staticmethod
    def _public(obj: KmipPublicKey) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
        key = serialization.load_der_public_key(obj.der)  # stored as SubjectPublicKeyInfo
        assert isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey)
        return key


def _signature_choice(algorithm: str, bits: int | None, scheme: str | None, hash: str | None) -> tuple[str, str]:
    """(scheme, hash) for a key: the caller's choice checked against the key, or the key's
    defaults (RSA: RSA-PSS with SHA-256; EC: ECDSA with SHA-256 on P-256, SHA-384 on P-384)."""
    if algorithm == "EC":
        if scheme not in (None, ECDSA):
            raise InvalidInput(f"an EC key signs and verifies with {ECDSA} only, not {scheme}")
        scheme, default = ECDSA, "SHA-384" if (bits or 0) >= 384 else "SHA-256"
    else:
        if scheme not in (None, RSA_PSS, RSA_PKCS1V15):
            raise InvalidInput(f"an RSA key signs and verifies with {RSA_PSS} or {RSA_PKCS1V15}, not {scheme}")
        scheme, default = scheme or RSA_PSS, "SHA-256"
    hash = hash or default
    if hash not in HASHES or hash == "SHA-1":
        raise InvalidInput(f"{scheme} signatures hash with SHA-256, SHA-384 or SHA-512, not {hash}")
    return scheme, hash


def _digest_hash(digest: bytes, named: str | None) -> str:
    """The hash a caller's digest is of: the named one, whose length it must have, or
    (none named) the SHA-2 hash of its length."""
    if named is None:
        by_length = {h().digest_size: name for name, h in HASHES.items() if name != "SHA-1"}
        if len(digest) not in by_length:
            raise InvalidInput(f"the digested data is {len(digest)} bytes: not a SHA-256, SHA-384 or SHA-512 digest "
                               "(32, 48 or 64 bytes)")
        return by_length[len(digest)]
    if named in HASHES and len(digest) != HASHES[named]().digest_size:
        raise InvalidInput(f"the digested data is {len(digest)} bytes, but a {named} digest is "
                           f"{HASHES[named]().digest_size}")
    return named


def _oaep(name: str) -> padding.OAEP:
    if name not in ("SHA-1", "SHA-256"):
        raise InvalidInput("RSA-OAEP uses SHA-1 or SHA-256")
    return padding.OAEP(mgf=padding.MGF1(HASHES[name]()), algorithm=HASHES[name](), label=None)


AES_MODES = (AES_GCM, AES_CBC_PAD)
