"""Activate: a Pre-Active key version becomes Active (through KeyService)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.attributes import UniqueIdentifier
from kmip.core.messages import payloads

from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.ACTIVATE


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    obj = call.engine.objects.version_object(call.ctx, uid)
    if not obj.is_newest:
        # Only a key's newest version can ever be Pre-Active: older ones were Active once.
        raise KmipFailure(enums.ResultReason.ILLEGAL_OPERATION,
                          f"object {uid} is a replaced version and cannot be activated")
    call.engine.keys.activate(call.ctx, str(obj.key.id))
    return payloads.ActivateResponsePayload(unique_identifier=UniqueIdentifier(uid))
