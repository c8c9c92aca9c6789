"""The OpenSSL error queue a failed token call leaves behind, cleared.

SoftHSM2 is built on the system's libcrypto, the same one Python's `ssl` uses, and its
error queue is per thread. A token operation that fails inside OpenSSL (an RFC 5649
unwrap whose integrity check fails, an OAEP decoding error) leaves an entry there that
SoftHSM2 never clears; the next TLS read on that thread that has to wait for data then
reports the stale entry as its own failure (`SSL_get_error` looks at the queue first),
and the KMIP connection drops ("[EVP: UPDATE_ERROR] update error"; a KMIP Decrypt of a
bad RSA-OAEP ciphertext did it too). The session runner (`Pkcs11Core._run`) calls
`clear()` after every failed token operation."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _libcrypto() -> Any:
    name = ctypes.util.find_library("crypto")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)  # the instance already loaded (by ssl and the token), not a second copy
    except OSError:
        return None


def clear() -> None:
    """Empty this thread's OpenSSL error queue (nothing to do without a system libcrypto)."""
    lib = _libcrypto()
    if lib is not None:
        lib.ERR_clear_error()
