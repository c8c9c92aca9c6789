"""Destroy: erase one key version's material, or a private key's or secret data's
(metadata stays). An Active object must be revoked first (KMIP 1.4 §4.21)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.attributes import UniqueIdentifier
from kmip.core.messages import payloads

from keyserver.core.kmip_objects import VersionObject
from keyserver.kmip.context import Call, request_uid

OPERATION = enums.Operation.DESTROY


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    ref = call.engine.objects.version_ref(call.ctx, uid)
    if ref is not None:
        call.engine.keys.destroy(call.ctx, str(ref.key_id), version=ref.version)
        return payloads.DestroyResponsePayload(unique_identifier=UniqueIdentifier(uid))
    obj = call.engine.objects.resolve(call.ctx, uid)
    if not isinstance(obj, VersionObject):
        call.engine.objects.transition(call.ctx, uid, operation="destroy")
        return payloads.DestroyResponsePayload(unique_identifier=UniqueIdentifier(uid))
    call.engine.keys.destroy(call.ctx, str(obj.key.id), version=obj.version.version)
    return payloads.DestroyResponsePayload(unique_identifier=UniqueIdentifier(uid))
