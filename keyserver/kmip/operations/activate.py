"""Activate: a Pre-Active key version becomes Active (through KeyService); other objects
(key pairs, secret data, certificates) through their own lifecycle."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.attributes import UniqueIdentifier
from kmip.core.messages import payloads

from keyserver.core.kmip_objects import VersionObject
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.ACTIVATE


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    found = call.engine.objects.resolve(call.ctx, uid)
    if not isinstance(found, VersionObject):
        call.engine.objects.transition(call.ctx, uid, operation="activate")
        return payloads.ActivateResponsePayload(unique_identifier=UniqueIdentifier(uid))
    obj = found
    if not obj.is_newest:
        # Only a key's newest version can ever be Pre-Active: older ones were Active once.
        raise KmipFailure(enums.ResultReason.ILLEGAL_OPERATION,
                          f"object {uid} is a replaced version and cannot be activated")
    call.engine.keys.activate(call.ctx, str(obj.key.id))
    return payloads.ActivateResponsePayload(unique_identifier=UniqueIdentifier(uid))
