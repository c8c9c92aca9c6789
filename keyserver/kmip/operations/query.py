"""Query: operations and object types this server supports, and who it is."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip.context import Call

OPERATION = enums.Operation.QUERY
VENDOR = "Strongroom"


def handle(call: Call, payload: Any) -> Any:
    from keyserver.kmip.operations import REGISTRY

    functions = set(payload.query_functions or [])
    operations = objects = vendor = None
    if enums.QueryFunction.QUERY_OPERATIONS in functions:
        operations = sorted(REGISTRY, key=lambda op: op.value)
    if enums.QueryFunction.QUERY_OBJECTS in functions:
        objects = [enums.ObjectType.SYMMETRIC_KEY, enums.ObjectType.PUBLIC_KEY, enums.ObjectType.PRIVATE_KEY,
                   enums.ObjectType.SECRET_DATA, enums.ObjectType.CERTIFICATE, enums.ObjectType.OPAQUE_DATA]
    if enums.QueryFunction.QUERY_SERVER_INFORMATION in functions:
        vendor = VENDOR
    return payloads.QueryResponsePayload(operations=operations, object_types=objects,
                                         vendor_identification=vendor)
