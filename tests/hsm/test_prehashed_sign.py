"""Signatures over a digest the caller computed (PKCS#11's CKM_ECDSA, CKM_RSA_PKCS_PSS and
CKM_RSA_PKCS, KMIP's Digested Data): signed inside the token, each checked by
`cryptography` in software as a signature over the original message."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric import padding as asym
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from hsm import ECDSA, RSA_PKCS1V15, RSA_PSS, HsmInvalidInput, SealedPrivateKey
from hsm.pkcs11 import Pkcs11Backend
from keyserver.core.kmip_sealed import seal

HASHES: dict[str, Callable[[], hashes.HashAlgorithm]] = {
    "SHA-256": hashes.SHA256, "SHA-384": hashes.SHA384, "SHA-512": hashes.SHA512}


@pytest.fixture(scope="module")
def kek(hsm_backend: Pkcs11Backend) -> str:
    kek_id = f"kek-prehashed-{uuid.uuid4().hex[:8]}"
    hsm_backend.create_kek(kek_id)
    return kek_id


def _digest(name: str, data: bytes) -> bytes:
    return hashlib.new(name.replace("-", "").lower(), data).digest()


@pytest.mark.parametrize("scheme", [RSA_PSS, RSA_PKCS1V15])
@pytest.mark.parametrize("name", ["SHA-256", "SHA-384", "SHA-512"])
def test_an_rsa_key_signs_a_digest_as_it_would_the_message(hsm_backend: Pkcs11Backend, kek: str, scheme: str,
                                                           name: str) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    sealed = seal(hsm_backend, der, kek_id=kek)
    key = SealedPrivateKey(dek=sealed.dek, material=sealed.material)
    message = os.urandom(900)
    signature = hsm_backend.private_key_sign(key, _digest(name, message), scheme=scheme, hash=name, prehashed=True)
    algorithm = HASHES[name]()
    pad = (asym.PSS(mgf=asym.MGF1(HASHES[name]()), salt_length=algorithm.digest_size) if scheme == RSA_PSS
           else asym.PKCS1v15())
    private.public_key().verify(signature, message, pad, algorithm)  # the message's signature: raises if not
    if scheme == RSA_PKCS1V15:  # deterministic: exactly what signing the message gives
        assert signature == hsm_backend.private_key_sign(key, message, scheme=scheme, hash=name)
    with pytest.raises(HsmInvalidInput, match=f"a {name} digest is"):
        hsm_backend.private_key_sign(key, _digest(name, message)[:-1], scheme=scheme, hash=name, prehashed=True)


@pytest.mark.parametrize(("curve", "name"), [("P-256", "SHA-256"), ("P-384", "SHA-384"), ("P-256", "SHA-512")])
def test_an_ec_key_signs_a_digest_with_ckm_ecdsa(hsm_backend: Pkcs11Backend, kek: str, curve: str,
                                                name: str) -> None:
    pair = hsm_backend.generate_wrapped_ec_pair(kek_id=kek, curve=curve)
    public = serialization.load_der_public_key(pair.public_key_der)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    key = SealedPrivateKey(dek=pair.dek, material=pair.private_key, algorithm="EC")
    message = os.urandom(300)
    digest = _digest(name, message)
    signature = hsm_backend.private_key_sign(key, digest, scheme=ECDSA, hash=name, prehashed=True)
    public.verify(signature, message, ec.ECDSA(HASHES[name]()))
    public.verify(signature, digest, ec.ECDSA(Prehashed(HASHES[name]())))
    with pytest.raises(HsmInvalidInput, match="digest is"):
        hsm_backend.private_key_sign(key, digest + b"\0", scheme=ECDSA, hash=name, prehashed=True)
    with pytest.raises(HsmInvalidInput):
        hsm_backend.private_key_sign(key, _digest("SHA-1", message), scheme=ECDSA, hash="SHA-1", prehashed=True)
