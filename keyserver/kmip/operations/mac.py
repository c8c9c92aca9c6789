"""MAC: HMAC-SHA256/384/512 with an HMAC key, inside the HSM. (PyKMIP's MAC payload is of
the old style: UniqueIdentifier, Data and MACData objects rather than plain values.)"""

from __future__ import annotations

from typing import Any

from kmip.core import attributes, enums
from kmip.core.messages import payloads
from kmip.core.objects import MACData

from keyserver.kmip import cryptoparams
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.MAC


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    if payload.data is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "MAC needs Data")
    tag = call.engine.crypto.mac(call.ctx, uid, bytes(payload.data.value),
                                 hash=cryptoparams.mac_hash(
                                     cryptoparams.for_use(call, uid, "mac", payload.cryptographic_parameters)))
    return payloads.MACResponsePayload(unique_identifier=attributes.UniqueIdentifier(uid), mac_data=MACData(tag))
