"""The guard-point file system: plaintext above, format-v1 ciphertext in the backing
directory below, same tree, same names (names are not encrypted: see
docs/decisions/0006-guard-point-names-in-clear.md).

Threads: libfuse calls in from several threads. One `EncryptedFile` per open inode is
shared by every handle on it (hard links and concurrent opens see one state and one
lock); the registry itself has its own lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# mfusepy chooses libfuse when it is imported and prefers libfuse2 whenever that is
# installed too (gocryptfs depends on it); the guard point needs libfuse3 (1 MiB writes,
# the fuse_config options).
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")

import mfusepy
from mfusepy import FuseOSError

from agents.cryptfile import (
    EncryptedFile,
    FormatError,
    IntegrityError,
    Keyring,
    KeyUnavailable,
    KeyVersion,
    plaintext_size,
    read_header,
)
from agents.cryptfile.header import DEFAULT_CHUNK
from agents.cryptfile.transform import TMP_PREFIX
from agents.fs.policy import PERMIT_ALL, Access, AccessPolicy, Caller

log = logging.getLogger(__name__)
ENOKEY = getattr(errno, "ENOKEY", 126)
MAX_WRITE = 1 << 20
FUSE_CAP_AUTO_INVAL_DATA, FUSE_CAP_EXPLICIT_INVAL_DATA = 1 << 12, 1 << 25  # libfuse3's fuse_common.h
ATTR_TIMEOUT = 1.0  # seconds the kernel may answer stat/lseek(SEEK_END) without asking us

_invalidate_path = mfusepy._libfuse.fuse_invalidate_path  # libfuse >= 3.1
_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_invalidate_path.restype = ctypes.c_int


class _HardLinks:
    """The names seen of inodes with more than one link.

    libfuse's path-based API gives every *name* its own kernel node, with its own cached
    attributes and pages. When a hard-linked inode changes through one name, the kernel
    nodes of its other names are invalidated (`fuse_invalidate_path`), so attributes can
    be cached (ATTR_TIMEOUT) and still be exact: the model test compares every stat with
    a plain directory right after each operation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[tuple[int, int], set[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._names)

    def seen(self, path: str, st: os.stat_result) -> None:
        if st.st_nlink > 1 and stat.S_ISREG(st.st_mode):
            with self._lock:
                self._names.setdefault((st.st_dev, st.st_ino), set()).add(path)

    def forget(self, path: str) -> None:
        with self._lock:
            for key in [k for k, names in self._names.items() if path in names]:
                self._names[key].discard(path)
                if not self._names[key]:
                    del self._names[key]

    def renamed(self, old: str, new: str) -> None:
        self.forget(new)
        with self._lock:
            for names in self._names.values():
                if old in names:
                    names.discard(old)
                    names.add(new)

    def invalidate_others(self, key: tuple[int, int], path: str) -> None:
        """Called from a request thread after the inode changed through `path`."""
        with self._lock:
            others = [n for n in self._names.get(key, ()) if n != path]
        if not others:
            return
        fuse = mfusepy._libfuse.fuse_get_context().contents.fuse
        for name in others:
            _invalidate_path(fuse, name.encode())  # -ENOENT when the kernel holds no node: fine


@dataclass
class _Open:
    file: EncryptedFile
    key: tuple[int, int]  # (st_dev, st_ino) of the backing file
    refs: int = 0
    detached: bool = False  # unlinked or replaced while open: no new opens find it
    journal: str | None = None  # its entry in the write journal while it is being written


@dataclass
class _Handle:
    entry: _Open
    append: bool
    writable: bool


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """OS errors keep their errno; format errors are the EIO of a damaged medium; a
    missing key is ENOKEY. The message goes to the log, never key bytes."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FuseOSError:
            raise
        except IntegrityError as exc:
            log.error("integrity failure: %s", exc)
            raise FuseOSError(errno.EIO) from None
        except FormatError as exc:
            log.error("not a readable encrypted file: %s", exc)
            raise FuseOSError(errno.EIO) from None
        except KeyUnavailable as exc:
            log.error("key unavailable: %s", exc)
            raise FuseOSError(ENOKEY) from None
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from None

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


class GuardPoint(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, backing: str, keyring: Keyring, current_key: Callable[[], KeyVersion], *,
                 chunk_size: int = DEFAULT_CHUNK, policy: AccessPolicy = PERMIT_ALL,
                 on_event: Callable[[dict[str, Any]], None] | None = None, journal_dir: str | None = None,
                 root_fd: int | None = None) -> None:
        self.backing = os.path.realpath(backing)
        # The protected directory itself, opened before the mount covers it: the mount's
        # root shows its owner and mode (the backing directory is the agent's alone,
        # 0700), and chmod/chown of the root change it.
        self._root_fd = root_fd
        # Files being written, so that after a crash a size change cut in the middle
        # can be told from a truncation attack (see recover()).
        self.journal_dir = journal_dir or os.path.join(os.path.dirname(self.backing),
                                                       f".{os.path.basename(self.backing)}.journal")
        os.makedirs(self.journal_dir, mode=0o700, exist_ok=True)
        self.policy = policy  # replaced whole when the server sends a new one: no restart
        self._on_event = on_event
        self._keyring = keyring
        self._current_key = current_key
        self._chunk = chunk_size
        self._lock = threading.Lock()
        self._open: dict[tuple[int, int], _Open] = {}
        self._handles: dict[int, _Handle] = {}
        self._next_fh = 1
        self._links = _HardLinks()

    # --- helpers ---------------------------------------------------------------------
    def _real(self, path: str) -> str:
        # FUSE hands us absolute paths inside the mount; ".." never reaches us.
        return os.path.join(self.backing, path.lstrip("/"))

    def _entry_for(self, real: str) -> _Open:
        """The shared open state of the backing inode, opened on first use. Always
        read-write when the backing file allows it: handles check their own access mode
        (and the kernel the permissions), so one object serves readers and writers."""
        st = os.stat(real)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                try:
                    f = EncryptedFile.open(real, self._keyring, writable=True)
                except PermissionError:
                    f = EncryptedFile.open(real, self._keyring, writable=False)
                entry = _Open(f, key)
                self._open[key] = entry
            entry.refs += 1
            return entry

    def _check(self, path: str, *wants: Access) -> None:
        """Apply the access policy to the caller of the current FUSE request."""
        policy = self.policy
        if policy is PERMIT_ALL:
            return
        uid, gid, pid = mfusepy.fuse_get_context()
        caller = Caller.from_context(uid, gid, pid)
        for want in wants:
            d = policy.decide(caller, want)
            if d.audit and self._on_event is not None:
                self._on_event({
                    "event": "access.denied" if not d.allowed else
                             ("access.would_deny" if not d.would_allow else "access.permitted"),
                    "path": path, "access": want, "uid": caller.uid, "user": caller.user, "pid": caller.pid,
                    "exe": caller.exe, "rule": d.rule, "mode": policy.mode.value,
                })
            if not d.allowed:
                raise FuseOSError(errno.EACCES)

    @staticmethod
    def _give_to_caller(real: str) -> None:
        """A new inode belongs to whoever asked for it, as on any file system (the
        daemon itself runs as root)."""
        uid, gid, _ = mfusepy.fuse_get_context()
        if os.geteuid() == 0 and (uid, gid) != (0, 0):
            os.chown(real, uid, gid, follow_symlinks=False)

    def _new_handle(self, entry: _Open, flags: int) -> int:
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = _Handle(entry, append=bool(flags & os.O_APPEND),
                                        writable=(flags & os.O_ACCMODE) != os.O_RDONLY)
            return fh

    def _handle(self, fh: int) -> _Handle:
        h = self._handles.get(fh)
        if h is None:
            raise FuseOSError(errno.EBADF)
        return h

    def _detach(self, real: str) -> None:
        """Before `real` is unlinked or replaced: open handles keep their file (POSIX),
        new opens must not find it."""
        try:
            st = os.lstat(real)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
            with self._lock:
                entry = self._open.pop((st.st_dev, st.st_ino), None)
                if entry is not None:
                    entry.detached = True

    def _plain_size(self, real: str, st: os.stat_result) -> int:
        with self._lock:
            entry = self._open.get((st.st_dev, st.st_ino))
        if entry is not None:
            return entry.file.size
        chunk = self._chunk
        if st.st_size >= 128:
            try:
                chunk = read_header(real).chunk_size
            except (FormatError, OSError):
                return 0
        try:
            return plaintext_size(st.st_size, chunk)
        except ValueError:
            return 0

    def _journal(self, entry: _Open, path: str) -> None:
        """Record, durably and before its first write, that this file is being written."""
        if entry.journal is not None:
            return
        with self._lock:
            if entry.journal is not None:
                return
            name = f"{entry.key[0]}-{entry.key[1]}-{os.urandom(4).hex()}"
            fd = os.open(os.path.join(self.journal_dir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, path.lstrip("/").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            dfd = os.open(self.journal_dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            entry.journal = name

    def recover(self) -> list[str]:
        """Before mounting: repair the files that were being written when the agent
        died (a size change cut between its steps leaves a tail without a final chunk,
        which would otherwise read as a truncation attack). Returns the repaired paths;
        entries whose key is unavailable stay for the next mount."""
        from agents.cryptfile.file import repair_torn_tail

        repaired = []
        for name in sorted(os.listdir(self.journal_dir)):
            entry = os.path.join(self.journal_dir, name)
            with open(entry, "rb") as f:
                rel = f.read().decode(errors="replace")
            real = os.path.join(self.backing, rel)
            try:
                if os.path.isfile(real) and not os.path.islink(real) \
                        and repair_torn_tail(real, self._keyring) is not None:
                    repaired.append("/" + rel)
                    log.warning("repaired %s: its last write was cut by a crash", real)
            except KeyUnavailable as exc:
                log.error("cannot check %s after a crash yet: %s", real, exc)
                continue
            except (FormatError, IntegrityError, OSError) as exc:
                log.error("%s could not be repaired: %s", real, exc)
            os.unlink(entry)
        for p in repaired:
            if self._on_event is not None:
                self._on_event({"event": "guardpoint.repaired", "path": p})
        return repaired

    def _changed(self, path: str, key: tuple[int, int] | None = None) -> None:
        """The inode behind `path` changed: refresh what the kernel caches for its other names."""
        if not self._links:
            return
        if key is None:
            try:
                st = os.lstat(self._real(path))
            except OSError:
                return
            key = (st.st_dev, st.st_ino)
        self._links.invalidate_others(key, path)

    # --- attributes ------------------------------------------------------------------
    @_errors
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        real = self._real(path)
        st = os.lstat(real)
        self._links.seen(path, st)
        attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_ino",
                                             "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
        attrs["st_atime"], attrs["st_mtime"], attrs["st_ctime"] = (
            attrs.pop("st_atime_ns"), attrs.pop("st_mtime_ns"), attrs.pop("st_ctime_ns"))
        if path == "/" and self._root_fd is not None:
            top = os.fstat(self._root_fd)
            attrs["st_mode"], attrs["st_uid"], attrs["st_gid"] = top.st_mode, top.st_uid, top.st_gid
        size = self._plain_size(real, st) if stat.S_ISREG(st.st_mode) else st.st_size
        attrs["st_size"] = size
        attrs["st_blocks"] = (size + 511) // 512
        attrs["st_blksize"] = self._chunk
        return attrs

    @_errors
    def chmod(self, path: str, mode: int) -> int:
        real = self._real(path)
        if path == "/" and self._root_fd is not None:
            os.fchmod(self._root_fd, stat.S_IMODE(mode))
        elif not os.path.islink(real):  # Linux symlinks have no mode of their own
            os.chmod(real, mode)
        self._changed(path)
        return 0

    @_errors
    def chown(self, path: str, uid: int, gid: int) -> int:
        if path == "/" and self._root_fd is not None:
            os.fchown(self._root_fd, uid, gid)
        else:
            os.chown(self._real(path), uid, gid, follow_symlinks=False)
        self._changed(path)
        return 0

    @_errors
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._real(path), follow_symlinks=False)
        else:
            os.utime(self._real(path), ns=times, follow_symlinks=False)
        self._changed(path)
        return 0

    @_errors
    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._real(path))
        return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                           "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    # --- extended attributes (stored as they are on the backing file) ----------------
    @_errors
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        return os.getxattr(self._real(path), name, follow_symlinks=False)

    @_errors
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        os.setxattr(self._real(path), name, value, options, follow_symlinks=False)
        self._changed(path)
        return 0

    @_errors
    def listxattr(self, path: str) -> Iterable[str]:
        return os.listxattr(self._real(path), follow_symlinks=False)

    @_errors
    def removexattr(self, path: str, name: str) -> int:
        os.removexattr(self._real(path), name, follow_symlinks=False)
        self._changed(path)
        return 0

    # --- directories and names --------------------------------------------------------
    @_errors
    def readdir(self, path: str, fh: int) -> Iterable[tuple[str, dict[str, int], int]]:
        # With use_ino the entries must carry their inode numbers (0 means "deleted").
        real = self._real(path)
        here = os.lstat(real)
        entries = [(".", {"st_ino": here.st_ino, "st_mode": here.st_mode}, 0),
                   ("..", {"st_ino": os.lstat(os.path.dirname(real)).st_ino, "st_mode": here.st_mode}, 0)]
        with os.scandir(real) as it:
            for e in it:
                if not e.name.startswith(TMP_PREFIX):
                    st = e.stat(follow_symlinks=False)
                    entries.append((e.name, {"st_ino": st.st_ino, "st_mode": st.st_mode}, 0))
        return entries

    @_errors
    def mkdir(self, path: str, mode: int) -> int:
        real = self._real(path)
        os.mkdir(real, mode)
        self._give_to_caller(real)
        return 0

    @_errors
    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    @_errors
    def unlink(self, path: str) -> int:
        real = self._real(path)
        st = os.lstat(real)
        self._detach(real)
        os.unlink(real)
        self._links.forget(path)
        self._changed(path, (st.st_dev, st.st_ino))  # the other names lost a link
        return 0

    @_errors
    def rename(self, old: str, new: str) -> int:
        real_new = self._real(new)
        self._detach(real_new)
        replaced = _lstat_or_none(real_new)
        os.rename(self._real(old), real_new)
        self._links.renamed(old, new)
        if replaced is not None:
            self._changed(new, (replaced.st_dev, replaced.st_ino))  # a replaced hard link's others lost a link
        return 0

    @_errors
    def symlink(self, target: str, source: str) -> int:
        # mfusepy: `target` is the link's path in the mount, `source` what it points to.
        real = self._real(target)
        os.symlink(source, real)
        self._give_to_caller(real)
        return 0

    @_errors
    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    @_errors
    def link(self, target: str, source: str) -> int:
        os.link(self._real(source), self._real(target))
        st = os.lstat(self._real(target))
        self._links.seen(source, st)
        self._links.seen(target, st)
        self._changed(target, (st.st_dev, st.st_ino))  # the other names gained a link
        return 0

    @_errors
    def mknod(self, path: str, mode: int, dev: int) -> int:
        if stat.S_ISREG(mode):
            self.release(path, self.create(path, stat.S_IMODE(mode)))
            return 0
        if stat.S_ISFIFO(mode):
            os.mkfifo(self._real(path), stat.S_IMODE(mode))
            self._give_to_caller(self._real(path))
            return 0
        raise FuseOSError(errno.EPERM)  # device nodes have no place in a guard point

    # --- file contents ---------------------------------------------------------------
    @_errors
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._check(path, "write")
        real = self._real(path)
        f = EncryptedFile.create(real, self._current_key(), chunk_size=self._chunk, mode=stat.S_IMODE(mode))
        self._give_to_caller(real)
        st = os.fstat(f.fileno())
        entry = _Open(f, (st.st_dev, st.st_ino), refs=1)
        with self._lock:
            self._open[entry.key] = entry
        return self._new_handle(entry, os.O_RDWR)

    @_errors
    def open(self, path: str, flags: int) -> int:
        access = flags & os.O_ACCMODE
        wants: tuple[Access, ...] = (("read",) if access == os.O_RDONLY else ("write",) if access == os.O_WRONLY
                                     else ("read", "write"))
        self._check(path, *wants)
        writable = access != os.O_RDONLY
        entry = self._entry_for(self._real(path))
        if flags & os.O_TRUNC and writable:
            self._journal(entry, path)
            entry.file.truncate(0)
            self._changed(path, entry.key)
        return self._new_handle(entry, flags)

    @_errors
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        # Its presence makes mfusepy register the read callback; the mount itself serves
        # reads through read_into (_Fuse.read), without a copy.
        return self._handle(fh).entry.file.read(offset, size)

    @_errors
    def read_into(self, fh: int, offset: int, out: memoryview) -> int:
        """read() straight into libfuse's reply buffer (_Fuse.read)."""
        return self._handle(fh).entry.file.read_into(offset, out)

    @_errors
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        h = self._handle(fh)
        if not h.writable:
            raise FuseOSError(errno.EBADF)
        self._journal(h.entry, path)
        f = h.entry.file
        if h.append:
            with f._lock:
                n = f.write(f.size, data)
        else:
            n = f.write(offset, data)
        if self._links:
            self._links.invalidate_others(h.entry.key, path)
        return n

    @_errors
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None and fh in self._handles:
            self._journal(self._handles[fh].entry, path)
            self._handles[fh].entry.file.truncate(length)
            self._changed(path)
            return 0
        self._check(path, "write")
        entry = self._entry_for(self._real(path))
        try:
            self._journal(entry, path)
            entry.file.truncate(length)
        finally:
            self._unref(entry)
        self._changed(path)
        return 0

    @_errors
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        f = self._handle(fh).entry.file
        os.fdatasync(f.fileno()) if datasync else f.fsync()
        return 0

    @_errors
    def flush(self, path: str, fh: int) -> int:
        return 0  # every write already reached the backing file

    @_errors
    def release(self, path: str, fh: int) -> int:
        with self._lock:
            h = self._handles.pop(fh, None)
        if h is not None:
            self._unref(h.entry)
        return 0

    def _unref(self, entry: _Open) -> None:
        with self._lock:
            entry.refs -= 1
            if entry.refs > 0:
                return
            if self._open.get(entry.key) is entry:
                del self._open[entry.key]
        entry.file.close()
        if entry.journal is not None:  # no writer left: its size changes are complete
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.journal_dir, entry.journal))

    # --- rotation without downtime --------------------------------------------------------
    def rewrap(self, path: str, new_key: KeyVersion) -> bool:
        """Re-wrap one file (a path inside the mount) to `new_key`, open or not, while
        applications keep using it. Returns False when it was already there."""
        from agents.cryptfile import rewrap_file

        return self._replace(path, lambda f, moved: f.rewrap(self._keyring, new_key, on_replaced=moved),
                             lambda real: rewrap_file(real, self._keyring, new_key))

    def rekey(self, path: str, new_key: KeyVersion) -> None:
        """Re-encrypt one file under a fresh file key wrapped by `new_key`, open or not,
        while applications keep using it (they wait for this file only while it is
        sealed anew; opens on the mount wait as for a re-wrap)."""
        from agents.cryptfile import rekey_file

        def closed(real: str) -> bool:
            rekey_file(real, self._keyring, new_key)
            return True

        def opened(f: EncryptedFile, moved: Callable[[os.stat_result], None]) -> bool:
            f.rekey(new_key, on_replaced=moved)
            return True

        self._replace(path, opened, closed)

    def _replace(self, path: str, opened: Callable[[EncryptedFile, Callable[[os.stat_result], None]], bool],
                 closed: Callable[[str], bool]) -> bool:
        """Replace a backing file by a transformed copy, whether it is open or not.

        The registry lock is held throughout, so no open can bind to the old inode while
        it is being replaced (its writes would be lost); open handles wait on the file's
        own lock for the copy. Lock order is registry, then file, as everywhere."""
        real = self._real(path)
        with self._lock:
            st = os.stat(real)
            entry = self._open.get((st.st_dev, st.st_ino))
            if entry is None:
                return closed(real)

            def rekey_registry(new: os.stat_result) -> None:
                if self._open.get(entry.key) is entry:
                    del self._open[entry.key]
                entry.key = (new.st_dev, new.st_ino)
                self._open[entry.key] = entry

            return opened(entry.file, rekey_registry)

    # --- mount options ---------------------------------------------------------------
    def init_with_config(self, conn_info: Any, config_3: Any) -> None:
        # Large requests are what make a Python file system fast (docs/benchmarks.md).
        if conn_info is not None:
            conn_info.max_write = MAX_WRITE
            conn_info.max_readahead = MAX_WRITE  # fewer, larger reads: the per-request cost dominates
            # Nor may the kernel drop a file's whole page cache when a stat shows a new
            # mtime or size, which our own writes cause: a database writing a few pages
            # of a relation then re-read all of it through us (pgbench select-only:
            # 43,000 reads of 8 KiB in 10 s reached the mount). We invalidate explicitly.
            conn_info.want &= ~FUSE_CAP_AUTO_INVAL_DATA
            if conn_info.capable & FUSE_CAP_EXPLICIT_INVAL_DATA:
                conn_info.want |= FUSE_CAP_EXPLICIT_INVAL_DATA
        if config_3 is not None:
            config_3.use_ino = 1  # report the backing inode numbers: hard links show as such
            # Attributes cached for a second: a database calls lseek(SEEK_END) per
            # relation per query, and each uncached one is a trip through us (pgbench:
            # select-only -80 % with no caching). Hard links stay exact (_HardLinks).
            config_3.attr_timeout = ATTR_TIMEOUT
            # Keep file contents in the kernel's page cache across opens, whatever the
            # file's mtime says: every write passes through this mount (the backing
            # directory is the agent's alone, and what changes it while mounted, re-wrap
            # and re-key, keeps the plaintext), so the cache cannot go stale behind our
            # back. Hard links are the one exception, invalidated by name (_HardLinks).
            config_3.kernel_cache = 1


