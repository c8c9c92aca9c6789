"""Domain errors of the keyserver core. Translated only at the edges (REST → problem
JSON, KMIP → result reason). Messages are for the caller and never hold key bytes."""

from __future__ import annotations


class CoreError(Exception):
    code = "error"

    def __init__(self, message: str, *, code: str | None = None,
                 errors: list[dict[str, object]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        # What the message lists, for programs (REST: the problem's `errors` member).
        self.errors = errors


class InvalidInput(CoreError):
    code = "invalid_input"


class NotFound(CoreError):
    code = "not_found"


class Hidden(NotFound):
    """Not found as far as the caller may know, though it exists (KMIP tenancy): the policy
    layer has audited the refusal already (Policy.hide)."""


class Conflict(CoreError):
    """The request is valid but the object's state forbids it (e.g. rotating a destroyed key)."""

    code = "conflict"


class Unauthenticated(CoreError):
    code = "unauthenticated"


class Forbidden(CoreError):
    code = "forbidden"


class RateLimited(CoreError):
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ServiceUnavailable(CoreError):
    """A dependency (HSM, database) is not usable; the message says what to do."""

    code = "unavailable"


class StoreBusy(ServiceUnavailable):
    """Other writes hold what this one needs; nothing was changed, retry in a moment."""

    code = "store_busy"


class IntegrityFailure(CoreError):
    """A blob failed authentication. Deliberately says nothing about why."""

    code = "integrity_failure"

    def __init__(self) -> None:
        super().__init__("the ciphertext blob is invalid, corrupted or not for this context")


def hsm_failure(doing: str, exc: BaseException) -> ServiceUnavailable:
    """The one shape of an HSM failure seen by callers: 503 `hsm_unavailable`, with the
    HSM layer's own advice (which never contains key bytes)."""
    return ServiceUnavailable(f"the HSM could not {doing}: {exc}", code="hsm_unavailable")
