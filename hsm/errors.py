"""The flat set of errors the HSM layer raises.

Callers (keyserver/core) translate these at their own edge; nothing above `hsm`
ever sees a python-pkcs11 exception.
"""


class HsmError(Exception):
    """Base class of every error raised by the hsm package."""


class HsmUnavailable(HsmError):
    """The module cannot be loaded, the token is missing, locked or not logged in.

    The message says what the operator should do next; it never contains key bytes.
    """


class HsmKeyNotFound(HsmError):
    """A key-encryption key (or the audit HMAC key) with the given id is not in the token."""


class HsmIntegrityError(HsmError):
    """A wrapped blob did not unwrap or decrypt: wrong key, tampered or truncated.

    Deliberately opaque: it does not say which check failed.
    """


class HsmInvalidInput(HsmError):
    """The caller passed something the HSM cannot use (bad public key, wrong size, ...)."""


class HsmConfigError(HsmError):
    """The configuration is unsafe or inconsistent (e.g. default PINs outside local dev)."""
