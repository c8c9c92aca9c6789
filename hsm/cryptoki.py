"""The few raw PKCS#11 calls python-pkcs11 cannot make for us, through ctypes.

python-pkcs11 0.10.1 is our binding for everything else. It falls short in three places:

* it always calls ``C_Initialize(NULL)``, which tells SoftHSM2 (and any module that
  follows the spec literally) that the application will not call it from several
  threads, so the module runs without locks and segfaults under threads. We must
  initialise first, with ``CKF_OS_LOCKING_OK`` (see docs/decisions/0002);
* it does not expose ``C_InitToken`` (token bootstrap);
* its ``Token.open(user_pin=...)`` couples login to one session whose ``close()`` calls
  ``C_Logout`` (logging out every session of the process) and leaks the session when
  ``C_Login`` fails. We log in and out ourselves on a plain session instead.

Only the Unix ABI is covered (CK_ULONG = unsigned long, natural struct alignment);
Windows modules pack structures to 1 byte and would need a different layout.
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

CK_ULONG = ctypes.c_ulong
CK_RV = CK_ULONG

CKR_OK: Final = 0x000
CKR_CANT_LOCK: Final = 0x00A
CKR_DEVICE_ERROR: Final = 0x030
CKR_DEVICE_REMOVED: Final = 0x032
CKR_PIN_INCORRECT: Final = 0x0A0
CKR_PIN_LEN_RANGE: Final = 0x0A2
CKR_PIN_LOCKED: Final = 0x0A4
CKR_SESSION_CLOSED: Final = 0x0B0
CKR_SESSION_HANDLE_INVALID: Final = 0x0B3
CKR_SESSION_EXISTS: Final = 0x0B6
CKR_TOKEN_NOT_PRESENT: Final = 0x0E0
CKR_USER_ALREADY_LOGGED_IN: Final = 0x100
CKR_USER_NOT_LOGGED_IN: Final = 0x101
CKR_USER_PIN_NOT_INITIALIZED: Final = 0x102
CKR_CRYPTOKI_NOT_INITIALIZED: Final = 0x190
CKR_CRYPTOKI_ALREADY_INITIALIZED: Final = 0x191

CKF_OS_LOCKING_OK: Final = 0x2
CKU_SO: Final = 0
CKU_USER: Final = 1
CKS_RO_USER_FUNCTIONS: Final = 1
CKS_RW_USER_FUNCTIONS: Final = 3

_RV_NAMES: Final = {
    value: name for name, value in globals().items() if name.startswith("CKR_")
}

# Order of CK_FUNCTION_LIST in PKCS#11 v2.40 (all of it, so that the offsets are right;
# we only ever call a handful).
_FUNCTION_NAMES: Final = (
    "C_Initialize", "C_Finalize", "C_GetInfo", "C_GetFunctionList", "C_GetSlotList",
    "C_GetSlotInfo", "C_GetTokenInfo", "C_GetMechanismList", "C_GetMechanismInfo", "C_InitToken",
    "C_InitPIN", "C_SetPIN", "C_OpenSession", "C_CloseSession", "C_CloseAllSessions",
    "C_GetSessionInfo", "C_GetOperationState", "C_SetOperationState", "C_Login", "C_Logout",
    "C_CreateObject", "C_CopyObject", "C_DestroyObject", "C_GetObjectSize", "C_GetAttributeValue",
    "C_SetAttributeValue", "C_FindObjectsInit", "C_FindObjects", "C_FindObjectsFinal",
    "C_EncryptInit", "C_Encrypt", "C_EncryptUpdate", "C_EncryptFinal", "C_DecryptInit",
    "C_Decrypt", "C_DecryptUpdate", "C_DecryptFinal", "C_DigestInit", "C_Digest",
    "C_DigestUpdate", "C_DigestKey", "C_DigestFinal", "C_SignInit", "C_Sign", "C_SignUpdate",
    "C_SignFinal", "C_SignRecoverInit", "C_SignRecover", "C_VerifyInit", "C_Verify",
    "C_VerifyUpdate", "C_VerifyFinal", "C_VerifyRecoverInit", "C_VerifyRecover",
    "C_DigestEncryptUpdate", "C_DecryptDigestUpdate", "C_SignEncryptUpdate",
    "C_DecryptVerifyUpdate", "C_GenerateKey", "C_GenerateKeyPair", "C_WrapKey", "C_UnwrapKey",
    "C_DeriveKey", "C_SeedRandom", "C_GenerateRandom", "C_GetFunctionStatus", "C_CancelFunction",
    "C_WaitForSlotEvent",
)


class _CkVersion(ctypes.Structure):
    _fields_ = (("major", ctypes.c_ubyte), ("minor", ctypes.c_ubyte))


class _CkFunctionList(ctypes.Structure):
    _fields_ = (("version", _CkVersion), *((name, ctypes.c_void_p) for name in _FUNCTION_NAMES))


class _CkCInitializeArgs(ctypes.Structure):
    _fields_ = (
        ("CreateMutex", ctypes.c_void_p),
        ("DestroyMutex", ctypes.c_void_p),
        ("LockMutex", ctypes.c_void_p),
        ("UnlockMutex", ctypes.c_void_p),
        ("flags", CK_ULONG),
        ("pReserved", ctypes.c_void_p),
    )


class _CkSessionInfo(ctypes.Structure):
    _fields_ = (
        ("slotID", CK_ULONG),
        ("state", CK_ULONG),
        ("flags", CK_ULONG),
        ("ulDeviceError", CK_ULONG),
    )


_C_Initialize = ctypes.CFUNCTYPE(CK_RV, ctypes.c_void_p)
_C_Finalize = ctypes.CFUNCTYPE(CK_RV, ctypes.c_void_p)
_C_InitToken = ctypes.CFUNCTYPE(CK_RV, CK_ULONG, ctypes.c_char_p, CK_ULONG, ctypes.c_char_p)
_C_Login = ctypes.CFUNCTYPE(CK_RV, CK_ULONG, CK_ULONG, ctypes.c_char_p, CK_ULONG)
_C_Logout = ctypes.CFUNCTYPE(CK_RV, CK_ULONG)
_C_GetSessionInfo = ctypes.CFUNCTYPE(CK_RV, CK_ULONG, ctypes.POINTER(_CkSessionInfo))


class CryptokiError(Exception):
    """A raw call returned something other than CKR_OK. Carries the CK_RV only."""

    def __init__(self, function: str, rv: int) -> None:
        self.function = function
        self.rv = rv
        super().__init__(f"{function} returned {rv_name(rv)}")


def rv_name(rv: int) -> str:
    return _RV_NAMES.get(rv, f"CKR_0x{rv:08X}")


class RawModule:
    """A dlopen()ed PKCS#11 module and its function list.

    Holding the ctypes handle for the life of the process keeps the library mapped even
    when python-pkcs11 dlclose()s its own handle to the same file: both share one copy
    of the module's state, which is what makes our C_Initialize count for python-pkcs11.
    """

    def __init__(self, path: str) -> None:
        # OSError propagates: the caller turns it into advice about the module path.
        self._dll = ctypes.CDLL(path)
        function_list = ctypes.POINTER(_CkFunctionList)()
        rv = int(self._dll.C_GetFunctionList(ctypes.byref(function_list)))
        if rv != CKR_OK:
            raise CryptokiError("C_GetFunctionList", rv)
        self._functions: _CkFunctionList = function_list.contents

    def _function(self, name: str, prototype: Any) -> Any:
        address = getattr(self._functions, name)
        if not address:
            raise CryptokiError(name, 0x54)  # CKR_FUNCTION_NOT_SUPPORTED
        return prototype(address)

    def initialize_with_os_locking(self) -> int:
        """C_Initialize telling the module we are multi-threaded; returns the CK_RV.

        The caller decides what CKR_CANT_LOCK / CKR_CRYPTOKI_ALREADY_INITIALIZED mean.
        """
        args = _CkCInitializeArgs(flags=CKF_OS_LOCKING_OK)
        return int(self._function("C_Initialize", _C_Initialize)(ctypes.byref(args)))

    def initialize_single_threaded(self) -> int:
        return int(self._function("C_Initialize", _C_Initialize)(None))

    def finalize(self) -> int:
        return int(self._function("C_Finalize", _C_Finalize)(None))

    def init_token(self, slot_id: int, *, so_pin: str, label: str) -> None:
        # The label is a fixed 32-byte field padded with blanks, not a C string.
        raw_label = label.encode("utf-8").ljust(32, b" ")
        pin = so_pin.encode("utf-8")
        rv = int(self._function("C_InitToken", _C_InitToken)(slot_id, pin, len(pin), raw_label))
        if rv != CKR_OK:
            raise CryptokiError("C_InitToken", rv)

    def login(self, session_handle: int, *, user_type: int, pin: str) -> int:
        """C_Login; returns the CK_RV so that USER_ALREADY_LOGGED_IN can count as success."""
        raw = pin.encode("utf-8")
        return int(self._function("C_Login", _C_Login)(session_handle, user_type, raw, len(raw)))

    def logout(self, session_handle: int) -> int:
        return int(self._function("C_Logout", _C_Logout)(session_handle))

    def session_state(self, session_handle: int) -> int:
        """CKS_* state of a session; raises CryptokiError (e.g. SESSION_HANDLE_INVALID)."""
        info = _CkSessionInfo()
        rv = int(self._function("C_GetSessionInfo", _C_GetSessionInfo)(
            session_handle, ctypes.byref(info)
        ))
        if rv != CKR_OK:
            raise CryptokiError("C_GetSessionInfo", rv)
        return int(info.state)
