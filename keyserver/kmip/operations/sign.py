"""Sign: RSA-PSS (default, SHA-256) or PKCS#1 v1.5 with a private key opened only inside the HSM;
ECDSA with an EC key. Data is hashed by the server; Digested Data (KMIP 1.4) is a digest the
client computed, signed as it is (the named hash's length, or unnamed: SHA-256/384/512 by its
length). Streaming (Correlation Value, Init/Final Indicator) is refused."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import cryptoparams
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.SIGN
R = enums.ResultReason


def message_of(payload: Any, operation: str) -> tuple[bytes, bool]:
    """(the bytes to sign or verify, whether they are a digest): Data or Digested Data, one of them."""
    if any(getattr(payload, f, None) is not None for f in ("correlation_value", "init_indicator", "final_indicator")):
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, f"{operation} is not streamed here: send the whole Data or the "
                                                   "Digested Data in one request (no Correlation Value, Init or "
                                                   "Final Indicator)")
    data, digested = payload.data, getattr(payload, "digested_data", None)
    if data is not None and digested is not None:
        raise KmipFailure(R.INVALID_FIELD, f"{operation} takes Data or Digested Data, not both")
    if data is None and digested is None:
        raise KmipFailure(R.MISSING_DATA, f"{operation} needs Data or Digested Data")
    return (bytes(digested), True) if digested is not None else (bytes(data), False)


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    data, digested = message_of(payload, "Sign")
    scheme, name = cryptoparams.signature(cryptoparams.for_use(call, uid, "sign", payload.cryptographic_parameters))
    signature = call.engine.crypto.sign(call.ctx, uid, data, scheme=scheme, hash=name, digested=digested)
    return payloads.SignResponsePayload(unique_identifier=uid, signature_data=signature)
