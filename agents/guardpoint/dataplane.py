"""The control plane's end of one guard point's native data plane.

`DataPlane` starts `strongroom-fuse` (agents/dataplane/fuse) over a backing directory,
hands it one end of a socketpair as `--control-fd`, and speaks the control protocol
described in agents/dataplane/fuse/README.md: key versions (SET_KEY / SET_ACTIVE /
DROP_KEY: key material travels only over this socket, never in argv, the environment or
a file), the access policy (SET_POLICY, swapped live), STATUS, SHUTDOWN; the daemon's
EVENTs (access decisions, integrity failures, missing keys) come back to `on_event`.
Every request of an application is served by the daemon alone: no Python on the I/O
path.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import pwd
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.cryptfile import FormatError, IntegrityError, Keyring, KeyUnavailable, KeyVersion
from agents.errors import AgentError
from agents.guardpoint.policy import AccessPolicy, Effect, Mode

log = logging.getLogger("strongroom.agent.dataplane")

DAEMON = Path(__file__).resolve().parent.parent / "dataplane" / "fuse" / "strongroom-fuse"
PROTOCOL = 2
READY, STATUS_REQ, SET_POLICY, SET_KEY, DROP_KEY, SHUTDOWN, SET_ACTIVE, REKEY, MOUNT = (
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09)
RESULT, EVENT, STATUS = 0x80, 0x81, 0x82
_FRAME = struct.Struct(">IHHI")
_REKEY_TMP = re.compile(r"\.srtmp-[0-9a-f]{16}")  # content_srcf.c's srcf_rekey
NO_SUCH_ID = 0xFFFFFFFF  # a uid/gid no process has: a rule naming only unknown users matches nobody

OPS = {1: "open", 2: "create", 3: "truncate", 4: "setattr", 5: "unlink", 6: "rmdir", 7: "rename", 8: "link",
       9: "mkdir", 10: "symlink", 11: "mknod", 12: "setxattr", 13: "removexattr"}
KINDS = {1: "access.denied", 2: "access.would_deny", 3: "access.permitted", 4: "guardpoint.integrity_error",
         5: "guardpoint.key_missing"}
MODES = {0: "off", 1: "enforce", 2: "learn"}


class DataPlaneError(AgentError):
    """The daemon could not be started, or refused a request; the message says why."""


def available(executable: Path = DAEMON) -> str | None:
    """Why the native data plane cannot run here, or None. It is built on the key server
    for the server's platform (the agent wheel carries it): another architecture, an
    older glibc, or a host without OpenSSL 3 is named here."""
    if not executable.is_file():
        return f"{executable} is not built (make -C {executable.parent}; scripts/start builds it)"
    if not os.access(executable, os.X_OK):
        # pip installs a wheel's data files 0644 whatever the wheel says: the agent (root,
        # the owner of its own environment) makes its daemon executable once.
        with contextlib.suppress(OSError):
            os.chmod(executable, 0o755)  # noqa: S103 - a program: read and run by all, written by root
        if not os.access(executable, os.X_OK):
            return f"{executable} is not executable (chmod 755 it)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (load the fuse module; a container needs --device /dev/fuse)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing: apt-get install fuse3"
    try:
        probe = subprocess.run([str(executable), "--help"], capture_output=True, timeout=10, check=False)
    except OSError as exc:  # ENOEXEC: another architecture
        return f"{executable} cannot run on this host ({exc}): it was built for the key server's platform"
    if probe.returncode != 0:
        detail = probe.stderr.decode(errors="replace").strip().splitlines()
        return (f"{executable} cannot run on this host ({detail[-1] if detail else probe.returncode}): "
                "it needs glibc and OpenSSL 3 (libssl3)")
    return None


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    access: str
    op: str
    mode: str
    uid: int
    gid: int
    pid: int
    rule: int | None
    path: str
    exe: str

    def as_audit(self) -> dict[str, Any]:
        """The event as the agent's spool records it (the key server audits it)."""
        out: dict[str, Any] = {"event": self.kind, "path": self.path, "op": self.op}
        if self.kind.startswith("access."):
            try:
                user = pwd.getpwuid(self.uid).pw_name
            except KeyError:
                user = str(self.uid)
            out |= {"access": self.access, "uid": self.uid, "user": user, "pid": self.pid, "exe": self.exe or None,
                    "rule": self.rule, "mode": self.mode}
        return out


