"""The compiled format engine: a ctypes binding of libsrcf (agents/dataplane).

The library is the C implementation of format v1 against OpenSSL 3 that the data plane
is built on. It ships inside the `agents` package, at `agents/dataplane/build/libsrcf.so`
in a checkout (built by `make -C agents/dataplane lib`, which `scripts/start` and
`scripts/test` run) and at the same place in the agent wheel the key server serves. No
compiler is needed on a host: ctypes loads the library as built on the server.

What crosses the boundary: key versions are copied once into the library's locked,
non-dumpable memory (`NativeKey`); file keys are made and unwrapped inside it and never
come back to Python (`NativeFile`). Plaintext and ciphertext pass by pointer, without
copies, for `bytes`, `bytearray` and writable `memoryview` buffers. ctypes releases the
GIL for every call, so threads seal and open in parallel.

On a host where the library cannot be used (another architecture, musl, no OpenSSL 3,
an older build), `available()` is False and `unavailable_reason()` says why; `load()`
raises NativeUnavailable with the same words. The whole-file operations then use the
Python reference implementation (agents/cryptfile/transform.py).
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys
import threading
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from agents.cryptfile.errors import CryptfileError, FormatError, IntegrityError, KeyUnavailable
from agents.cryptfile.header import FILE_KEY_SIZE, HEADER_SIZE, NONCE_SIZE, PREFIX, FileHeader
from agents.cryptfile.keys import KeyVersion

log = logging.getLogger(__name__)

ABI_VERSION = 1  # SRCF_ABI_VERSION of include/srcf.h this binding is written against
LIBRARY = Path(__file__).resolve().parent.parent / "dataplane" / "build" / "libsrcf.so"
NO_FINAL = 2**64 - 1

# srcf_status codes (include/srcf.h)
OK = 0
E_ARGUMENT, E_CHUNK_SIZE, E_OVERFLOW, E_NOMEM, E_MLOCK, E_CRYPTO, E_RANDOM, E_FORKED = 1, 2, 3, 4, 5, 6, 7, 8
E_WRONG_KEY = 20
E_INTEGRITY, E_FILE_LENGTH = 30, 31

# ELF e_machine values and what platform.machine() calls them.
_ELF_MACHINES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390x", 40: "arm", 62: "x86_64",
                 183: "aarch64", 243: "riscv64", 258: "loongarch64"}
_HOST_ALIASES = {"amd64": "x86_64", "arm64": "aarch64", "i686": "i386", "i586": "i386", "armv7l": "arm",
                 "armv6l": "arm", "ppc64le": "ppc64"}


class NativeUnavailable(CryptfileError):
    """The compiled engine cannot be used on this host; the message says why."""


_P = ctypes.c_void_p
_SIZE = ctypes.c_size_t
_U32, _U64 = ctypes.c_uint32, ctypes.c_uint64
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "srcf_abi_version": (ctypes.c_int, []),
    "srcf_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "srcf_key_new": (ctypes.c_int, [ctypes.POINTER(_P), _P, _U32, _P]),
    "srcf_key_free": (None, [_P]),
    "srcf_header_parse": (ctypes.c_int, [_P, _SIZE, _P]),
    "srcf_file_create_fixed": (ctypes.c_int, [ctypes.POINTER(_P), _P, _P, _U32, _P, _P, _P]),
    "srcf_file_open": (ctypes.c_int, [ctypes.POINTER(_P), _P, _SIZE, _P]),
    "srcf_file_rewrap": (ctypes.c_int, [_P, _P, _P, _P]),
    "srcf_file_free": (None, [_P]),
    "srcf_file_chunks_sealed": (_U64, [_P]),
    "srcf_seal_run": (ctypes.c_int, [_P, _U64, _U64, _P, _SIZE, _P, _SIZE, ctypes.POINTER(_SIZE), _P]),
    "srcf_open_run": (ctypes.c_int, [_P, _U64, _U64, _P, _SIZE, _P, _SIZE, ctypes.POINTER(_SIZE),
                                     ctypes.POINTER(_U64)]),
    "srcf_plaintext_size": (ctypes.c_int, [_U64, _U32, ctypes.POINTER(_U64)]),
    "srcf_stored_size": (ctypes.c_int, [_U64, _U32, ctypes.POINTER(_U64)]),
    "srcf_chunk_count": (ctypes.c_int, [_U64, _U32, ctypes.POINTER(_U64)]),
    "srcf_chunk_offset": (ctypes.c_int, [_U64, _U32, ctypes.POINTER(_U64)]),
    "srcf_run_stored_len": (ctypes.c_int, [_SIZE, _U32, ctypes.POINTER(_SIZE)]),
}


class _Header(ctypes.Structure):
    _fields_ = [("chunk_size", _U32), ("file_id", ctypes.c_uint8 * 16), ("key_id", ctypes.c_uint8 * 16),
                ("key_version", _U32)]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_reason: str | None = None


def _elf_machine(path: Path) -> str | None:
    """The architecture an ELF file was built for, None when unknown."""
    with open(path, "rb") as f:
        ident = f.read(20)
    if len(ident) < 20 or ident[:4] != b"\x7fELF":
        return None
    machine = int.from_bytes(ident[18:20], "little" if ident[5] == 1 else "big")
    return _ELF_MACHINES.get(machine, f"ELF machine {machine}")


def _check_host(path: Path) -> str | None:
    """Why a library at `path` cannot be used here, or None."""
    if not path.is_file():
        return f"the compiled engine is not built: {path} is missing (make -C agents/dataplane lib)"
    if not sys.platform.startswith("linux"):
        return f"the compiled engine is built for Linux; this host runs {sys.platform}"
    libc, _ = platform.libc_ver()
    if libc != "glibc":
        return f"the compiled engine is built against glibc; this host's C library is {libc or 'unknown'}"
    built = _elf_machine(path)
    host = platform.machine().lower()
    host = _HOST_ALIASES.get(host, host)
    if built is None:
        return f"{path} is not a shared library (not ELF)"
    if built != host:
        return f"the compiled engine was built for {built} and this host is {host}"
    return None


def _open_library(path: Path) -> ctypes.CDLL:
    reason = _check_host(path)
    if reason is not None:
        raise NativeUnavailable(reason)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeUnavailable(f"cannot load {path}: {exc} (it needs glibc >= 2.4 and OpenSSL 3's "
                                "libcrypto.so.3)") from None
    try:
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except AttributeError as exc:
        raise NativeUnavailable(f"{path} is not the library this agent expects: {exc}") from None
    abi = lib.srcf_abi_version()
    if abi != ABI_VERSION:
        raise NativeUnavailable(f"{path} speaks ABI {abi}, this agent ABI {ABI_VERSION}: rebuild it "
                                "(make -C agents/dataplane lib)")
    return lib


def load(path: Path | None = None) -> ctypes.CDLL:
    """The loaded library (once per process); raises NativeUnavailable with the reason.
    `path` loads another copy, uncached (tests)."""
    global _lib, _reason
    if path is not None:
        return _open_library(path)
    with _lock:
        if _lib is None and _reason is None:
            try:
                _lib = _open_library(LIBRARY)
            except NativeUnavailable as exc:
                _reason = str(exc)
                log.warning("format engine: %s; whole-file operations use the Python reference", _reason)
        if _lib is None:
            raise NativeUnavailable(_reason or "unavailable")
        return _lib


def available() -> bool:
    try:
        load()
    except NativeUnavailable:
        return False
    return True


def unavailable_reason() -> str | None:
    try:
        load()
    except NativeUnavailable as exc:
        return str(exc)
    return None


def describe() -> str:
    """One line for `kms-agent status`: which engine the whole-file operations use."""
    reason = unavailable_reason()
    return f"native ({LIBRARY})" if reason is None else f"python reference ({reason})"


# --- buffers -------------------------------------------------------------------------
Buffer = bytes | bytearray | memoryview


def _in(buf: Buffer) -> Any:
    """A pointer to a buffer the library only reads (no copy unless read-only memoryview)."""
    if isinstance(buf, bytes):
        return buf
    if isinstance(buf, memoryview) and buf.readonly:
        return bytes(buf)
    return (ctypes.c_char * len(buf)).from_buffer(buf)


def _out(buf: bytearray | memoryview) -> Any:
    """A pointer to a buffer the library writes into."""
    return (ctypes.c_char * len(buf)).from_buffer(buf)


def _message(lib: ctypes.CDLL, rc: int) -> str:
    text: bytes = lib.srcf_strerror(rc)
    return text.decode()


def _fail(lib: ctypes.CDLL, rc: int, *, path: str = "", where: str = "header") -> CryptfileError | Exception:
    """The Python exception for a status code (raised by the caller)."""
    if 10 <= rc <= 19:
        return FormatError(_message(lib, rc))
    if rc == E_WRONG_KEY:
        return KeyUnavailable(_message(lib, rc))
    if rc in (E_INTEGRITY, E_FILE_LENGTH):
        return IntegrityError(path, where)
    if rc in (E_NOMEM, E_MLOCK):
        return MemoryError(_message(lib, rc))
    if rc in (E_ARGUMENT, E_CHUNK_SIZE, E_OVERFLOW):
        return ValueError(_message(lib, rc))
    return CryptfileError(_message(lib, rc))


# --- header and sizes -----------------------------------------------------------------
def parse_header(data: bytes) -> FileHeader:
    """Parse and validate a header without a key (FormatError with the reason)."""
    lib = load()
    h = _Header()
    rc = lib.srcf_header_parse(data, len(data), ctypes.byref(h))
    if rc != OK:
        raise _fail(lib, rc)
    return FileHeader(h.chunk_size, bytes(h.file_id), uuid.UUID(bytes=bytes(h.key_id)), h.key_version,
                      bytes(data[PREFIX.size:HEADER_SIZE]))


def _size_call(name: str, value: int, chunk_size: int) -> int:
    lib = load()
    out = _U64()
    rc = getattr(lib, name)(value, chunk_size, ctypes.byref(out))
    if rc != OK:
        raise ValueError(_message(lib, rc))
    return int(out.value)


def plaintext_size(file_len: int, chunk_size: int) -> int:
    """Plaintext bytes of a file `file_len` bytes long; ValueError when no valid file has
    that length."""
    return _size_call("srcf_plaintext_size", file_len, chunk_size)


def stored_size(size: int, chunk_size: int) -> int:
    return _size_call("srcf_stored_size", size, chunk_size)


def chunk_count(size: int, chunk_size: int) -> int:
    return _size_call("srcf_chunk_count", size, chunk_size)


def chunk_offset(index: int, chunk_size: int) -> int:
    return _size_call("srcf_chunk_offset", index, chunk_size)


def run_stored_len(plain_len: int, chunk_size: int) -> int:
    """Bytes `NativeFile.seal_run` writes for `plain_len` plaintext bytes."""
    lib = load()
    out = _SIZE()
    rc = lib.srcf_run_stored_len(plain_len, chunk_size, ctypes.byref(out))
    if rc != OK:
        raise ValueError(_message(lib, rc))
    return int(out.value)


# --- keys and files -------------------------------------------------------------------
class NativeKey:
    """A key version copied into the library's locked memory; wiped on close()."""

    def __init__(self, key: KeyVersion) -> None:
        self._lib = load()
        self.key_id, self.version = key.key_id, key.version
        handle = _P()
        rc = self._lib.srcf_key_new(ctypes.byref(handle), key.key_id.bytes, key.version, key.material)
        if rc != OK:
            raise _fail(self._lib, rc)
        self._handle: int | None = handle.value

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise ValueError("the key is closed")
        return self._handle

    def close(self) -> None:
        if self._handle is not None:
            self._lib.srcf_key_free(self._handle)
            self._handle = None

    def __enter__(self) -> NativeKey:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class NativeFile:
    """One file's crypto state inside the library: its file key (locked memory, never
    returned to Python), file id and chunk size, and keyed cipher contexts. Safe to use
    from several threads at once; `path` only names the file in errors."""

    def __init__(self, lib: ctypes.CDLL, handle: int, header: bytes, *, path: str) -> None:
        self._lib = lib
        self._handle: int | None = handle
        self.header = header
        self.path = path
        self.chunk_size = int.from_bytes(header[8:12], "big")
        self.file_id = bytes(header[12:28])

    @classmethod
    def create(cls, key: NativeKey, *, chunk_size: int, path: str = "", file_key: bytes | None = None,
               file_id: bytes | None = None, wrap_nonce: bytes | None = None) -> NativeFile:
        """A new file: fresh file id and file key wrapped under `key`; its header is
        `.header`. The fixed inputs are for test vectors only."""
        for value, size in ((file_key, FILE_KEY_SIZE), (file_id, 16), (wrap_nonce, NONCE_SIZE)):
            if value is not None and len(value) != size:
                raise ValueError("fixed inputs must be 32 (file key), 16 (file id) and 12 (nonce) bytes")
        lib = load()
        handle = _P()
        header = bytearray(HEADER_SIZE)
        rc = lib.srcf_file_create_fixed(ctypes.byref(handle), _out(header), key.handle, chunk_size, file_key,
                                        file_id, wrap_nonce)
        if rc != OK:
            raise _fail(lib, rc, path=path)
        assert handle.value is not None
        return cls(lib, handle.value, bytes(header), path=path)

    @classmethod
    def open(cls, header: bytes, key: NativeKey, *, path: str = "") -> NativeFile:
        """Unwrap the file key of `header` under `key`: FormatError (not a v1 header),
        KeyUnavailable (`key` is not the version it names), IntegrityError at "header"."""
        lib = load()
        handle = _P()
        rc = lib.srcf_file_open(ctypes.byref(handle), header, len(header), key.handle)
        if rc != OK:
            error = _fail(lib, rc, path=path)
            if isinstance(error, KeyUnavailable):
                error = KeyUnavailable(f"{path or 'the file'} needs key {_key_named(header)}, not "
                                       f"{key.key_id} version {key.version}")
            raise error
        assert handle.value is not None
        return cls(lib, handle.value, bytes(header[:HEADER_SIZE]), path=path)

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise ValueError(f"{self.path or 'the file'} is closed")
        return self._handle

    def rewrap(self, key: NativeKey, *, wrap_nonce: bytes | None = None) -> bytes:
        """Rotation: a new header with the same file key and file id under `key`."""
        header = bytearray(HEADER_SIZE)
        rc = self._lib.srcf_file_rewrap(self.handle, key.handle, _out(header), wrap_nonce)
        if rc != OK:
            raise _fail(self._lib, rc, path=self.path)
        return bytes(header)

    def seal_run(self, first_index: int, plaintext: Buffer, out: bytearray | memoryview, *,
                 final_index: int | None, nonces: bytes | None = None) -> int:
        """Seal chunks first_index, first_index + 1, ... cut from `plaintext` into `out`
        (stored chunks back to back); the chunk numbered `final_index` is sealed as the
        file's last. Returns the bytes written. `nonces` (12 per chunk): test vectors only."""
        written = _SIZE()
        rc = self._lib.srcf_seal_run(self.handle, first_index, NO_FINAL if final_index is None else final_index,
                                     _in(plaintext), len(plaintext), _out(out), len(out), ctypes.byref(written),
                                     nonces)
        if rc != OK:
            raise _fail(self._lib, rc, path=self.path)
        return int(written.value)

    def open_run(self, first_index: int, stored: Buffer, out: bytearray | memoryview, *,
                 final_index: int | None) -> int:
        """Authenticate and decrypt stored chunks (back to back, the last possibly short)
        into `out`; returns the plaintext bytes. IntegrityError names the first chunk
        that does not authenticate; `out` is zeroed then."""
        got, bad = _SIZE(), _U64()
        rc = self._lib.srcf_open_run(self.handle, first_index, NO_FINAL if final_index is None else final_index,
                                     _in(stored), len(stored), _out(out), len(out), ctypes.byref(got),
                                     ctypes.byref(bad))
        if rc != OK:
            raise _fail(self._lib, rc, path=self.path, where=f"chunk {bad.value}")
        return int(got.value)

    @property
    def chunks_sealed(self) -> int:
        return int(self._lib.srcf_file_chunks_sealed(self.handle))

    def close(self) -> None:
        if self._handle is not None:
            self._lib.srcf_file_free(self._handle)
            self._handle = None

    def __enter__(self) -> NativeFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _key_named(header: bytes) -> str:
    return f"{uuid.UUID(bytes=bytes(header[28:44]))} version {int.from_bytes(header[44:48], 'big')}"
