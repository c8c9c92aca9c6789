"""Sorting PKCS#11 failures into what the caller can do about them.

Every python-pkcs11 exception and every raw CK_RV is classified here and nowhere else;
`hsm.pkcs11` turns the class into one of the errors of `hsm.errors`. The same return
code means different things in different operations (CKR_GENERAL_ERROR from C_Decrypt
is SoftHSM2's answer to a bad GCM tag, from C_Login it is a broken token), so the
operation tells us what a "crypto" failure means for it.
"""

from __future__ import annotations

import enum
from typing import Final

from pkcs11 import exceptions as p11

from hsm import cryptoki


class Fault(enum.Enum):
    # The session or login went away (token removed, logged out behind our back,
    # handles invalidated): re-open sessions, log in again, retry once.
    SESSION_LOST = "session-lost"
    # The token ran the operation and refused the data or the key: tampered or wrong
    # ciphertext for unwrap/decrypt, an unusable key or argument elsewhere.
    CRYPTO = "crypto"
    # Retrying will not help; the operator must act (PIN, memory, write protection...).
    UNAVAILABLE = "unavailable"


_SESSION_LOST: Final[tuple[type[p11.PKCS11Error], ...]] = (
    p11.SessionHandleInvalid,
    p11.SessionClosed,
    p11.UserNotLoggedIn,
    p11.DeviceRemoved,
    p11.DeviceError,
    p11.TokenNotPresent,
    p11.TokenNotRecognised,
    # SoftHSM2 drops private object handles on logout: a handle that was valid a
    # moment ago is the first sign that the login is gone.
    p11.ObjectHandleInvalid,
    p11.KeyHandleInvalid,
    p11.UnwrappingKeyHandleInvalid,
    p11.WrappingKeyHandleInvalid,
)

_UNAVAILABLE: Final[tuple[type[p11.PKCS11Error], ...]] = (
    p11.PinIncorrect,
    p11.PinLocked,
    p11.PinExpired,
    p11.PinInvalid,
    p11.PinLenRange,
    p11.UserPinNotInitialized,
    p11.DeviceMemory,
    p11.HostMemory,
    p11.SessionCount,
    p11.TokenWriteProtected,
    p11.SessionReadOnly,
    p11.MechanismInvalid,
    p11.FunctionNotSupported,
    p11.FunctionRejected,
    p11.NoSuchToken,
    p11.MultipleTokensReturned,
)

_RAW_SESSION_LOST: Final = frozenset(
    {
        cryptoki.CKR_SESSION_HANDLE_INVALID,
        cryptoki.CKR_SESSION_CLOSED,
        cryptoki.CKR_USER_NOT_LOGGED_IN,
        cryptoki.CKR_DEVICE_REMOVED,
        cryptoki.CKR_DEVICE_ERROR,
        cryptoki.CKR_TOKEN_NOT_PRESENT,
    }
)


def classify(exc: BaseException) -> Fault:
    if isinstance(exc, cryptoki.CryptokiError):
        return Fault.SESSION_LOST if exc.rv in _RAW_SESSION_LOST else Fault.UNAVAILABLE
    if isinstance(exc, _SESSION_LOST):
        return Fault.SESSION_LOST
    if isinstance(exc, _UNAVAILABLE):
        return Fault.UNAVAILABLE
    if type(exc) is p11.PKCS11Error:
        # python-pkcs11 uses the bare base class for "should never happen" codes such
        # as CKR_CRYPTOKI_NOT_INITIALIZED: nothing a retry can mend.
        return Fault.UNAVAILABLE
    return Fault.CRYPTO


def describe(exc: BaseException) -> str:
    """A name for the failure that is safe to log and show: never data, never key bytes."""
    if isinstance(exc, cryptoki.CryptokiError):
        return cryptoki.rv_name(exc.rv)
    return type(exc).__name__


def is_pin_problem(exc: BaseException) -> bool:
    if isinstance(exc, cryptoki.CryptokiError):
        return exc.rv in {
            cryptoki.CKR_PIN_INCORRECT,
            cryptoki.CKR_PIN_LOCKED,
            cryptoki.CKR_PIN_LEN_RANGE,
            cryptoki.CKR_USER_PIN_NOT_INITIALIZED,
        }
    return isinstance(
        exc, p11.PinIncorrect | p11.PinLocked | p11.PinLenRange | p11.UserPinNotInitialized
    )
