"""SignatureVerify: with a public key (or an RSA certificate), in software: it needs no
secret. Answers Validity Indicator Valid or Invalid; Deactivated and Compromised keys
still verify."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import cryptoparams
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.SIGNATURE_VERIFY


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    if payload.data is None or payload.signature_data is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "SignatureVerify needs Data and Signature Data "
                                                           "(digested data and streaming are not supported)")
    scheme, name = cryptoparams.signature(
        cryptoparams.for_use(call, uid, "verify", payload.cryptographic_parameters))
    valid = call.engine.crypto.verify(call.ctx, uid, bytes(payload.data), bytes(payload.signature_data),
                                      scheme=scheme, hash=name)
    return payloads.SignatureVerifyResponsePayload(
        unique_identifier=uid,
        validity_indicator=enums.ValidityIndicator.VALID if valid else enums.ValidityIndicator.INVALID)
