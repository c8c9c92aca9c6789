"""SignatureVerify: with a public key (or an RSA certificate), in software: it needs no
secret. Answers Validity Indicator Valid or Invalid; Deactivated and Compromised keys
still verify. Data or Digested Data, as for Sign; streaming is refused."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import cryptoparams
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.operations.sign import message_of

OPERATION = enums.Operation.SIGNATURE_VERIFY


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    data, digested = message_of(payload, "SignatureVerify")
    if payload.signature_data is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "SignatureVerify needs Signature Data")
    scheme, name = cryptoparams.signature(
        cryptoparams.for_use(call, uid, "verify", payload.cryptographic_parameters))
    valid = call.engine.crypto.verify(call.ctx, uid, data, bytes(payload.signature_data),
                                      scheme=scheme, hash=name, digested=digested)
    return payloads.SignatureVerifyResponsePayload(
        unique_identifier=uid,
        validity_indicator=enums.ValidityIndicator.VALID if valid else enums.ValidityIndicator.INVALID)
