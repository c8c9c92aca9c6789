"""RNGRetrieve: random bytes from the HSM's generator. PyKMIP 0.11 has no payload: ours is
in keyserver.kmip.payloads."""

from __future__ import annotations

from typing import Any

from kmip.core import enums

from keyserver.kmip.context import Call
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.payloads import RNGRetrieveResponsePayload

OPERATION = enums.Operation.RNG_RETRIEVE


def handle(call: Call, payload: Any) -> Any:
    if payload.data_length is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "RNGRetrieve needs a Data Length")
    return RNGRetrieveResponsePayload(data=call.engine.crypto.random(call.ctx, payload.data_length))
