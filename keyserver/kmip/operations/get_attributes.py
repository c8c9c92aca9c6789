"""GetAttributes: the named attributes (all when none are named) of one object."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import attributes
from keyserver.kmip.context import Call, request_uid

OPERATION = enums.Operation.GET_ATTRIBUTES


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    values = attributes.values_of(call.engine.objects.resolve(call.ctx, uid))
    names = [str(n) for n in payload.attribute_names or []]
    return payloads.GetAttributesResponsePayload(unique_identifier=uid,
                                                 attributes=attributes.build(values, names or None))
