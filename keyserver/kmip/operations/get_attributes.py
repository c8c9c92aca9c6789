"""GetAttributes: the named attributes (all when none are named) of one object. Audited
like every operation (kmip.get_attributes)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import attributes
from keyserver.kmip.context import Call, request_uid

OPERATION = enums.Operation.GET_ATTRIBUTES


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    names = attributes.requested_names([str(n) for n in payload.attribute_names or []])
    values = attributes.values_of(call.engine.objects.read(call.ctx, uid, action="kmip.get_attributes"))
    return payloads.GetAttributesResponsePayload(unique_identifier=uid,
                                                 attributes=attributes.build(values, names or None))