def _parse_event(payload: bytes) -> Event:
    kind, access, op, mode, uid, gid, pid, rule = struct.unpack(">BBBBIIIi", payload[:20])
    pl = struct.unpack(">H", payload[24:26])[0]
    path = payload[26:26 + pl].decode(errors="replace")
    el = struct.unpack(">H", payload[26 + pl:28 + pl])[0]
    exe = payload[28 + pl:28 + pl + el].decode(errors="replace")
    return Event(KINDS.get(kind, f"guardpoint.event_{kind}"), {1: "read", 2: "write"}.get(access, "read"),
                 OPS.get(op, str(op)), MODES.get(mode, str(mode)), uid, gid, pid, None if rule < 0 else rule,
                 path, exe)


def _ids(names: Iterable[str], lookup: Callable[[str], int]) -> list[int]:
    out = []
    for name in names:
        try:
            out.append(lookup(name))
        except KeyError:
            out.append(int(name) if name.isdigit() else NO_SUCH_ID)
    return out


def encode_policy(policy: AccessPolicy) -> bytes:
    """The SET_POLICY payload. User and group names are resolved to ids here, once per
    policy, so the daemon never reads the user database on a request."""
    mode = {Mode.ENFORCE: 1, Mode.LEARN: 2}[policy.mode]
    out = bytearray(struct.pack(">BBH", mode, 1 if policy.default is Effect.PERMIT else 0, len(policy.rules)))
    for r in policy.rules:
        access = {"read": 1, "write": 2, "all": 3}[r.access]
        out += struct.pack(">BBBB", 1 if r.effect is Effect.PERMIT else 0, access, 1 if r.audit else 0, 0)
        lists = (_ids(sorted(r.users), lambda n: pwd.getpwnam(n).pw_uid), sorted(r.uids),
                 _ids(sorted(r.groups), lambda n: grp.getgrnam(n).gr_gid))
        for ids in lists:
            out += struct.pack(">H", len(ids)) + b"".join(struct.pack(">I", i) for i in ids)
        exes = sorted(r.executables)
        out += struct.pack(">H", len(exes))
        for e in exes:
            raw = e.encode()
            out += struct.pack(">H", len(raw)) + raw
    return bytes(out)


ENABLE_URING = Path("/sys/module/fuse/parameters/enable_uring")


def enable_fuse_io_uring(param: Path = ENABLE_URING) -> str | None:
    """Let FUSE file systems on this host use io_uring (the agent setting fuse_io_uring):
    None, or why not. A host-wide kernel switch, not a guard point's: it is only ever
    turned on, never off (other FUSE file systems may rely on it)."""
    try:
        if param.read_text().strip() == "Y":
            return None
        param.write_text("Y\n")
    except FileNotFoundError:
        return f"{param} is missing: this kernel has no FUSE over io_uring (Linux 6.14 or newer, CONFIG_FUSE_IO_URING)"
    except OSError as exc:
        return f"cannot turn on FUSE over io_uring ({param}: {exc.strerror})"
    return None