def _lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _buffer(buf: Any, size: int) -> memoryview:
    """libfuse's request buffer as a writable memoryview (no copy)."""
    return memoryview((ctypes.c_char * size).from_address(ctypes.cast(buf, ctypes.c_void_p).value or 0)).cast("B")


class _Fuse(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy with the two data paths zero-copy: a read is decrypted straight into
    libfuse's reply buffer, and a write is sealed straight from its request buffer
    (mfusepy's own copy both into and out of a 1 MiB Python bytes object, which with the
    allocations was a third of a request's cost)."""

    def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
        n: int = self.operations.read_into(fip.contents.fh, offset, _buffer(buf, size))
        return n

    def write(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
        n: int = self.operations.write(None if path is None else path.decode(self.encoding, self.errors),
                                       _buffer(buf, size), offset, fip.contents.fh)
        return n


def _tune_malloc() -> None:
    """Keep freed request-sized buffers in the heap. glibc serves allocations above its
    mmap threshold (128 KiB at first) with fresh mmap()s, so every 1 MiB request buffer
    was new memory taking 256 page faults; in this VM that halved throughput
    (docs/benchmarks.md). Only this process's allocator is affected."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 128 << 20)
        libc.mallopt(m_top_pad, 16 << 20)


READ_AHEAD_KB = 4 * MAX_WRITE >> 10


def _widen_read_ahead(mountpoint: str, done: threading.Event) -> None:
    """Let the kernel read ahead READ_AHEAD_KB on this mount, in 1 MiB requests. The
    kernel caps a FUSE mount's read-ahead at the 128 KiB default whatever max_readahead
    says, so a sequential read reached us as 128 KiB requests; the mount's backing device
    info is tunable by root once the mount exists (as for any block device)."""
    while not os.path.ismount(mountpoint):
        if done.wait(0.02):
            return
    with contextlib.suppress(OSError):
        st = os.stat(mountpoint)
        Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb").write_text(
            f"{READ_AHEAD_KB}\n")


def serve(ops: GuardPoint, mountpoint: str, *, allow_other: bool = False) -> None:
    """Serve the guard point until unmounted (blocks), after repairing what a crash of
    the previous mount left half-written."""
    ops.recover()
    _tune_malloc()
    done = threading.Event()
    threading.Thread(target=_widen_read_ahead, args=(mountpoint, done), daemon=True).start()
    try:
        _Fuse(ops, mountpoint, foreground=True, nothreads=False, allow_other=allow_other,
              default_permissions=True, fsname=f"strongroom:{ops.backing}", subtype="strongroom", max_threads=16)
    finally:
        done.set()


def mount(backing: str, mountpoint: str, keyring: Keyring, current_key: Callable[[], KeyVersion], *,
          chunk_size: int = DEFAULT_CHUNK, allow_other: bool = False, policy: AccessPolicy = PERMIT_ALL,
          on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Build the guard point over `backing` and serve it at `mountpoint` (blocks)."""
    serve(GuardPoint(backing, keyring, current_key, chunk_size=chunk_size, policy=policy, on_event=on_event),
          mountpoint, allow_other=allow_other)
