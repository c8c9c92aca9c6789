"""Sign: RSA-PSS (default, SHA-256) or PKCS#1 v1.5 with a private key opened only inside the HSM."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import cryptoparams
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.SIGN


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    if payload.data is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "Sign needs Data (digested data and streaming are "
                                                           "not supported)")
    scheme, name = cryptoparams.signature(cryptoparams.for_use(call, uid, "sign", payload.cryptographic_parameters))
    signature = call.engine.crypto.sign(call.ctx, uid, bytes(payload.data), scheme=scheme, hash=name)
    return payloads.SignResponsePayload(unique_identifier=uid, signature_data=signature)