class DataPlane:
    """One running `strongroom-fuse` and its control channel. Thread-safe."""

    def __init__(self, backing: str, mountpoint: str, *, chunk_size: int = 4096, journal: str | None = None,
                 root_fd: int | None = None, allow_other: bool = True,
                 on_event: Callable[[Event], None] | None = None, threads: int = 16,
                 writeback_cache: bool = True, io_uring: bool = False,
                 executable: Path = DAEMON, extra_args: Iterable[str] = ()) -> None:
        self.backing, self.mountpoint = backing, mountpoint
        self._cmd = [str(executable), "--content", "srcf", "--chunk-size", str(chunk_size),
                     "--threads", str(threads), *(["--allow-other"] if allow_other else []),
                     *(["--journal", journal] if journal else []),
                     "--writeback-cache", "on" if writeback_cache else "off",
                     *(["--io-uring"] if io_uring else []), *extra_args]
        #: what the daemon negotiated with the kernel ("7.45 dev writeback_cache ..."), once mounted
        self.transport: str | None = None
        self._root_fd = root_fd
        self._on_event = on_event
        self._sock: socket.socket | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._send_lock = threading.Lock()
        self._replies: dict[int, tuple[int, bytes]] = {}
        self._cond = threading.Condition()
        self._seq = 0
        self._ready = threading.Event()
        self._closed = False
        self.pid: int | None = None

    # --- life cycle -------------------------------------------------------------------
    def start(self, timeout: float = 20.0, configure: Callable[[DataPlane], None] | None = None) -> DataPlane:
        """Start the daemon; `configure` runs before it mounts (keys, active version,
        policy), then MOUNT: the daemon mounts only when told, so the mount never
        appears unconfigured (until its first SET_POLICY it would deny everything).
        Returns once the mount is in place."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = [theirs.fileno()]
        cmd = [*self._cmd, "--control-fd", str(theirs.fileno())]
        if self._root_fd is not None:
            cmd += ["--root-fd", str(self._root_fd)]
            fds.append(self._root_fd)
        cmd += [self.backing, self.mountpoint]
        try:
            self.process = subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        finally:
            theirs.close()
        self._sock = ours
        threading.Thread(target=self._read_loop, name="dataplane-control", daemon=True).start()
        threading.Thread(target=self._log_stderr, name="dataplane-stderr", daemon=True).start()
        try:
            if configure is not None:
                configure(self)
            # every answer above came back, so all of it is in place: mount now
            self._check(self._request(MOUNT, b"", timeout=timeout), "to mount")
        except Exception:
            self.kill()
            raise
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                code = self.process.poll()
                self.kill()
                raise DataPlaneError(f"the data plane did not mount {self.mountpoint} "
                                     f"({'exit status ' + str(code) if code is not None else 'timed out'}; "
                                     "its messages are in the agent's log)")
        return self

    def _log_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            text = line.decode(errors="replace").rstrip()
            if text.startswith("strongroom-fuse: transport "):
                self.transport = text.removeprefix("strongroom-fuse: transport ")
                log.info("%s: %s", self.mountpoint, text)
                continue
            log.warning("%s: %s", self.mountpoint, text)

    def wait(self, timeout: float | None = None) -> int:
        """Until the daemon exits (unmounted, SHUTDOWN, or crashed): its exit status."""
        assert self.process is not None
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()

    def close_channel(self) -> None:
        """End the control channel: the daemon wipes its keys, unmounts and exits (what
        it does when the control plane dies). Safe from a signal handler."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def shutdown(self, timeout: float = 10.0) -> int:
        """Wipe the daemon's keys, unmount, and wait for it to exit."""
        with contextlib.suppress(DataPlaneError, OSError):
            self._request(SHUTDOWN, b"", timeout=timeout)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    # --- requests ---------------------------------------------------------------------
    def set_key(self, key: KeyVersion) -> None:
        # The material is copied straight into a mutable buffer and from it into the frame,
        # both wiped after sending: a concatenation or bytes() of it would leave an
        # immutable copy that nothing can wipe, alive until the allocator reuses it.
        payload = bytearray(20 + len(key.material))
        payload[:16] = key.key_id.bytes
        struct.pack_into(">I", payload, 16, key.version)
        payload[20:] = key.material
        try:
            self._check(self._request(SET_KEY, payload), f"key {key.key_id} v{key.version}")
        finally:
            payload[:] = bytes(len(payload))

    def set_active(self, key: KeyVersion) -> None:
        """New files are written under `key` (set with set_key first)."""
        self._check(self._request(SET_ACTIVE, key.key_id.bytes + struct.pack(">I", key.version)),
                    f"active key {key.key_id} v{key.version}")

    def drop_key(self, key_id: uuid.UUID, version: int = 0) -> None:
        """Wipe one version (0: every version) of a key from the daemon."""
        rc = self._request(DROP_KEY, key_id.bytes + struct.pack(">I", version))
        if rc not in (0, errno.ENOKEY):
            self._check(rc, f"drop key {key_id}")

    def rekey(self, rel: str, timeout: float = 3600.0) -> int:
        """Re-encrypt the backing file `rel` (relative to the backing directory) under a
        new file key wrapped by the active version, while applications keep using it;
        0 or the errno (EMLINK: a hard-linked file, left as it is; ENOENT: gone)."""
        return self._request(REKEY, rel.encode(), timeout=timeout)

    def set_policy(self, policy: AccessPolicy) -> None:
        self._check(self._request(SET_POLICY, encode_policy(policy)), "policy")

    def status(self) -> dict[str, int]:
        _, body = self._exchange(STATUS_REQ, b"", timeout=10)
        mode, default, rules, keys, gen, sent, dropped, pid, proto, inodes = struct.unpack(">BBHIQQQIIQ", body)
        return {"mode": mode, "default_permit": default, "rules": rules, "keys": keys, "generation": gen,
                "events_sent": sent, "events_dropped": dropped, "pid": pid, "protocol": proto, "inodes": inodes}

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc:
            raise DataPlaneError(f"the data plane refused {what}: {os.strerror(rc)}")

    def _request(self, mtype: int, payload: bytes | bytearray, timeout: float = 10) -> int:
        rtype, body = self._exchange(mtype, payload, timeout=timeout)
        return int(struct.unpack(">i", body)[0]) if rtype == RESULT and len(body) == 4 else errno.EPROTO

    def _exchange(self, mtype: int, payload: bytes | bytearray, *, timeout: float) -> tuple[int, bytes]:
        if self._sock is None or self._closed:
            raise DataPlaneError("the data plane is not running")
        with self._send_lock:
            self._seq += 1
            seq = self._seq
            frame = bytearray(_FRAME.size + len(payload))
            _FRAME.pack_into(frame, 0, 8 + len(payload), PROTOCOL, mtype, seq)
            frame[_FRAME.size:] = payload
            try:
                self._sock.sendall(frame)
            except OSError as exc:
                raise DataPlaneError(f"the data plane's control channel is gone: {exc}") from None
            finally:
                frame[:] = bytes(len(frame))  # SET_KEY frames carry key material
        deadline = time.monotonic() + timeout
        with self._cond:
            while seq not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise DataPlaneError("the data plane did not answer")
                self._cond.wait(left)
            return self._replies.pop(seq)

    # --- the reader ---------------------------------------------------------------------
    def _recv_exact(self, n: int) -> bytes:
        assert self._sock is not None
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def _read_loop(self) -> None:
        try:
            while True:
                length, _version, mtype, seq = _FRAME.unpack(self._recv_exact(12))
                payload = self._recv_exact(length - 8)
                if mtype == EVENT:
                    if self._on_event is not None:
                        try:
                            self._on_event(_parse_event(payload))
                        except Exception:  # an event consumer's failure must not end the channel
                            log.exception("event handler failed")
                elif mtype == READY:
                    self.pid = struct.unpack(">I", payload[:4])[0]
                    self._ready.set()
                else:
                    with self._cond:
                        self._replies[seq] = (mtype, payload)
                        self._cond.notify_all()
        except (EOFError, OSError):
            pass
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()


