"""KMIP's cryptographic services beyond the conformance profiles' cases: RSA-OAEP between
the halves of a pair, refusals a client can act on, and the audit record of each use."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kmip.core import enums, misc
from kmip.pie import objects as pie
from kmip.pie.exceptions import KmipOperationFailure
from sqlalchemy import select

from keyserver.kmip.listener import KmipListener
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.kmip.conftest import ClientFiles, make_client

OAEP = {"padding_method": enums.PaddingMethod.OAEP, "hashing_algorithm": enums.HashingAlgorithm.SHA_1,
        "cryptographic_algorithm": enums.CryptographicAlgorithm.RSA}


def reason(call: Callable[[], Any]) -> Any:
    with pytest.raises(KmipOperationFailure) as e:
        call()
    return e.value.reason


def test_rsa_oaep_between_the_halves_of_a_pair(kmip: Any) -> None:
    M = enums.CryptographicUsageMask
    public, private = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048,
                                           public_usage_mask=[M.ENCRYPT], private_usage_mask=[M.DECRYPT])
    kmip.activate(public)
    kmip.activate(private)
    ciphertext, _ = kmip.encrypt(b"wrapped secret", uid=public, cryptographic_parameters=OAEP)
    assert len(ciphertext) == 256
    assert kmip.decrypt(ciphertext, uid=private, cryptographic_parameters=OAEP) == b"wrapped secret"
    # the private half was made for decryption only: it does not sign
    assert reason(lambda: kmip.sign(b"x", uid=private)) == enums.ResultReason.ILLEGAL_OPERATION
    # PKCS#1 v1.5 encryption is refused by name (Bleichenbacher), not silently replaced
    v15 = {**OAEP, "padding_method": enums.PaddingMethod.PKCS1v15}
    assert reason(lambda: kmip.encrypt(b"x", uid=public, cryptographic_parameters=v15)) == \
        enums.ResultReason.FEATURE_NOT_SUPPORTED


def test_legacy_ciphers_and_modes_are_refused_with_their_reason(kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    kmip.activate(uid)
    for params, says in (({"cryptographic_algorithm": enums.CryptographicAlgorithm.TRIPLE_DES}, "legacy"),
                         ({"block_cipher_mode": enums.BlockCipherMode.ECB}, "use GCM or CBC")):
        with pytest.raises(KmipOperationFailure) as e:
            kmip.encrypt(b"x" * 16, uid=uid, cryptographic_parameters=params)
        assert e.value.reason == enums.ResultReason.FEATURE_NOT_SUPPORTED and says in e.value.message
    assert reason(lambda: kmip.create(enums.CryptographicAlgorithm.TRIPLE_DES, 168)) == \
        enums.ResultReason.INVALID_FIELD


def test_every_use_is_audited_with_the_key_version_and_refusals_too(
        kmip: Any, services: Services, kmip_files: Callable[[str], ClientFiles], kmip_listener: KmipListener) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    kmip.activate(uid)
    ciphertext, iv = kmip.encrypt(b"payload", uid=uid)
    assert kmip.decrypt(ciphertext, uid=uid, iv_counter_nonce=iv) == b"payload"
    auditor = make_client(kmip_files("auditor"), kmip_listener.port)
    auditor.open()
    try:
        assert reason(lambda: auditor.encrypt(b"x", uid=uid)) == enums.ResultReason.PERMISSION_DENIED
    finally:
        auditor.close()
    key_id = {a.attribute_name.value: a.attribute_value.value for a in kmip.get_attributes(uid)[1]
              if a.attribute_name.value == "x-strongroom-key-id"}["x-strongroom-key-id"]
    services.audit.flush()
    with services.db() as s:
        rows = list(s.execute(select(AuditEvent).where(AuditEvent.action.in_(("key.encrypt", "key.decrypt")),
                                                       AuditEvent.object_id == key_id)
                              .order_by(AuditEvent.seq)).scalars())
    # one identity (the managed key) for the uses and the refusal alike
    assert [(e.action, e.outcome, (e.details or {}).get("version")) for e in rows] == [
        ("key.encrypt", "allowed", 1), ("key.decrypt", "allowed", 1), ("key.encrypt", "denied", None)]
    assert rows[0].details["kmip_uid"] == uid and rows[0].details["mechanism"] == "AES-GCM"
    # A refusal names the key too (the chainer adds its name: docs/audit.md "Fields").
    assert rows[2].details == {"missing_permission": "keys:encrypt", "object_name": rows[0].details["name"]}


def test_a_pre_active_key_does_nothing(kmip: Any) -> None:
    """§3.22: a Pre-Active object "SHALL NOT be used for any cryptographic purpose"."""
    aes = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    mac_key = kmip.create(enums.CryptographicAlgorithm.HMAC_SHA256, 256)
    public, private = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
    calls: list[Callable[[], Any]] = [
        lambda: kmip.encrypt(b"x", uid=aes),
        lambda: kmip.decrypt(b"x" * 32, uid=aes, iv_counter_nonce=bytes(12)),
        lambda: kmip.mac(b"x", uid=mac_key, algorithm=enums.CryptographicAlgorithm.HMAC_SHA256),
        lambda: kmip.sign(b"x", uid=private),
        lambda: kmip.decrypt(b"x" * 256, uid=private, cryptographic_parameters=OAEP),
        lambda: kmip.signature_verify(b"x", b"y" * 256, uid=public)]
    for call in calls:
        with pytest.raises(KmipOperationFailure) as e:
            call()
        assert e.value.reason == enums.ResultReason.ILLEGAL_OPERATION and "pre-active" in e.value.message.lower()


@pytest.mark.parametrize(("algorithm", "bits", "digest"), [
    (enums.CryptographicAlgorithm.HMAC_SHA384, 384, "sha384"),
    (enums.CryptographicAlgorithm.HMAC_SHA512, 512, "sha512")])
def test_hmac_keys_of_every_size_are_created_got_raw_and_mac_in_the_token(
        kmip: Any, algorithm: enums.CryptographicAlgorithm, bits: int, digest: str) -> None:
    import hashlib
    import hmac

    uid = kmip.create(algorithm, bits)
    kmip.activate(uid)
    key = kmip.get(uid)
    assert (key.cryptographic_algorithm, key.cryptographic_length, key.key_format_type, len(key.value)) == \
        (algorithm, bits, enums.KeyFormatType.RAW, bits // 8)
    _, tag = kmip.mac(b"ledger", uid=uid, algorithm=algorithm)
    assert tag == hmac.new(key.value, b"ledger", getattr(hashlib, digest)).digest()
    # an HMAC key MACs with its own hash, and does not encrypt
    assert reason(lambda: kmip.mac(b"x", uid=uid, algorithm=enums.CryptographicAlgorithm.HMAC_SHA256)) == \
        enums.ResultReason.INVALID_FIELD
    assert reason(lambda: kmip.encrypt(b"x", uid=uid)) == enums.ResultReason.ILLEGAL_OPERATION


def test_an_auditor_uses_no_key(kmip: Any, kmip_files: Callable[[str], ClientFiles],
                                kmip_listener: KmipListener) -> None:
    aes = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    mac_key = kmip.create(enums.CryptographicAlgorithm.HMAC_SHA256, 256)
    public, private = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
    for uid in (aes, mac_key, public, private):
        kmip.activate(uid)
    ciphertext, iv = kmip.encrypt(b"x", uid=aes)
    auditor = make_client(kmip_files("auditor"), kmip_listener.port)
    auditor.open()
    try:
        for call in (lambda: auditor.decrypt(ciphertext, uid=aes, iv_counter_nonce=iv),
                     lambda: auditor.mac(b"x", uid=mac_key, algorithm=enums.CryptographicAlgorithm.HMAC_SHA256),
                     lambda: auditor.sign(b"x", uid=private)):
            assert reason(call) == enums.ResultReason.PERMISSION_DENIED
    finally:
        auditor.close()


@pytest.mark.parametrize(("algorithm", "bits", "curve", "default_hash"), [
    (enums.CryptographicAlgorithm.EC, 256, ec.SECP256R1, hashes.SHA256),
    (enums.CryptographicAlgorithm.ECDSA, 384, ec.SECP384R1, hashes.SHA384)])
def test_ec_key_pairs_sign_with_ecdsa_inside_the_hsm(kmip: Any, algorithm: enums.CryptographicAlgorithm, bits: int,
                                                     curve: type[ec.EllipticCurve],
                                                     default_hash: type[hashes.HashAlgorithm]) -> None:
    public, private = kmip.create_key_pair(algorithm, bits)
    for uid, mask in ((public, enums.CryptographicUsageMask.VERIFY), (private, enums.CryptographicUsageMask.SIGN)):
        found = {a.attribute_name.value: a.attribute_value for a in kmip.get_attributes(uid)[1]}
        assert found["Cryptographic Algorithm"].value == enums.CryptographicAlgorithm.EC
        assert found["Cryptographic Length"].value == bits
        assert found["Cryptographic Usage Mask"].value == mask.value  # ECDSA: that and nothing else
        kmip.activate(uid)
    got = kmip.get(public)
    assert (got.cryptographic_algorithm, got.key_format_type) == (enums.CryptographicAlgorithm.EC,
                                                                  enums.KeyFormatType.X_509)
    key = serialization.load_der_public_key(got.value)
    assert isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, curve)
    # the PKCS#8 a client may export matches the public half
    pkcs8 = serialization.load_der_private_key(kmip.get(private).value, None)
    assert isinstance(pkcs8, ec.EllipticCurvePrivateKey) and pkcs8.public_key().public_numbers() == \
        key.public_numbers()

    data = b"release 4.2.0 " + os.urandom(16)
    signature = kmip.sign(data, uid=private)  # no parameters: ECDSA with the curve's hash
    key.verify(signature, data, ec.ECDSA(default_hash()))
    assert kmip.signature_verify(data, signature, uid=public) == enums.ValidityIndicator.VALID
    assert kmip.signature_verify(data + b"!", signature, uid=public) == enums.ValidityIndicator.INVALID
    by_name = {"digital_signature_algorithm": enums.DigitalSignatureAlgorithm.ECDSA_WITH_SHA512}
    signature = kmip.sign(data, uid=private, cryptographic_parameters=by_name)
    key.verify(signature, data, ec.ECDSA(hashes.SHA512()))
    by_parts = {"cryptographic_algorithm": enums.CryptographicAlgorithm.ECDSA,
                "hashing_algorithm": enums.HashingAlgorithm.SHA_512}
    assert kmip.signature_verify(data, signature, uid=public, cryptographic_parameters=by_parts) == \
        enums.ValidityIndicator.VALID

    # what an EC key does not do, each refused with its reason
    pss = {"padding_method": enums.PaddingMethod.PSS, "hashing_algorithm": enums.HashingAlgorithm.SHA_256}
    assert reason(lambda: kmip.sign(data, uid=private, cryptographic_parameters=pss)) == \
        enums.ResultReason.INVALID_FIELD
    assert reason(lambda: kmip.encrypt(data, uid=public, cryptographic_parameters=OAEP)) == \
        enums.ResultReason.ILLEGAL_OPERATION
    assert reason(lambda: kmip.decrypt(os.urandom(64), uid=private, cryptographic_parameters=OAEP)) == \
        enums.ResultReason.ILLEGAL_OPERATION
    result = kmip.proxy.get(public, key_format_type=misc.KeyFormatType(enums.KeyFormatType.PKCS_1))
    assert result.result_reason.value == enums.ResultReason.KEY_FORMAT_TYPE_NOT_SUPPORTED
    aes = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    with pytest.raises(KmipOperationFailure) as e:
        kmip.get(aes, key_wrapping_specification={"wrapping_method": enums.WrappingMethod.ENCRYPT,
                                                  "encryption_key_information": {"unique_identifier": public}})
    assert e.value.reason == enums.ResultReason.ILLEGAL_OPERATION and "EC public key cannot wrap" in e.value.message

    # Locate by algorithm finds both halves (EC and ECDSA name one kind), RSA finds neither
    for name in (enums.CryptographicAlgorithm.EC, enums.CryptographicAlgorithm.ECDSA):
        assert {public, private} <= set(kmip.locate(attributes=[
            kmip.attribute_factory.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_ALGORITHM, name)]))
    assert not {public, private} & set(kmip.locate(attributes=[
        kmip.attribute_factory.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_ALGORITHM,
                                                enums.CryptographicAlgorithm.RSA)]))


def test_ec_key_pairs_of_other_sizes_are_refused(kmip: Any) -> None:
    for bits in (192, 521, 2048):
        with pytest.raises(KmipOperationFailure) as e:
            kmip.create_key_pair(enums.CryptographicAlgorithm.EC, bits)
        assert e.value.reason == enums.ResultReason.INVALID_FIELD and "P-256" in e.value.message


@pytest.mark.parametrize(("curve", "bits", "hash"), [(ec.SECP256R1, 256, hashes.SHA256),
                                                    (ec.SECP384R1, 384, hashes.SHA384)])
def test_registered_ec_keys_sign_in_the_hsm_and_verify(kmip: Any, curve: type[ec.EllipticCurve], bits: int,
                                                       hash: type[hashes.HashAlgorithm]) -> None:
    """An EC key made elsewhere (here with `cryptography`): its public half registered as
    X.509 SubjectPublicKeyInfo, its private half as PKCS#8, as a client's Register sends
    them; the private key signs inside the HSM, the public one verifies, and each carries
    the usage an ECDSA key has (Sign, Verify) and nothing else."""
    key = ec.generate_private_key(curve())
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    pkcs8 = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    public = kmip.register(pie.PublicKey(enums.CryptographicAlgorithm.EC, bits, spki, enums.KeyFormatType.X_509))
    private = kmip.register(pie.PrivateKey(enums.CryptographicAlgorithm.EC, bits, pkcs8, enums.KeyFormatType.PKCS_8))
    for uid, mask in ((public, enums.CryptographicUsageMask.VERIFY), (private, enums.CryptographicUsageMask.SIGN)):
        found = {a.attribute_name.value: a.attribute_value for a in kmip.get_attributes(uid)[1]}
        assert found["Cryptographic Algorithm"].value == enums.CryptographicAlgorithm.EC
        assert found["Cryptographic Length"].value == bits
        assert found["Cryptographic Usage Mask"].value & mask.value
        assert not found["Cryptographic Usage Mask"].value & (enums.CryptographicUsageMask.ENCRYPT.value
                                                              | enums.CryptographicUsageMask.WRAP_KEY.value)
        kmip.activate(uid)
    data = b"registered " + os.urandom(16)
    signature = kmip.sign(data, uid=private)
    key.public_key().verify(signature, data, ec.ECDSA(hash()))
    assert kmip.signature_verify(data, signature, uid=public) == enums.ValidityIndicator.VALID
    assert kmip.signature_verify(data + b"!", signature, uid=public) == enums.ValidityIndicator.INVALID
    assert kmip.get(public).value == spki


def test_ec_keys_on_other_curves_or_mislabelled_are_refused(kmip: Any) -> None:
    other = ec.generate_private_key(ec.SECP521R1())
    with pytest.raises(KmipOperationFailure) as e:
        kmip.register(pie.PublicKey(enums.CryptographicAlgorithm.EC, 521, other.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo), enums.KeyFormatType.X_509))
    assert "P-256 or P-384" in e.value.message
    with pytest.raises(KmipOperationFailure) as e:
        kmip.register(pie.PrivateKey(enums.CryptographicAlgorithm.EC, 521, other.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
            enums.KeyFormatType.PKCS_8))
    assert e.value.reason == enums.ResultReason.INVALID_FIELD and "P-256 or P-384" in e.value.message
    p256 = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(KmipOperationFailure) as e:  # says RSA, is EC
        kmip.register(pie.PrivateKey(enums.CryptographicAlgorithm.RSA, 256, p256.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
            enums.KeyFormatType.PKCS_8))
    assert e.value.reason == enums.ResultReason.INVALID_FIELD and "does not match" in e.value.message
