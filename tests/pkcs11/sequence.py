"""The main PKCS#11 sequence, as a consumer runs it through python-pkcs11: find keys by
label, AES-GCM and AES-CBC-PAD, HMAC, RSA-OAEP and RSA-PSS, ECDSA, key and key pair
generation, wrap and unwrap. Signatures and ciphertexts are checked outside the module
(cryptography) wherever the public half makes that possible.

Used in-process by test_python_pkcs11.py and, as a program, under the ASan/UBSan build of
the module (test_robustness.py), where the sanitizers must stay silent:

    python -m tests.pkcs11.sequence MODULE TOKEN_LABEL AES_LABEL HMAC_LABEL
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pkcs11
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils
from pkcs11 import MGF, Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.util.ec import encode_ecdsa_signature, encode_named_curve_parameters

DATA = b"the ledger of 26 November, row 1 to 10,000"
DIGEST = hashlib.sha256(DATA).digest()
PSS_SHA256 = (Mechanism.SHA256, MGF.SHA256, 32)
OAEP_SHA1 = (Mechanism.SHA_1, MGF.SHA1, None)
CKR_KEY_FUNCTION_NOT_PERMITTED = 0x68  # python-pkcs11 has no exception class of its own for it


@contextlib.contextmanager
def refused(ckr: int) -> Iterator[None]:
    """The call inside fails with exactly this CKR code (for the codes python-pkcs11
    reports only as "Unmapped error code 0x..")."""
    with pytest.raises(pkcs11.PKCS11Error, match=f"Unmapped error code {ckr:#x}$"):
        yield


def label(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def secret_key(session: Any, name: str) -> Any:
    """The key a label finds for encryption: of every secret key object of that label,
    the one that may encrypt (the newest Active version of a rotated key)."""
    found = [o for o in session.get_objects({Attribute.LABEL: name, Attribute.CLASS: ObjectClass.SECRET_KEY})
             if o[Attribute.ENCRYPT] or o[Attribute.SIGN]]
    assert len(found) == 1, f"{name}: {len(found)} usable secret keys"
    return found[0]


def object_id(obj: Any) -> str:
    """CKA_ID = the KMIP unique identifier (a UUID): its text, or its 16 bytes."""
    raw = bytes(obj[Attribute.ID])
    try:
        return str(uuid.UUID(raw.decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        return str(uuid.UUID(bytes=raw))


def by_id(session: Any, uid: str, cls: ObjectClass = ObjectClass.SECRET_KEY) -> Any:
    for raw in (uid.encode(), uuid.UUID(uid).bytes):
        found = list(session.get_objects({Attribute.ID: raw, Attribute.CLASS: cls}))
        if found:
            assert len(found) == 1
            return found[0]
    raise AssertionError(f"no object with CKA_ID {uid}")


def gcm_roundtrip(key: Any, data: bytes = DATA, aad: bytes = b"table=ledger") -> bytes:
    params = pkcs11.GCMParams(os.urandom(12), aad)
    ciphertext = bytes(key.encrypt(data, mechanism=Mechanism.AES_GCM, mechanism_param=params))
    assert len(ciphertext) == len(data) + 16 and data not in ciphertext
    assert bytes(key.decrypt(ciphertext, mechanism=Mechanism.AES_GCM, mechanism_param=params)) == data
    return ciphertext


def cbc_pad_roundtrip(key: Any, data: bytes = DATA) -> bytes:
    iv = os.urandom(16)
    ciphertext = bytes(key.encrypt(data, mechanism=Mechanism.AES_CBC_PAD, mechanism_param=iv))
    assert len(ciphertext) == (len(data) // 16 + 1) * 16
    assert bytes(key.decrypt(ciphertext, mechanism=Mechanism.AES_CBC_PAD, mechanism_param=iv)) == data
    return ciphertext


def rsa_public(public: Any) -> rsa.RSAPublicKey:
    return rsa.RSAPublicNumbers(int.from_bytes(public[Attribute.PUBLIC_EXPONENT], "big"),
                                int.from_bytes(public[Attribute.MODULUS], "big")).public_key()


def ec_public(public: Any) -> ec.EllipticCurvePublicKey:
    point = bytes(public[Attribute.EC_POINT])
    if point[0] == 0x04 and len(point) == 67:  # DER OCTET STRING around the 65-byte point
        point = point[2:]
    return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)


def rsa_sequence(session: Any) -> None:
    public, private = session.generate_keypair(KeyType.RSA, 2048, label=label("seq-rsa"), store=True)
    outside = rsa_public(public)
    assert outside.key_size == 2048
    # PSS in the token, verified by the module and outside it
    signature = bytes(private.sign(DATA, mechanism=Mechanism.SHA256_RSA_PKCS_PSS, mechanism_param=PSS_SHA256))
    assert public.verify(DATA, signature, mechanism=Mechanism.SHA256_RSA_PKCS_PSS, mechanism_param=PSS_SHA256)
    assert not public.verify(DATA + b"!", signature, mechanism=Mechanism.SHA256_RSA_PKCS_PSS,
                             mechanism_param=PSS_SHA256)
    outside.verify(signature, DATA, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
    pkcs1 = bytes(private.sign(DATA, mechanism=Mechanism.SHA256_RSA_PKCS))
    outside.verify(pkcs1, DATA, padding.PKCS1v15(), hashes.SHA256())
    # CKM_RSA_PKCS_PSS on a digest the application computed (KMIP Digested Data)
    prehashed = bytes(private.sign(DIGEST, mechanism=Mechanism.RSA_PKCS_PSS, mechanism_param=PSS_SHA256))
    outside.verify(prehashed, DIGEST, padding.PSS(padding.MGF1(hashes.SHA256()), 32),
                   utils.Prehashed(hashes.SHA256()))
    # OAEP (SHA-1: what the server's token does inside the HSM): encrypted outside, decrypted inside
    sha1 = hashes.SHA1()  # noqa: S303 - OAEP's hash, not a signature's
    sealed = outside.encrypt(b"table key", padding.OAEP(padding.MGF1(sha1), sha1, None))
    assert bytes(private.decrypt(sealed, mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=OAEP_SHA1)) == b"table key"
    sealed = bytes(public.encrypt(b"table key", mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=OAEP_SHA1))
    assert bytes(private.decrypt(sealed, mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=OAEP_SHA1)) == b"table key"


def ec_sequence(session: Any) -> None:
    params = session.create_domain_parameters(
        KeyType.EC, {Attribute.EC_PARAMS: encode_named_curve_parameters("secp256r1")}, local=True)
    public, private = params.generate_keypair(label=label("seq-ec"), store=True)
    signature = bytes(private.sign(DATA, mechanism=Mechanism.ECDSA_SHA256))
    assert len(signature) == 64  # r || s, as PKCS#11 defines it
    assert public.verify(DATA, signature, mechanism=Mechanism.ECDSA_SHA256)
    ec_public(public).verify(encode_ecdsa_signature(signature), DATA, ec.ECDSA(hashes.SHA256()))
    raw = bytes(private.sign(DIGEST, mechanism=Mechanism.ECDSA))  # CKM_ECDSA: the digest is the input
    ec_public(public).verify(encode_ecdsa_signature(raw), DIGEST, ec.ECDSA(utils.Prehashed(hashes.SHA256())))


def wrap_sequence(session: Any, wrapping: Any) -> None:
    table = session.generate_key(KeyType.AES, 256, label=label("seq-table"), store=True)
    wrapped = bytes(wrapping.wrap_key(table, mechanism=Mechanism.AES_KEY_WRAP_PAD))
    assert len(wrapped) == 40
    back = wrapping.unwrap_key(ObjectClass.SECRET_KEY, KeyType.AES, wrapped, label=label("seq-unwrapped"),
                               mechanism=Mechanism.AES_KEY_WRAP_PAD, store=True)
    # the unwrapped key is the table key: what one encrypts, the other decrypts
    params = pkcs11.GCMParams(os.urandom(12))
    ciphertext = bytes(table.encrypt(DATA, mechanism=Mechanism.AES_GCM, mechanism_param=params))
    assert bytes(back.decrypt(ciphertext, mechanism=Mechanism.AES_GCM, mechanism_param=params)) == DATA


def main_sequence(lib: Any, token_label: str, aes_label: str, hmac_label: str, pin: str | None = None) -> None:
    token = lib.get_token(token_label=token_label)
    with token.open(rw=True, user_pin=pin) as session:
        aes = secret_key(session, aes_label)
        assert aes[Attribute.KEY_TYPE] == KeyType.AES and aes[Attribute.VALUE_LEN] == 32
        gcm_roundtrip(aes)
        cbc_pad_roundtrip(aes)
        mac = secret_key(session, hmac_label)
        tag = bytes(mac.sign(DATA, mechanism=Mechanism.SHA256_HMAC))
        assert len(tag) == 32 and mac.verify(DATA, tag, mechanism=Mechanism.SHA256_HMAC)
        assert not mac.verify(DATA + b"!", tag, mechanism=Mechanism.SHA256_HMAC)
        # an exportable key's value (a plaintext Get): the key the server MACs with
        assert hmac.new(bytes(mac[Attribute.VALUE]), DATA, hashlib.sha256).digest() == tag
        assert bytes(session.digest(DATA, mechanism=Mechanism.SHA256)) == hashlib.sha256(DATA).digest()
        made = session.generate_key(KeyType.AES, 256, label=label("seq-aes"), store=True)
        gcm_roundtrip(made)
        with pytest.raises(pkcs11.exceptions.AttributeSensitive):  # made here: not exportable
            made[Attribute.VALUE]
        rsa_sequence(session)
        ec_sequence(session)
        wrap_sequence(session, aes)


if __name__ == "__main__":
    module, token_label, aes_label, hmac_label = sys.argv[1:5]
    main_sequence(pkcs11.lib(module), token_label, aes_label, hmac_label)
    print("sequence ok")