_UNDO = ".undo"
_UNDO_HEAD = struct.Struct(">8sQQQQ16s")


def _undo(real: str, record: str) -> bool:
    """Put back what the data plane's last change to `real` overwrote, when a kill cut it
    between its steps (content_srcf.c writes the old ciphertext and lengths before each
    change and disarms the record after it). True when the file was put back. A cut that
    had already reached its new, shorter length is complete: the record is dropped."""
    try:
        with open(record, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return False
    if len(data) < _UNDO_HEAD.size:
        return False
    magic, old_end, new_end, off, length, file_id = _UNDO_HEAD.unpack_from(data)
    if magic != b"SRUNDO01" or len(data) < _UNDO_HEAD.size + length:
        return False  # disarmed, or cut while being written: the file was not touched yet
    fd = os.open(real, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if os.pread(fd, 16, 12) != file_id:
            log.error("%s is not the file its undo record was written for: left as it is", real)
            return False
        if new_end < old_end and os.fstat(fd).st_size == new_end:
            return False
        os.pwrite(fd, data[_UNDO_HEAD.size:_UNDO_HEAD.size + length], off)
        os.ftruncate(fd, old_end)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def recover_journal(backing: str, journal_dir: str, keyring: Keyring) -> list[str]:
    """Before the data plane starts: repair the files its journal says were being written
    when it died (a size change cut between its steps leaves a tail without a final
    chunk, which would otherwise read as a truncation attack: FORMAT.md, "Interrupted
    writes"). Returns the repaired paths, relative to the backing directory; an entry
    whose key is unavailable stays for the next start. The temporary file of a re-key the
    data plane did not finish (`.srtmp-` and 16 hex digits) is removed: the original is
    whole beside it."""
    from agents.cryptfile.file import repair_torn_tail
    os.makedirs(journal_dir, mode=0o700, exist_ok=True)
    repaired = []
    for name in sorted(os.listdir(journal_dir)):
        entry = os.path.join(journal_dir, name)
        if name.endswith(_UNDO):
            if not os.path.exists(entry.removesuffix(_UNDO)):
                with contextlib.suppress(FileNotFoundError):  # its entry's turn removed it
                    os.unlink(entry)  # else its entry went after the file was durable: disarmed
            continue
        with open(entry, "rb") as f:
            rel = f.read().decode(errors="replace").lstrip("/")
        real = os.path.join(backing, rel)
        try:
            if os.path.isfile(real) and not os.path.islink(real) and _undo(real, entry + _UNDO):
                repaired.append(rel)
                log.warning("put back %s as it was before a change a crash cut", real)
            if os.path.isfile(real) and not os.path.islink(real) and repair_torn_tail(real, keyring) is not None:
                repaired.append(rel)
                log.warning("repaired %s: its last write was cut by a crash", real)
        except KeyUnavailable as exc:
            log.error("cannot check %s after a crash yet: %s", real, exc)
            continue
        except (FormatError, IntegrityError, OSError) as exc:
            log.error("%s could not be repaired: %s", real, exc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry + _UNDO)
        os.unlink(entry)
    for dirpath, _, names in os.walk(backing):
        for name in names:
            if _REKEY_TMP.fullmatch(name):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(dirpath, name))
    return repaired


def serve(backing: str, mountpoint: str, keys: Iterable[KeyVersion], active: KeyVersion, *,
          chunk_size: int = 4096, policy: AccessPolicy | None = None, allow_other: bool = True,
          on_event: Callable[[dict[str, Any]], None] | None = None, journal: str | None = None,
          root_fd: int | None = None, executable: Path = DAEMON) -> int:
    """Mount a guard point over `backing` at `mountpoint` with these key versions and
    serve it until it is unmounted (blocks); the daemon's exit status. For tests and
    benchmarks: the agent's manager drives DataPlane itself."""
    from agents.cryptfile import StaticKeyring
    from agents.guardpoint.policy import PERMIT_ALL

    keys = [*keys, active]
    if journal:
        recover_journal(backing, journal, StaticKeyring(keys))
    plane = DataPlane(backing, mountpoint, chunk_size=chunk_size, journal=journal, root_fd=root_fd,
                      allow_other=allow_other, on_event=(lambda e: on_event(e.as_audit())) if on_event else None,
                      executable=executable)
    def configure(p: DataPlane) -> None:
        for k in keys:
            p.set_key(k)
        p.set_active(active)
        p.set_policy(policy or PERMIT_ALL)

    plane.start(configure=configure)
    return plane.wait()
