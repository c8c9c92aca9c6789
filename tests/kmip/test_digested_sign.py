"""Sign and SignatureVerify on Digested Data (KMIP 1.4 §4.31-4.32): what a PKCS#11 module
sends for CKM_RSA_PKCS_PSS, CKM_RSA_PKCS and CKM_ECDSA, whose callers hash for themselves.
Sent as raw TTLV (PyKMIP's client has no Digested Data for Sign); each signature checked by
`cryptography` as a signature over the original message."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from kmip.core import attributes, enums
from kmip.core.messages import payloads
from sqlalchemy import select

from keyserver.kmip.listener import KmipListener
from keyserver.kmip.payloads import SignRequestPayload
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.kmip.conftest import ClientFiles
from tests.kmip.raw import connect, request, roundtrip

M = enums.CryptographicUsageMask
H = enums.HashingAlgorithm
HASHES: dict[Any, Callable[[], hashes.HashAlgorithm]] = {
    H.SHA_256: hashes.SHA256, H.SHA_384: hashes.SHA384, H.SHA_512: hashes.SHA512}


class Wire:
    """One TLS connection speaking raw KMIP 1.4 for the officer."""

    def __init__(self, files: ClientFiles, port: int) -> None:
        self.conn = connect(files, port)

    def send(self, op: enums.Operation, payload: Any) -> Any:
        return roundtrip(self.conn, request([(op, payload)], version=(1, 4))).batch_items[0]

    def ok(self, op: enums.Operation, payload: Any) -> Any:
        item = self.send(op, payload)
        assert item.result_status.value == enums.ResultStatus.SUCCESS, item.result_message
        return item.response_payload

    def refused(self, op: enums.Operation, payload: Any) -> tuple[Any, str]:
        item = self.send(op, payload)
        assert item.result_status.value == enums.ResultStatus.OPERATION_FAILED
        return item.result_reason.value, item.result_message.value


@pytest.fixture
def wire(officer_files: ClientFiles, kmip_listener: KmipListener) -> Iterator[Wire]:
    w = Wire(officer_files, kmip_listener.port)
    yield w
    w.conn.close()


def _pair(kmip: Any, algorithm: enums.CryptographicAlgorithm, bits: int) -> tuple[str, str, Any]:
    public, private = kmip.create_key_pair(algorithm, bits, public_usage_mask=[M.VERIFY],
                                           private_usage_mask=[M.SIGN])
    kmip.activate(public)
    kmip.activate(private)
    return public, private, serialization.load_der_public_key(kmip.get(public).value)


def _digest(hashing: enums.HashingAlgorithm, message: bytes) -> bytes:
    return hashlib.new(hashing.name.replace("_", "").lower(), message).digest()


def _sign(wire: Wire, uid: str, digest: bytes, params: Any = None) -> bytes:
    out = wire.ok(enums.Operation.SIGN, SignRequestPayload(unique_identifier=uid, cryptographic_parameters=params,
                                                           digested_data=digest))
    return bytes(out.signature_data)


def _verify(wire: Wire, uid: str, digest: bytes, signature: bytes, params: Any = None) -> Any:
    out = wire.ok(enums.Operation.SIGNATURE_VERIFY, payloads.SignatureVerifyRequestPayload(
        unique_identifier=uid, cryptographic_parameters=params, digested_data=digest, signature_data=signature))
    return out.validity_indicator


@pytest.mark.parametrize(("pad", "hashing"), [
    (enums.PaddingMethod.PSS, H.SHA_256), (enums.PaddingMethod.PSS, H.SHA_384),
    (enums.PaddingMethod.PKCS1v15, H.SHA_256), (enums.PaddingMethod.PKCS1v15, H.SHA_512)])
def test_rsa_signs_and_verifies_a_digest(kmip: Any, wire: Wire, pad: enums.PaddingMethod,
                                         hashing: enums.HashingAlgorithm) -> None:
    public, private, key = _pair(kmip, enums.CryptographicAlgorithm.RSA, 2048)
    assert isinstance(key, rsa.RSAPublicKey)
    params = attributes.CryptographicParameters(padding_method=pad, hashing_algorithm=hashing)
    message = os.urandom(2000)
    signature = _sign(wire, private, _digest(hashing, message), params)
    algorithm = HASHES[hashing]()
    scheme = (padding.PSS(mgf=padding.MGF1(HASHES[hashing]()), salt_length=algorithm.digest_size)
              if pad == enums.PaddingMethod.PSS else padding.PKCS1v15())
    key.verify(signature, message, scheme, algorithm)  # the message's own signature; raises if not
    assert _verify(wire, public, _digest(hashing, message), signature, params) == enums.ValidityIndicator.VALID
    assert _verify(wire, public, _digest(hashing, message + b"!"), signature, params) == \
        enums.ValidityIndicator.INVALID
    # and it is the signature Data would have verified: digesting is the only difference
    assert kmip.signature_verify(message, signature, uid=public, cryptographic_parameters={
        "padding_method": pad, "hashing_algorithm": hashing}) == enums.ValidityIndicator.VALID


@pytest.mark.parametrize(("bits", "hashing", "named"), [
    (256, H.SHA_256, False), (256, H.SHA_384, False), (384, H.SHA_384, True), (256, H.SHA_512, True)])
def test_ecdsa_signs_a_digest_of_the_named_or_its_lengths_hash(kmip: Any, wire: Wire, bits: int,
                                                               hashing: enums.HashingAlgorithm,
                                                               named: bool) -> None:
    """CKM_ECDSA names no hash: unnamed, a digest is of the SHA-2 hash its length says."""
    public, private, key = _pair(kmip, enums.CryptographicAlgorithm.EC, bits)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    params = attributes.CryptographicParameters(hashing_algorithm=hashing) if named else None
    message = os.urandom(500)
    signature = _sign(wire, private, _digest(hashing, message), params)
    key.verify(signature, message, ec.ECDSA(HASHES[hashing]()))
    assert _verify(wire, public, _digest(hashing, message), signature, params) == enums.ValidityIndicator.VALID


def test_a_digest_of_the_wrong_length_and_malformed_requests_are_refused_and_audited(
        kmip: Any, wire: Wire, services: Services) -> None:
    public, private, _ = _pair(kmip, enums.CryptographicAlgorithm.RSA, 2048)
    sha384 = attributes.CryptographicParameters(padding_method=enums.PaddingMethod.PSS, hashing_algorithm=H.SHA_384)
    digest = _digest(H.SHA_256, b"m")
    reason, message = wire.refused(enums.Operation.SIGN, SignRequestPayload(
        unique_identifier=private, cryptographic_parameters=sha384, digested_data=digest))
    assert reason == enums.ResultReason.INVALID_FIELD and "32 bytes, but a SHA-384 digest is 48" in message
    reason, message = wire.refused(enums.Operation.SIGN, SignRequestPayload(
        unique_identifier=private, digested_data=b"\x01" * 20))  # a SHA-1 digest: no hash of that length
    assert reason == enums.ResultReason.INVALID_FIELD and "not a SHA-256, SHA-384 or SHA-512 digest" in message
    reason, _ = wire.refused(enums.Operation.SIGNATURE_VERIFY, payloads.SignatureVerifyRequestPayload(
        unique_identifier=public, cryptographic_parameters=sha384, digested_data=digest, signature_data=b"s" * 256))
    assert reason == enums.ResultReason.INVALID_FIELD
    reason, message = wire.refused(enums.Operation.SIGN, SignRequestPayload(
        unique_identifier=private, data=b"m", digested_data=digest))
    assert reason == enums.ResultReason.INVALID_FIELD and "not both" in message
    reason, _ = wire.refused(enums.Operation.SIGN, SignRequestPayload(unique_identifier=private))
    assert reason == enums.ResultReason.MISSING_DATA
    reason, message = wire.refused(enums.Operation.SIGN, SignRequestPayload(
        unique_identifier=private, digested_data=digest, correlation_value=b"c1"))
    assert reason == enums.ResultReason.FEATURE_NOT_SUPPORTED and "not streamed" in message
    reason, _ = wire.refused(enums.Operation.SIGNATURE_VERIFY, payloads.SignatureVerifyRequestPayload(
        unique_identifier=public, digested_data=digest, signature_data=b"s" * 256, init_indicator=True))
    assert reason == enums.ResultReason.FEATURE_NOT_SUPPORTED
    # an allowed digest signature is audited as such; the refusals with their reason
    _sign(wire, private, digest)
    services.audit.flush()
    with services.db() as s:
        rows = list(s.execute(select(AuditEvent).where(AuditEvent.action.in_(("key.sign", "kmip.sign")))
                              .order_by(AuditEvent.seq.desc()).limit(6)).scalars())
    assert rows[0].action == "key.sign" and rows[0].outcome == "allowed"
    assert rows[0].details["digested"] is True and rows[0].details["mechanism"] == "RSA-PSS-SHA-256"
    assert [(r.action, r.outcome, r.details["result_reason"]) for r in rows[1:5]] == [
        ("kmip.sign", "denied", "FEATURE_NOT_SUPPORTED"), ("kmip.sign", "denied", "MISSING_DATA"),
        ("kmip.sign", "denied", "INVALID_FIELD"), ("kmip.sign", "denied", "INVALID_FIELD")]
    assert all(r.object_id == private for r in rows[1:5])
