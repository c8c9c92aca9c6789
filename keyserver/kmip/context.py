"""What an operation handler gets: the caller and the core services it may use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keyserver.core.crypto import CryptoService
from keyserver.core.keys import KeyService
from keyserver.core.kmip_objects import KmipObjectService
from keyserver.core.principal import RequestContext


@dataclass(frozen=True, slots=True)
class Engine:
    keys: KeyService
    objects: KmipObjectService
    crypto: CryptoService


@dataclass(frozen=True, slots=True)
class Call:
    ctx: RequestContext
    engine: Engine


def request_uid(payload: Any) -> str:
    """The request's Unique Identifier as a string, whether PyKMIP's payload holds a
    str or an old-style UniqueIdentifier primitive. ID placeholders are not supported."""
    from kmip.core import enums

    from keyserver.kmip.errors import KmipFailure

    value = payload.unique_identifier
    value = getattr(value, "value", value)
    if not value:
        raise KmipFailure(enums.ResultReason.MISSING_DATA,
                          "a unique identifier is required (ID placeholders are not supported)")
    return str(value)
