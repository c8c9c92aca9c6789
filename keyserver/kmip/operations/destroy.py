"""Destroy: erase one key version's material (metadata stays). An Active version must
be revoked first (KMIP 1.4 §4.21)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.attributes import UniqueIdentifier
from kmip.core.messages import payloads

from keyserver.kmip.context import Call, request_uid

OPERATION = enums.Operation.DESTROY


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    obj = call.engine.objects.version_object(call.ctx, uid)
    call.engine.keys.destroy(call.ctx, str(obj.key.id), version=obj.version.version)
    return payloads.DestroyResponsePayload(unique_identifier=UniqueIdentifier(uid))
