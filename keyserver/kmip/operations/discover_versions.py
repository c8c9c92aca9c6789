"""DiscoverVersions: the protocol versions we speak, newest first (KMIP 1.1 §4.26)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import contents, payloads

from keyserver.kmip.context import Call

OPERATION = enums.Operation.DISCOVER_VERSIONS
SUPPORTED = ((1, 4), (1, 3), (1, 2), (1, 1), (1, 0))


def supported_versions() -> list[Any]:
    return [contents.ProtocolVersion(major, minor) for major, minor in SUPPORTED]


def handle(call: Call, payload: Any) -> Any:
    asked = payload.protocol_versions or []
    ours = supported_versions()
    if asked:
        wanted = {(v.major, v.minor) for v in asked}
        ours = [v for v in ours if (v.major, v.minor) in wanted]
    return payloads.DiscoverVersionsResponsePayload(protocol_versions=ours)
