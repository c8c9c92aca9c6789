"""The one place where failures become KMIP result reasons."""

from __future__ import annotations

import logging

from kmip.core import enums

from keyserver.core.errors import (
    Conflict,
    CoreError,
    Forbidden,
    IntegrityFailure,
    InvalidInput,
    NotFound,
    Unauthenticated,
)

log = logging.getLogger(__name__)
Reason = enums.ResultReason


class KmipFailure(Exception):
    """A protocol-level refusal raised by the engine itself (not by the core)."""

    def __init__(self, reason: enums.ResultReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class NotSupported(KmipFailure):
    def __init__(self, message: str) -> None:
        super().__init__(Reason.OPERATION_NOT_SUPPORTED, message)


def translate(exc: BaseException) -> tuple[enums.ResultReason, str]:
    """(result reason, message) for any failure; unknown ones are logged and hidden."""
    if isinstance(exc, KmipFailure):
        return exc.reason, exc.message
    if isinstance(exc, CoreError):
        reason: enums.ResultReason
        if isinstance(exc, NotFound):
            reason = Reason.ITEM_NOT_FOUND
        elif isinstance(exc, InvalidInput):
            reason = Reason.INVALID_FIELD
        elif isinstance(exc, Forbidden):
            reason = Reason.PERMISSION_DENIED
        elif isinstance(exc, Unauthenticated):
            reason = Reason.AUTHENTICATION_NOT_SUCCESSFUL
        elif isinstance(exc, IntegrityFailure):
            reason = Reason.CRYPTOGRAPHIC_FAILURE
        elif isinstance(exc, Conflict):
            # KMIP 1.x has no "wrong lifecycle state" reason: state conflicts are illegal operations.
            reason = (Reason.OBJECT_ALREADY_EXISTS if exc.code in ("key_exists", "kmip_client_exists")
                      else Reason.ILLEGAL_OPERATION)
        else:  # ServiceUnavailable, RateLimited: the caller may retry
            reason = Reason.GENERAL_FAILURE
        return reason, exc.message
    log.exception("KMIP operation failed unexpectedly", exc_info=exc)
    return Reason.GENERAL_FAILURE, "the operation failed on the server; see its log"
