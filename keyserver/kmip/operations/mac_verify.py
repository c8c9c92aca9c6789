"""MACVerify: recompute the HMAC in the HSM and compare in constant time; answers Validity
Indicator Valid or Invalid. PyKMIP 0.11 has no payload: ours is in keyserver.kmip.payloads."""

from __future__ import annotations

from typing import Any

from kmip.core import enums

from keyserver.kmip import cryptoparams
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.payloads import MACVerifyResponsePayload

OPERATION = enums.Operation.MAC_VERIFY


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    if payload.data is None or payload.mac_data is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "MACVerify needs Data and MAC Data (streaming is "
                                                           "not supported)")
    valid = call.engine.crypto.mac_verify(call.ctx, uid, payload.data, payload.mac_data,
                                          hash=cryptoparams.mac_hash(
                                              cryptoparams.for_use(call, uid, "mac_verify",
                                                                   payload.cryptographic_parameters)))
    return MACVerifyResponsePayload(unique_identifier=uid, valid=valid)
