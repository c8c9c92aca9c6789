"""ReKey: server-side rotation. The replacement is a new version (a new unique
identifier), Active at once; the replaced one is Deactivated. A Pre-Active key's
replacement is Pre-Active (activate it when it is wanted), the replaced version
Deactivated. Only the newest version of a key can be re-keyed (an older one has been
replaced already)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.REKEY


def handle(call: Call, payload: Any) -> Any:
    template = payload.template_attribute
    # PyKMIP's client always sends a template, usually empty: only a non-empty one is refused.
    if payload.offset is not None or (template is not None and (template.attributes or template.names)):
        raise KmipFailure(enums.ResultReason.FEATURE_NOT_SUPPORTED,
                          "ReKey with an Offset or a template is not supported")
    uid = request_uid(payload)
    obj = call.engine.objects.version_object(call.ctx, uid, right="manage")
    if not obj.is_newest:
        raise KmipFailure(enums.ResultReason.ILLEGAL_OPERATION,
                          f"object {uid} has been replaced already; re-key its replacement")
    key = call.engine.keys.rotate(call.ctx, str(obj.key.id), reason="kmip-rekey", pre_active=True)
    return payloads.RekeyResponsePayload(unique_identifier=str(key.versions[-1].id))
