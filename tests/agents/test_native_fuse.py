# ruff: noqa: S103 - permissive modes are the point: other users must reach the mount
"""The native guard-point daemon (agents/dataplane/fuse, `strongroom-fuse`) on real FUSE
mounts: file-system semantics, concurrency, the control channel (policy, keys, events,
shutdown) and crash safety. Every test runs against the optimised build and the
AddressSanitizer + UBSan build; a sanitizer report on the daemon's stderr fails it.

The `Control` class below is a test-only speaker of the control protocol
(agents/dataplane/fuse/README.md); the production speaker belongs to the control plane.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import random
import re
import shutil
import socket
import stat
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import parallel

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "agents" / "dataplane" / "fuse"

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse (FUSE kernel module)"),
    pytest.mark.timeout(120),
]

# --- the control protocol (README.md) -------------------------------------------------
VERSION = 2
READY, STATUS_REQ, SET_POLICY, SET_KEY, DROP_KEY, SHUTDOWN = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06
MOUNT = 0x09
RESULT, EVENT, STATUS = 0x80, 0x81, 0x82
OFF, ENFORCE, LEARN = 0, 1, 2
READ, WRITE, ALL = 1, 2, 3
EV_DENIED, EV_WOULD_DENY, EV_PERMITTED = 1, 2, 3
OPS = {1: "open", 2: "create", 3: "truncate", 4: "setattr", 5: "unlink", 6: "rmdir", 7: "rename",
       8: "link", 9: "mkdir", 10: "symlink", 11: "mknod", 12: "setxattr", 13: "removexattr"}


@dataclass(frozen=True)
class Rule:
    permit: bool
    access: int = ALL
    audit: bool = False
    users: tuple[int, ...] = ()  # uids the control plane resolved from user names
    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()  # gids resolved from group names
    exes: tuple[str, ...] = ()

    def encode(self) -> bytes:
        out = struct.pack(">BBBB", int(self.permit), self.access, int(self.audit), 0)
        for ids in (self.users, self.uids, self.gids):
            out += struct.pack(">H", len(ids)) + b"".join(struct.pack(">I", i) for i in ids)
        out += struct.pack(">H", len(self.exes))
        for e in self.exes:
            b = e.encode()
            out += struct.pack(">H", len(b)) + b
        return out


def policy(mode: int, default_permit: bool, *rules: Rule) -> bytes:
    return struct.pack(">BBH", mode, int(default_permit), len(rules)) + b"".join(r.encode() for r in rules)


@dataclass(frozen=True)
class Event:
    kind: int
    access: int
    op: str
    mode: int
    uid: int
    gid: int
    pid: int
    rule: int
    path: str
    exe: str


class Control:
    """One end of the socketpair the daemon inherits as --control-fd."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.seq = 0
        self.events: list[Event] = []
        self.ready: bytes | None = None
        self._replies: dict[int, tuple[int, bytes]] = {}

    def send(self, mtype: int, payload: bytes = b"", *, version: int = VERSION) -> int:
        self.seq += 1
        self.sock.sendall(struct.pack(">IHHI", 8 + len(payload), version, mtype, self.seq) + payload)
        return self.seq

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("control channel closed")
            buf += chunk
        return buf

    def _read_one(self) -> None:
        length, version, mtype, seq = struct.unpack(">IHHI", self._recv_exact(12))
        assert version == VERSION
        payload = self._recv_exact(length - 8)
        if mtype == EVENT:
            kind, access, op, mode, uid, gid, pid, rule = struct.unpack(">BBBBIIIi", payload[:20])
            pl = struct.unpack(">H", payload[24:26])[0]
            path = payload[26:26 + pl].decode()
            el = struct.unpack(">H", payload[26 + pl:28 + pl])[0]
            exe = payload[28 + pl:28 + pl + el].decode()
            self.events.append(Event(kind, access, OPS[op], mode, uid, gid, pid, rule, path, exe))
        elif mtype == READY:
            self.ready = payload
        else:
            self._replies[seq] = (mtype, payload)

    def pump(self, until: float) -> None:
        self.sock.settimeout(max(0.01, until - time.monotonic()))
        try:
            self._read_one()
        except TimeoutError:
            pass
        finally:
            self.sock.settimeout(None)

    def reply(self, seq: int, timeout: float = 10) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while seq not in self._replies:
            assert time.monotonic() < deadline, "no reply from the daemon"
            self.pump(deadline)
        return self._replies.pop(seq)

    def request(self, mtype: int, payload: bytes = b"") -> int:
        """Send; return the RESULT's errno (0 = done)."""
        rtype, body = self.reply(self.send(mtype, payload))
        assert rtype == RESULT
        return int(struct.unpack(">i", body)[0])

    def status(self) -> dict[str, int]:
        rtype, b = self.reply(self.send(STATUS_REQ))
        assert rtype == STATUS
        mode, default, nrules, keys, gen, sent, dropped, pid, proto, inodes = struct.unpack(">BBHIQQQIIQ", b)
        return {"mode": mode, "default_permit": default, "rules": nrules, "keys": keys, "generation": gen,
                "events_sent": sent, "events_dropped": dropped, "pid": pid, "protocol": proto, "inodes": inodes}

    def clear_events(self) -> None:
        """Forget every event so far: events are queued before the denial returns, and
        a reply queued later arrives after them."""
        self.status()
        self.events.clear()

    def wait_events(self, n: int, timeout: float = 5) -> list[Event]:
        deadline = time.monotonic() + timeout
        while len(self.events) < n and time.monotonic() < deadline:
            self.pump(deadline)
        return self.events


# --- building and mounting ----------------------------------------------------------
@pytest.fixture(scope="session")
def binaries() -> dict[str, Path]:
    if not Path("/usr/include/liburing.h").exists():
        pytest.fail("liburing-dev is missing: apt-get install liburing-dev gcc (scripts/test does)")
    built = parallel.make(SRC, "all", "asan")
    assert built.returncode == 0, built.stdout + built.stderr
    return {"normal": SRC / "strongroom-fuse", "asan": SRC / "strongroom-fuse-asan"}


@pytest.fixture(params=["normal", "asan"])
def daemon(request: pytest.FixtureRequest, binaries: dict[str, Path]) -> Path:
    return binaries[request.param]


def in_mount_table(path: str) -> bool:
    """Whether anything is mounted at `path`: unlike os.path.ismount, true of a dead FUSE
    mount too (its stat() fails with ENOTCONN)."""
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def _unmount(path: str) -> None:
    for _ in range(30):
        if not in_mount_table(path):
            return
        if subprocess.run(["fusermount3", "-u", path], capture_output=True).returncode == 0:
            return
        time.sleep(0.05)
    subprocess.run(["fusermount3", "-uz", path], capture_output=True)


@dataclass
class Mount:
    top: str  # a 0755 temporary directory holding the two below
    backing: str
    mnt: str
    proc: subprocess.Popen[bytes]
    control: Control | None
    stderr_path: str

    def p(self, *parts: str) -> str:
        return os.path.join(self.mnt, *parts)

    def b(self, *parts: str) -> str:
        return os.path.join(self.backing, *parts)

    def stderr(self) -> str:
        return Path(self.stderr_path).read_text(errors="replace")


@contextlib.contextmanager
def mounted(daemon: Path, *, control: bool = False, prepare: object = None,
            args: tuple[str, ...] = (), pass_fds: tuple[int, ...] = ()) -> Iterator[Mount]:
    top = tempfile.mkdtemp(prefix="srfuse-", dir="/tmp")
    os.chmod(top, 0o755)  # other test users must reach the mount
    # The backing directory's name is longer than the mount's: paths near PATH_MAX in
    # the mount are longer than PATH_MAX in the backing directory.
    backing, mnt = os.path.join(top, "backing-" + "b" * 120), os.path.join(top, "m")
    os.mkdir(backing, 0o700)
    os.mkdir(mnt, 0o755)
    if callable(prepare):
        prepare(backing, mnt)
    ours = theirs = None
    cmd = [str(daemon), "--allow-other", "--content", "plain", *args]
    if control:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pass_fds = (*pass_fds, theirs.fileno())
        cmd += ["--control-fd", str(theirs.fileno())]
    cmd += [backing, mnt]
    stderr_path = os.path.join(top, "daemon.stderr")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, pass_fds=pass_fds, stderr=err, env=env)
    if theirs is not None:
        theirs.close()
    m = Mount(top, backing, mnt, proc, Control(ours) if ours else None, stderr_path)
    try:
        deadline = time.monotonic() + 20
        if m.control is not None:
            # nothing configured: the daemon mounts failing closed (tested below)
            assert m.control.request(MOUNT) == 0
        while not os.path.ismount(mnt):
            assert proc.poll() is None, f"daemon exited {proc.returncode}: {m.stderr()}"
            assert time.monotonic() < deadline, "mount did not appear"
            time.sleep(0.01)
        if m.control is not None:
            while m.control.ready is None:
                assert time.monotonic() < deadline, "no READY"
                m.control.pump(deadline)
        yield m
    finally:
        _unmount(mnt)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if m.control is not None:
            m.control.sock.close()
        report = m.stderr()
        shutil.rmtree(top, ignore_errors=True)
        assert "Sanitizer" not in report and "runtime error" not in report, report
        assert proc.returncode in (0, -9), (proc.returncode, report)


def as_user(uid: int, code: str, gid: int | None = None,
            groups: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run Python code as another user; it prints the errno it met, or 0."""
    wrapped = "import errno, os, sys\ntry:\n" + "".join(f"    {line}\n" for line in code.splitlines()) + \
        "    print(0)\nexcept OSError as e:\n    print(e.errno)\n"
    return subprocess.run([PY, "-c", wrapped], user=uid, group=uid if gid is None else gid,
                          extra_groups=list(groups), capture_output=True, text=True, timeout=30, check=False)


# The system interpreter by its real path: what /proc/<pid>/exe shows for the test users.
PY = os.path.realpath("/usr/bin/python3")
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def utimensat(path: str, atime: tuple[int, int], mtime: tuple[int, int]) -> None:
    ts = (Timespec * 2)(Timespec(*atime), Timespec(*mtime))
    if libc.utimensat(AT_FDCWD, path.encode(), ts, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


def renameat2(old: str, new: str, flags: int) -> None:
    if libc.renameat2(AT_FDCWD, old.encode(), AT_FDCWD, new.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), old)


# --- file-system semantics -------------------------------------------------------------
def test_files_directories_links_and_symlinks(daemon: Path) -> None:
    with mounted(daemon) as m:
        Path(m.p("a")).write_bytes(b"hello")
        with open(m.p("a"), "ab") as f:
            f.write(b" world")
        assert Path(m.p("a")).read_bytes() == Path(m.b("a")).read_bytes() == b"hello world"
        os.mkdir(m.p("d"))
        os.link(m.p("a"), m.p("d", "hard"))
        assert os.stat(m.p("a")).st_nlink == 2
        assert os.stat(m.p("a")).st_ino == os.stat(m.p("d", "hard")).st_ino == os.stat(m.b("a")).st_ino
        Path(m.p("d", "hard")).write_bytes(b"changed")
        assert Path(m.p("a")).read_bytes() == b"changed"
        os.symlink("../a", m.p("d", "sym"))
        assert os.readlink(m.p("d", "sym")) == "../a"
        assert Path(m.p("d", "sym")).read_bytes() == b"changed"
        assert stat.S_ISLNK(os.lstat(m.p("d", "sym")).st_mode)
        with pytest.raises(OSError) as e:
            os.rmdir(m.p("d"))
        assert e.value.errno == errno.ENOTEMPTY
        os.unlink(m.p("d", "hard"))
        assert os.stat(m.p("a")).st_nlink == 1
        os.unlink(m.p("d", "sym"))
        os.rmdir(m.p("d"))
        assert sorted(os.listdir(m.mnt)) == ["a"]
        # truncate, chmod, chown, open(O_TRUNC)
        os.truncate(m.p("a"), 3)
        assert Path(m.p("a")).read_bytes() == b"cha"
        os.truncate(m.p("a"), 10)
        assert Path(m.p("a")).read_bytes() == b"cha" + b"\0" * 7
        os.chmod(m.p("a"), 0o640)
        os.chown(m.p("a"), 4321, 4322)
        st = os.stat(m.p("a"))
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 4321, 4322)
        assert os.stat(m.b("a")).st_uid == 4321
        with open(m.p("a"), "wb") as f:
            assert f.tell() == 0
        assert os.stat(m.p("a")).st_size == 0
        # many entries: readdir(plus) across several replies, and lookups forgotten
        for i in range(300):
            Path(m.p(f"f{i:03}")).write_bytes(b"x" * i)
        assert sorted(os.listdir(m.mnt)) == sorted(["a", *(f"f{i:03}" for i in range(300))])
        assert all(os.stat(m.p(f"f{i:03}")).st_size == i for i in range(300))


def test_umask_is_the_callers_alone(daemon: Path) -> None:
    with mounted(daemon) as m:
        script = ("import os\nos.umask({u})\nopen('{d}/f{u}', 'w').close()\nos.mkdir('{d}/d{u}')\n"
                  "os.mkfifo('{d}/p{u}')\n")
        for umask in (0, 0o22, 0o77):
            subprocess.run([PY, "-c", script.format(u=umask, d=m.mnt)], check=True)
            assert stat.S_IMODE(os.stat(m.p(f"f{umask}")).st_mode) == 0o666 & ~umask
            assert stat.S_IMODE(os.stat(m.p(f"d{umask}")).st_mode) == 0o777 & ~umask
            assert stat.S_IMODE(os.stat(m.p(f"p{umask}")).st_mode) == 0o666 & ~umask
        subprocess.run(["sh", "-c", f"umask 0; touch {m.p('t')}"], check=True)
        assert stat.S_IMODE(os.stat(m.p("t")).st_mode) == 0o666


def test_new_inodes_belong_to_their_caller(daemon: Path) -> None:
    with mounted(daemon) as m:
        os.chmod(m.mnt, 0o777)
        r = as_user(2345, f"open('{m.p('mine')}', 'w').close()\nos.mkdir('{m.p('dir')}')\n"
                          f"os.symlink('x', '{m.p('sl')}')\nos.mkfifo('{m.p('fifo')}')")
        assert r.stdout.strip() == "0", r
        for name in ("mine", "dir", "sl", "fifo"):
            st = os.lstat(m.p(name))
            assert (st.st_uid, st.st_gid) == (2345, 2345), name
            assert os.lstat(m.b(name)).st_uid == 2345


def test_utimensat_now_and_omit_change_only_their_time(daemon: Path) -> None:
    with mounted(daemon) as m:
        path = m.p("t")
        Path(path).write_bytes(b"x")
        old = (1_000_000_000, 123456789)
        utimensat(path, old, old)
        st = os.stat(path)
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000_123_456_789,) * 2
        utimensat(path, (0, UTIME_NOW), (0, UTIME_OMIT))
        st = os.stat(path)
        assert st.st_atime > time.time() - 60 and st.st_mtime_ns == 1_000_000_000_123_456_789
        utimensat(path, old, old)
        utimensat(path, (0, UTIME_OMIT), (0, UTIME_NOW))
        st = os.stat(path)
        assert st.st_atime_ns == 1_000_000_000_123_456_789 and st.st_mtime > time.time() - 60
        utimensat(path, old, old)
        subprocess.run(["touch", "-a", path], check=True)
        st = os.stat(path)
        assert st.st_atime > time.time() - 60 and st.st_mtime_ns == 1_000_000_000_123_456_789
        utimensat(path, old, old)
        subprocess.run(["touch", "-m", path], check=True)
        st = os.stat(path)
        assert st.st_atime_ns == 1_000_000_000_123_456_789 and st.st_mtime > time.time() - 60
        os.utime(path, ns=(5_000_000_000, 6_000_000_000))
        st = os.stat(path)
        assert (st.st_atime_ns, st.st_mtime_ns) == (5_000_000_000, 6_000_000_000)
        assert os.stat(m.b("t")).st_mtime_ns == 6_000_000_000
        # on a symlink itself
        os.symlink("t", m.p("l"))
        os.utime(m.p("l"), ns=(7_000_000_000, 8_000_000_000), follow_symlinks=False)
        assert os.lstat(m.p("l")).st_mtime_ns == 8_000_000_000
        assert os.stat(m.p("t")).st_mtime_ns == 6_000_000_000


def test_paths_near_path_max(daemon: Path) -> None:
    with mounted(daemon) as m:
        component = "c" * 200
        parts: list[str] = []
        # the deepest path in the mount stays below PATH_MAX (4096), its backing twin does not
        while len(os.path.join(m.mnt, *parts, component, "f" * 100)) < 4000:
            parts.append(component)
        deep = os.path.join(m.mnt, *parts)
        os.makedirs(deep)
        target = os.path.join(deep, "f" * 100)
        assert len(target) < 4096 < len(target.replace(m.mnt, m.backing)) + 100
        Path(target).write_bytes(b"deep")
        assert Path(target).read_bytes() == b"deep"
        os.rename(target, target + "2")
        os.link(target + "2", target)
        os.chmod(target, 0o600)
        os.utime(target, ns=(1, 2))
        assert os.stat(target).st_nlink == 2
        os.symlink("f", os.path.join(deep, "s"))
        assert os.readlink(os.path.join(deep, "s")) == "f"
        assert len(os.listdir(deep)) == 3
        # the backing directory has it, walked by descriptors (its path is too long)
        fd = os.open(m.backing, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nfd
            f = os.open("f" * 100, os.O_RDONLY, dir_fd=fd)
            assert os.read(f, 10) == b"deep"
            os.close(f)
        finally:
            os.close(fd)
        os.unlink(target)
        os.unlink(target + "2")


def test_fifos_and_unix_sockets(daemon: Path) -> None:
    with mounted(daemon) as m:
        os.mkfifo(m.p("fifo"), 0o640)
        assert stat.S_ISFIFO(os.stat(m.p("fifo")).st_mode)
        assert stat.S_ISFIFO(os.stat(m.b("fifo")).st_mode)
        # a FIFO works through the mount (the kernel serves it; the daemon never opens it)
        def writer() -> None:
            with open(m.p("fifo"), "wb") as f:
                f.write(b"through the pipe")
        t = threading.Thread(target=writer)
        t.start()
        with open(m.p("fifo"), "rb") as f:
            assert f.read() == b"through the pipe"
        t.join()
        # hard-linked FIFO: one inode, the same attributes under both names
        os.link(m.p("fifo"), m.p("fifo2"))
        os.chmod(m.p("fifo"), 0o600)
        os.chown(m.p("fifo2"), 3000, 3001)
        a, b = os.stat(m.p("fifo")), os.stat(m.p("fifo2"))
        assert (a.st_ino, a.st_nlink, a.st_mode, a.st_uid, a.st_gid) == \
               (b.st_ino, b.st_nlink, b.st_mode, b.st_uid, b.st_gid) == \
               (a.st_ino, 2, stat.S_IFIFO | 0o600, 3000, 3001)
        os.unlink(m.p("fifo"))
        assert os.stat(m.p("fifo2")).st_nlink == 1
        # UNIX sockets next to the data
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(m.p("sock"))
        srv.listen(1)
        assert stat.S_ISSOCK(os.stat(m.p("sock")).st_mode)
        cli = socket.socket(socket.AF_UNIX)
        cli.connect(m.p("sock"))
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        for s in (conn, cli, srv):
            s.close()
        # device nodes are refused
        with pytest.raises(OSError) as e:
            os.mknod(m.p("null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
        assert e.value.errno == errno.EPERM
        assert not os.path.lexists(m.b("null"))
        # a regular file through mknod(2)
        os.mknod(m.p("reg"), stat.S_IFREG | 0o604)
        assert stat.S_IMODE(os.stat(m.p("reg")).st_mode) == 0o604


def test_fallocate_xattrs_statfs(daemon: Path) -> None:
    with mounted(daemon) as m:
        fd = os.open(m.p("f"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.posix_fallocate(fd, 0, 1 << 20)
            assert os.fstat(fd).st_size == 1 << 20
            assert os.stat(m.b("f")).st_blocks * 512 >= 1 << 20
            os.pwrite(fd, b"tail", (1 << 20) - 4)
            assert os.pread(fd, 4, (1 << 20) - 4) == b"tail"
        finally:
            os.close(fd)
        os.setxattr(m.p("f"), "user.one", b"1")
        os.setxattr(m.p("f"), "user.two", b"22" * 100)
        assert sorted(os.listxattr(m.p("f"))) == ["user.one", "user.two"]
        assert os.getxattr(m.p("f"), "user.two") == b"22" * 100
        with pytest.raises(OSError) as e:
            os.setxattr(m.p("f"), "user.one", b"x", os.XATTR_CREATE)
        assert e.value.errno == errno.EEXIST
        os.removexattr(m.p("f"), "user.one")
        assert os.listxattr(m.p("f")) == ["user.two"]
        assert os.getxattr(m.b("f"), "user.two") == b"22" * 100
        with pytest.raises(OSError) as e:
            os.getxattr(m.p("f"), "user.one")
        assert e.value.errno == errno.ENODATA
        os.mkdir(m.p("d"))
        os.setxattr(m.p("d"), "user.d", b"dir")
        assert os.getxattr(m.p("d"), "user.d") == b"dir"
        dfd = os.open(m.p("d"), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)  # fsyncdir
        finally:
            os.close(dfd)
        # locks are the kernel's: BSD and POSIX locks conflict between processes as usual
        with open(m.p("f"), "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)
            probe = ("import fcntl, sys\nf = open(sys.argv[1], 'r+b')\n"
                     "try:\n    fcntl.{}(f, fcntl.LOCK_EX | fcntl.LOCK_NB{})\n    print('got')\n"
                     "except BlockingIOError:\n    print('busy')\n")
            for fn, extra in (("flock", ""), ("lockf", ", 10, 0")):
                r = subprocess.run([PY, "-c", probe.format(fn, extra), m.p("f")], capture_output=True, text=True)
                assert r.stdout.strip() == "busy", (fn, r)
        a, b = os.statvfs(m.mnt), os.statvfs(m.backing)
        assert (a.f_bsize, a.f_blocks, a.f_files) == (b.f_bsize, b.f_blocks, b.f_files)
        assert abs(a.f_bavail - b.f_bavail) * a.f_bsize < 64 << 20


def test_rename_plain_noreplace_exchange(daemon: Path) -> None:
    with mounted(daemon) as m:
        Path(m.p("a")).write_bytes(b"A")
        Path(m.p("b")).write_bytes(b"B")
        os.mkdir(m.p("d"))
        with pytest.raises(OSError) as e:
            renameat2(m.p("a"), m.p("b"), RENAME_NOREPLACE)
        assert e.value.errno == errno.EEXIST
        renameat2(m.p("a"), m.p("d", "a"), RENAME_NOREPLACE)
        renameat2(m.p("d", "a"), m.p("b"), RENAME_EXCHANGE)
        assert Path(m.p("b")).read_bytes() == b"A" and Path(m.p("d", "a")).read_bytes() == b"B"
        assert Path(m.b("d", "a")).read_bytes() == b"B"
        os.rename(m.p("d", "a"), m.p("b"))  # replaces
        assert Path(m.p("b")).read_bytes() == b"B" and os.listdir(m.p("d")) == []
        os.rename(m.p("d"), m.p("e"))
        assert sorted(os.listdir(m.mnt)) == ["b", "e"]


def test_root_shows_and_changes_the_protected_directory(daemon: Path) -> None:
    held: dict[str, int] = {}

    def prepare(backing: str, mnt: str) -> None:
        os.chmod(mnt, 0o751)
        os.chown(mnt, 1234, 1235)
        held["fd"] = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)

    with mounted(daemon, prepare=prepare) as m:
        st = os.stat(m.mnt)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o751, 1234, 1235)
        assert stat.S_IMODE(os.stat(m.backing).st_mode) == 0o700
        os.chmod(m.mnt, 0o755)
        os.chown(m.mnt, 1236, 1237)
        top = os.fstat(held["fd"])
        assert (stat.S_IMODE(top.st_mode), top.st_uid, top.st_gid) == (0o755, 1236, 1237)
        st = os.stat(m.mnt)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o755, 1236, 1237)
        b = os.stat(m.backing)
        assert (stat.S_IMODE(b.st_mode), b.st_uid) == (0o700, 0)
    os.close(held["fd"])


def test_writes_by_others_clear_set_id_bits(daemon: Path) -> None:
    """The kernel kills set-user/group-ID bits on write and truncate (the daemon writes
    as root, with CAP_FSETID: the backing file system alone would keep them)."""
    with mounted(daemon) as m:
        Path(m.p("suid")).write_bytes(b"#!/bin/sh\n")
        os.chmod(m.p("suid"), 0o6777)
        r = as_user(OTHER, f"open('{m.p('suid')}', 'a').write('echo')")
        assert r.stdout.strip() == "0", r
        assert stat.S_IMODE(os.stat(m.p("suid")).st_mode) == 0o777
        assert stat.S_IMODE(os.stat(m.b("suid")).st_mode) == 0o777
        os.chmod(m.p("suid"), 0o4777)
        assert as_user(OTHER, f"os.truncate('{m.p('suid')}', 1)").stdout.strip() == "0"
        assert stat.S_IMODE(os.stat(m.p("suid")).st_mode) == 0o777


def test_root_fd_names_the_protected_directory(daemon: Path) -> None:
    """The control plane opens the protected directory itself and passes it (--root-fd)."""
    other = tempfile.mkdtemp(prefix="srfuse-top-")
    try:
        os.chmod(other, 0o710)
        os.chown(other, 1111, 2222)
        fd = os.open(other, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with mounted(daemon, args=("--root-fd", str(fd)), pass_fds=(fd,)) as m:
                st = os.stat(m.mnt)
                assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o710, 1111, 2222)
                os.chmod(m.mnt, 0o750)
                assert stat.S_IMODE(os.stat(other).st_mode) == 0o750
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(other)


def test_default_permissions_are_the_kernels(daemon: Path) -> None:
    with mounted(daemon) as m:
        Path(m.p("secret")).write_bytes(b"s")
        os.chmod(m.p("secret"), 0o600)
        r = as_user(2345, f"open('{m.p('secret')}').read()")
        assert r.stdout.strip() == str(errno.EACCES), r
        r = as_user(2345, f"open('{m.p('new')}', 'w')")
        assert r.stdout.strip() == str(errno.EACCES), r  # the root is 0755 root's
        assert not os.path.exists(m.b("new"))


# --- concurrency ------------------------------------------------------------------------
@pytest.mark.parametrize("max_threads", ["2", "16"])
def test_concurrent_io_on_distinct_files_and_on_one_file(daemon: Path, max_threads: str) -> None:
    with mounted(daemon, args=("--threads", max_threads)) as m:
        size = 2 << 20
        blobs = [random.Random(i).randbytes(size) for i in range(4)]
        errors: list[BaseException] = []

        def write_file(i: int) -> None:
            try:
                with open(m.p(f"f{i}"), "wb") as f:
                    for off in range(0, size, 192 * 1024):
                        f.write(blobs[i][off:off + 192 * 1024])
                for _ in range(2):
                    assert Path(m.p(f"f{i}")).read_bytes() == blobs[i]
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=write_file, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for i in range(4):
            assert Path(m.b(f"f{i}")).read_bytes() == blobs[i]

        # one file: 8 threads write interleaved 64 KiB stripes, others read meanwhile
        stripe, n = 64 * 1024, 8
        total = stripe * n * 4
        fd = os.open(m.p("one"), os.O_CREAT | os.O_RDWR, 0o644)
        os.ftruncate(fd, total)
        expect = bytearray(total)

        def stripes(k: int) -> None:
            try:
                rnd = random.Random(100 + k)
                for j in range(k, total // stripe, n):
                    data = rnd.randbytes(stripe)
                    expect[j * stripe:(j + 1) * stripe] = data
                    assert os.pwrite(fd, data, j * stripe) == stripe
                    assert len(os.pread(fd, stripe, ((j + 3) % (total // stripe)) * stripe)) == stripe
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=stripes, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        os.fsync(fd)
        os.close(fd)
        assert Path(m.p("one")).read_bytes() == bytes(expect)
        assert Path(m.b("one")).read_bytes() == bytes(expect)

        # O_APPEND from several writers: every record lands whole
        def append(k: int) -> None:
            with open(m.p("log"), "ab", buffering=0) as f:
                for j in range(50):
                    f.write(f"{k:02}:{j:03}\n".encode())

        threads = [threading.Thread(target=append, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lines = Path(m.p("log")).read_text().splitlines()
        assert sorted(lines) == sorted(f"{k:02}:{j:03}" for k in range(4) for j in range(50))


def test_large_requests_reach_the_daemon_whole(daemon: Path) -> None:
    with mounted(daemon) as m:
        data = os.urandom(8 << 20)
        fd = os.open(m.p("big"), os.O_CREAT | os.O_WRONLY, 0o644)
        assert os.write(fd, data) == len(data)
        os.close(fd)
        fd = os.open(m.p("big"), os.O_RDONLY | os.O_DIRECT)
        try:
            buf = bytearray()
            while chunk := os.read(fd, 1 << 20):
                buf += chunk
        finally:
            os.close(fd)
        assert bytes(buf) == data


# --- the control channel ------------------------------------------------------------------
OTHER = 2345


def test_the_daemon_mounts_only_when_the_plane_says_it_is_configured(daemon: Path) -> None:
    """Keys and policy arrive before the mount appears: a caller that finds the mount
    never meets the fail-closed state the daemon starts in."""
    top = tempfile.mkdtemp(prefix="srfuse-", dir="/tmp")
    backing, mnt = os.path.join(top, "b"), os.path.join(top, "m")
    os.mkdir(backing)
    os.mkdir(mnt)
    try:
        for close_early in (False, True):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            proc = subprocess.Popen([str(daemon), "--content", "plain", "--control-fd", str(theirs.fileno()),
                                     backing, mnt], pass_fds=(theirs.fileno(),), stderr=subprocess.PIPE)
            theirs.close()
            c = Control(ours)
            try:
                # the channel is served, the mount is not there yet
                assert c.request(SET_POLICY, policy(OFF, True)) == 0
                assert c.status()["mode"] == OFF and not os.path.ismount(mnt)
                if close_early:
                    ours.close()  # the plane went away before configuring: no mount, exit 4
                    assert proc.wait(timeout=15) == 4 and not os.path.ismount(mnt)
                    continue
                assert c.request(MOUNT) == 0
                deadline = time.monotonic() + 20
                while c.ready is None:
                    assert time.monotonic() < deadline, "no READY"
                    c.pump(deadline)
                assert os.path.ismount(mnt)
                assert c.request(MOUNT) == errno.EALREADY
                assert c.request(MOUNT, b"x") == errno.EINVAL
                Path(mnt, "f").write_bytes(b"at once")  # policy off from the first request
                assert c.request(SHUTDOWN) == 0
                assert proc.wait(timeout=15) == 0 and not os.path.ismount(mnt)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                _unmount(mnt)
                ours.close()
                assert proc.stderr is not None
                err = proc.stderr.read().decode()
                proc.stderr.close()
                assert "Sanitizer" not in err and "runtime error" not in err, err
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_policy_denies_opens_and_namespace_operations_with_events(daemon: Path) -> None:
    with mounted(daemon, control=True) as m:
        c = m.control
        assert c is not None
        assert struct.unpack(">II", c.ready or b"")[0] == m.proc.pid
        st = c.status()
        # before the plane's first policy the daemon fails closed
        assert (st["mode"], st["default_permit"], st["rules"]) == (ENFORCE, 0, 0)
        with pytest.raises(PermissionError):
            open(m.p("x"), "w")  # noqa: SIM115
        assert c.request(SET_POLICY, policy(ENFORCE, True, Rule(permit=False, uids=(OTHER,)),
                                            Rule(permit=True, audit=True, uids=(3456,)))) == 0
        c.clear_events()
        os.chmod(m.mnt, 0o777)
        os.mkdir(m.p("d"))
        os.chmod(m.p("d"), 0o777)  # the kernel's permission checks let the user through
        Path(m.p("d", "f")).write_bytes(b"data")
        os.chmod(m.p("d", "f"), 0o666)
        attempts = {
            "open": f"open('{m.p('d', 'f')}').read()",
            "create": f"open('{m.p('d', 'new')}', 'w')",
            "truncate": f"os.truncate('{m.p('d', 'f')}', 0)",
            "unlink": f"os.unlink('{m.p('d', 'f')}')",
            "rename": f"os.rename('{m.p('d', 'f')}', '{m.p('d', 'g')}')",
            "link": f"os.link('{m.p('d', 'f')}', '{m.p('d', 'h')}')",
            "mkdir": f"os.mkdir('{m.p('d', 'sub')}')",
            "symlink": f"os.symlink('f', '{m.p('d', 's')}')",
            "mknod": f"os.mkfifo('{m.p('d', 'p')}')",
            "setattr": f"os.utime('{m.p('d', 'f')}', None)",
        }
        for op, code in attempts.items():
            r = as_user(OTHER, code)
            assert r.stdout.strip() == str(errno.EACCES), (op, r)
        os.mkdir(m.p("d", "empty"))
        assert as_user(OTHER, f"os.rmdir('{m.p('d', 'empty')}')").stdout.strip() == str(errno.EACCES)
        assert sorted(os.listdir(m.p("d"))) == ["empty", "f"]
        assert Path(m.p("d", "f")).read_bytes() == b"data"
        events = c.wait_events(len(attempts) + 1)
        denied = [e for e in events if e.kind == EV_DENIED]
        assert {e.op for e in denied} >= set(attempts) | {"rmdir"}
        assert all(e.uid == OTHER and e.rule == 0 and e.mode == ENFORCE for e in denied)
        opened = next(e for e in denied if e.op == "open")
        assert opened.path == "/d/f" and opened.access == READ and opened.exe == PY
        assert next(e for e in denied if e.op == "unlink").path == "/d/f"
        # root, not named by the rules, is permitted and unaudited
        assert not [e for e in events if e.uid == 0]
        # an audited permit
        c.clear_events()
        r = as_user(3456, f"open('{m.p('d', 'f')}').read()")
        assert r.stdout.strip() == "0", r
        ev = c.wait_events(1)
        assert [(e.kind, e.uid, e.op, e.rule) for e in ev] == [(EV_PERMITTED, 3456, "open", 1)]


def test_policy_swaps_live_and_learn_mode_records(daemon: Path) -> None:
    with mounted(daemon, control=True) as m:
        c = m.control
        assert c is not None
        deny = policy(ENFORCE, True, Rule(permit=False, access=READ, gids=(OTHER,)))
        assert c.request(SET_POLICY, deny) == 0
        gen = c.status()["generation"]
        os.chmod(m.mnt, 0o777)
        Path(m.p("f")).write_bytes(b"data")
        os.chmod(m.p("f"), 0o666)
        read = f"open('{m.p('f')}').read()"
        write = f"open('{m.p('f')}', 'r+').write('D')"
        assert as_user(OTHER, read).stdout.strip() == str(errno.EACCES)
        assert as_user(OTHER, write).stdout.strip() == str(errno.EACCES)  # r+ reads too
        assert as_user(OTHER, f"open('{m.p('f')}', 'a').write('+')").stdout.strip() == "0"  # write-only
        # a rule by executable: this python may not read
        assert c.request(SET_POLICY, policy(ENFORCE, True, Rule(permit=False, exes=(PY,), uids=(OTHER,)))) == 0
        assert as_user(OTHER, read).stdout.strip() == str(errno.EACCES)
        assert subprocess.run(["cat", m.p("f")], user=OTHER, capture_output=True).returncode == 0
        # a rule by supplementary group (the control plane resolved the name to 777)
        assert c.request(SET_POLICY, policy(ENFORCE, True, Rule(permit=False, gids=(777,)))) == 0
        assert as_user(OTHER, read, groups=(777,)).stdout.strip() == str(errno.EACCES)
        assert as_user(OTHER, read, groups=(778,)).stdout.strip() == "0"
        # swapped live, no remount: learn lets it through and says what enforce would do
        c.clear_events()
        assert c.request(SET_POLICY, policy(LEARN, False)) == 0
        assert as_user(OTHER, read).stdout.strip() == "0"
        ev = c.wait_events(1)
        assert ev and ev[0].kind == EV_WOULD_DENY and ev[0].uid == OTHER and ev[0].rule == -1
        assert c.request(SET_POLICY, policy(OFF, False)) == 0
        c.clear_events()
        assert as_user(OTHER, read).stdout.strip() == "0"
        st = c.status()
        assert st["generation"] == gen + 4 and st["mode"] == OFF
        assert in_mount_table(m.mnt)
        # malformed tables are refused whole, the running one stays
        assert c.request(SET_POLICY, policy(ENFORCE, False)[:-1] + b"\x00\x01") == errno.EINVAL
        assert c.request(SET_POLICY, b"\x07\x00\x00\x00") == errno.EINVAL
        assert c.status()["generation"] == gen + 4
        assert c.request(0x7F) == errno.EOPNOTSUPP
        rtype, body = c.reply(c.send(STATUS_REQ, version=VERSION + 1))
        assert (rtype, struct.unpack(">i", body)[0]) == (RESULT, errno.EPROTONOSUPPORT)
        time.sleep(0.1)
        assert c.events == []


def test_keys_are_held_dropped_and_wiped_and_shutdown_unmounts(daemon: Path) -> None:
    with mounted(daemon, control=True) as m:
        c = m.control
        assert c is not None
        kid = os.urandom(16)
        key = os.urandom(32)
        assert c.request(SET_KEY, kid + struct.pack(">I", 1) + key) == 0
        assert c.request(SET_KEY, kid + struct.pack(">I", 2) + os.urandom(32)) == 0
        assert c.request(SET_KEY, kid + b"short") == errno.EINVAL
        assert c.status()["keys"] == 2
        # the key page is locked and kept out of core dumps
        smaps = Path(f"/proc/{m.proc.pid}/smaps").read_text()
        assert any("dd" in line.split() for line in smaps.splitlines() if line.startswith("VmFlags:"))
        assert int(Path(f"/proc/{m.proc.pid}/status").read_text().split("VmLck:")[1].split()[0]) >= 4
        limits = Path(f"/proc/{m.proc.pid}/limits").read_text()
        assert [line.split()[4:6] for line in limits.splitlines() if line.startswith("Max core file size")] == \
            [["0", "0"]]
        assert c.request(DROP_KEY, kid + struct.pack(">I", 1)) == 0
        assert c.request(DROP_KEY, kid + struct.pack(">I", 1)) == errno.ENOKEY
        assert c.status()["keys"] == 1
        assert c.request(DROP_KEY, kid + struct.pack(">I", 0)) == 0  # every version
        assert c.status()["keys"] == 0
        assert c.request(SET_KEY, kid + struct.pack(">I", 3) + key) == 0
        assert c.request(SHUTDOWN) == 0
        assert m.proc.wait(timeout=15) == 0
        assert not in_mount_table(m.mnt)


def test_shutdown_with_open_files_and_end_of_control_channel(daemon: Path) -> None:
    with mounted(daemon, control=True) as m:
        c = m.control
        assert c is not None
        assert c.request(SET_POLICY, policy(OFF, True)) == 0
        f = open(m.p("open"), "wb")  # noqa: SIM115 - held open across the shutdown
        f.write(b"x")
        f.flush()
        Path(m.p("cached")).write_bytes(b"plaintext")
        reader = os.open(m.p("cached"), os.O_RDONLY)
        try:
            assert os.pread(reader, 9, 0) == b"plaintext"  # now in the page cache
            assert c.request(SHUTDOWN) == 0
            assert m.proc.wait(timeout=15) == 0
            assert not in_mount_table(m.mnt)
            # a descriptor that outlived the mount gets no plaintext, not even cached
            with pytest.raises(OSError):
                os.pread(reader, 9, 0)
        finally:
            with contextlib.suppress(OSError):
                f.close()
            with contextlib.suppress(OSError):
                os.close(reader)
        assert Path(m.b("open")).read_bytes() == b"x"
    with mounted(daemon, control=True) as m:
        assert m.control is not None
        m.control.sock.close()  # the control plane died
        assert m.proc.wait(timeout=15) == 0
        assert not in_mount_table(m.mnt)
        m.control.sock = socket.socket()  # closed again by the fixture


def test_shutdown_after_its_mount_was_detached_leaves_what_is_under_it(daemon: Path) -> None:
    """Someone detached the daemon's mount (umount -l) while a file stayed open through
    it, so the connection lives on; the path shows what was under it — on a host, the
    guard point's shield. A shutdown then must end its own connection and unmount
    nothing else: it used to unmount whatever was on top of the path."""
    def shield(backing: str, mnt: str) -> None:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=4k", "srfuse-under", mnt], check=True)

    with mounted(daemon, control=True, prepare=shield) as m:
        c = m.control
        assert c is not None
        assert c.request(SET_POLICY, policy(OFF, True)) == 0
        Path(m.p("held")).write_bytes(b"plaintext")
        held = os.open(m.p("held"), os.O_RDONLY)
        try:
            assert os.pread(held, 9, 0) == b"plaintext"
            subprocess.run(["umount", "-l", m.mnt], check=True)
            assert in_mount_table(m.mnt) and not os.listdir(m.mnt)  # the tmpfs under it shows
            assert c.request(SHUTDOWN) == 0
            assert m.proc.wait(timeout=15) == 0
            with open("/proc/self/mounts") as f:
                assert any(line.split()[:2] == ["srfuse-under", m.mnt] for line in f), "the mount under it went too"
            with pytest.raises(OSError):
                os.pread(held, 9, 0)  # its own connection ended all the same
        finally:
            with contextlib.suppress(OSError):
                os.close(held)
            subprocess.run(["umount", "-l", m.mnt], capture_output=True)


def test_sigterm_unmounts_cleanly(daemon: Path) -> None:
    with mounted(daemon) as m:
        Path(m.p("f")).write_bytes(b"kept")
        reader = os.open(m.p("f"), os.O_RDONLY)
        try:
            assert os.pread(reader, 4, 0) == b"kept"
            m.proc.terminate()
            assert m.proc.wait(timeout=15) == 0
            assert not in_mount_table(m.mnt)
            with pytest.raises(OSError):
                os.pread(reader, 4, 0)
        finally:
            with contextlib.suppress(OSError):
                os.close(reader)
        assert Path(m.b("f")).read_bytes() == b"kept"


def test_kill_9_leaves_the_backing_directory_intact(daemon: Path) -> None:
    with mounted(daemon) as m:
        os.mkdir(m.p("d"))
        data = os.urandom(3 << 20)
        with open(m.p("d", "f"), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(m.p("d", "f"), m.p("g"))
        os.symlink("d/f", m.p("s"))
        writer = open(m.p("w"), "wb")  # noqa: SIM115 - open while the daemon dies
        writer.write(b"w" * 4096)
        writer.flush()
        m.proc.kill()
        assert m.proc.wait(timeout=15) == -9
        with pytest.raises(OSError) as e:
            os.stat(m.p("g"))
        assert e.value.errno == errno.ENOTCONN
        with contextlib.suppress(OSError):
            writer.close()
        _unmount(m.mnt)
        assert not in_mount_table(m.mnt)
        assert Path(m.b("d", "f")).read_bytes() == data
        assert os.stat(m.b("g")).st_ino == os.stat(m.b("d", "f")).st_ino
        assert os.readlink(m.b("s")) == "d/f"
        # Not fsynced: with the writeback cache the page may still have been the
        # kernel's when the daemon died (lost as on a power cut); never torn.
        assert Path(m.b("w")).read_bytes() in (b"", b"w" * 4096)
        assert sorted(os.listdir(m.backing)) == ["d", "g", "s", "w"]


def test_forgotten_inodes_leave_the_table(daemon: Path) -> None:
    with mounted(daemon, control=True) as m:
        c = m.control
        assert c is not None
        assert c.request(SET_POLICY, policy(OFF, True)) == 0
        base = c.status()["inodes"]
        os.mkdir(m.p("d"))
        for i in range(200):
            Path(m.p("d", f"f{i}")).write_bytes(b"x")
        os.link(m.p("d", "f0"), m.p("d", "again"))
        assert c.status()["inodes"] == base + 201  # a hard link is no new inode
        for name in os.listdir(m.p("d")):
            os.unlink(m.p("d", name))
        os.rmdir(m.p("d"))
        # unlinked inodes are evicted by the kernel at once, and forgotten (forget_multi)
        deadline = time.monotonic() + 10
        while c.status()["inodes"] > base and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.status()["inodes"] == base


def test_mmap_sparse_files_and_huge_sizes(daemon: Path) -> None:
    import mmap

    with mounted(daemon) as m:
        with open(m.p("map"), "w+b") as f:
            f.truncate(1 << 20)
            with mmap.mmap(f.fileno(), 1 << 20) as mm:
                mm[4096:4101] = b"mmapd"
                mm.flush()
        assert Path(m.p("map")).read_bytes()[4096:4101] == b"mmapd"
        assert Path(m.b("map")).read_bytes()[4096:4101] == b"mmapd"
        # a huge size costs no space on the plain layer, and past the limit fails at once
        os.truncate(m.p("map"), 1 << 40)
        assert os.stat(m.p("map")).st_size == 1 << 40
        assert os.stat(m.b("map")).st_blocks * 512 < 16 << 20
        with pytest.raises(OSError) as e:
            os.truncate(m.p("map"), (1 << 63) - 1)
        assert e.value.errno in (errno.EFBIG, errno.EINVAL)
        os.truncate(m.p("map"), 0)
        assert os.stat(m.p("map")).st_size == 0


# --- a model test: the same random operations on the mount and on a plain directory -----
def test_model_mount_behaves_like_a_plain_directory(daemon: Path) -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

    names = st.sampled_from(["a", "b", "c", "d/x", "d/y"])

    with mounted(daemon) as m:
        counter = iter(range(1_000_000))

        class MountVsPlain(RuleBasedStateMachine):
            def __init__(self) -> None:
                super().__init__()
                n = next(counter)
                self.roots = (m.p(f"run{n}"), os.path.join(m.top, f"plain{n}"))
                for r in self.roots:
                    os.makedirs(os.path.join(r, "d"))

            def both(self, fn: object, *names_: str) -> None:
                outcomes: list[int | None] = []
                for r in self.roots:
                    try:
                        fn(*(os.path.join(r, n) for n in names_))  # type: ignore[operator]
                        outcomes.append(None)
                    except OSError as e:
                        outcomes.append(e.errno)
                assert outcomes[0] == outcomes[1], outcomes

            @rule(name=names, off=st.integers(0, 300_000), data=st.binary(min_size=1, max_size=70_000))
            def write(self, name: str, off: int, data: bytes) -> None:
                def w(p: str) -> None:
                    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
                    try:
                        os.pwrite(fd, data, off)
                    finally:
                        os.close(fd)
                self.both(w, name)

            @rule(name=names, data=st.binary(max_size=5000))
            def append(self, name: str, data: bytes) -> None:
                def a(p: str) -> None:
                    with open(p, "ab") as f:
                        f.write(data)
                self.both(a, name)

            @rule(name=names, size=st.integers(0, 400_000))
            def truncate(self, name: str, size: int) -> None:
                self.both(lambda p: os.truncate(p, size), name)

            @rule(src=names, dst=names)
            def rename(self, src: str, dst: str) -> None:
                self.both(os.rename, src, dst)

            @rule(src=names, dst=names)
            def link(self, src: str, dst: str) -> None:
                self.both(os.link, src, dst)

            @rule(name=names)
            def unlink(self, name: str) -> None:
                self.both(os.unlink, name)

            @rule(name=names, mode=st.sampled_from([0o600, 0o644, 0o755, 0o400]))
            def chmod(self, name: str, mode: int) -> None:
                self.both(lambda p: os.chmod(p, mode), name)

            @rule(name=names, ns=st.integers(0, 2**40))
            def utime(self, name: str, ns: int) -> None:
                self.both(lambda p: os.utime(p, ns=(ns, ns + 1)), name)
                with contextlib.suppress(FileNotFoundError):
                    stats = [os.stat(os.path.join(r, name)) for r in self.roots]
                    assert [(x.st_atime_ns, x.st_mtime_ns) for x in stats] == [(ns, ns + 1)] * 2

            @invariant()
            def same_tree(self) -> None:
                def snapshot(r: str) -> dict[str, tuple[int, int, int, bytes]]:
                    out = {}
                    for dirpath, _dirs, files in os.walk(r):
                        for f in files:
                            p = os.path.join(dirpath, f)
                            s = os.stat(p)
                            out[os.path.relpath(p, r)] = (s.st_size, s.st_mode, s.st_nlink, Path(p).read_bytes())
                    return out
                assert snapshot(self.roots[0]) == snapshot(self.roots[1])

        run_state_machine_as_test(MountVsPlain, settings=settings(
            max_examples=12, stateful_step_count=25, deadline=None, database=None,
            suppress_health_check=list(HealthCheck)))


def test_requests_are_one_mebibyte(daemon: Path) -> None:
    with mounted(daemon, args=("--debug",)) as m:
        with open(m.p("f"), "wb") as f:
            f.write(os.urandom(8 << 20))
        fd = os.open(m.p("f"), os.O_RDONLY | os.O_DIRECT)
        try:
            while os.read(fd, 4 << 20):
                pass
        finally:
            os.close(fd)
        trace = m.stderr()
    writes = re.findall(r"opcode: WRITE \(16\), nodeid: \d+, insize: (\d+)", trace)
    header = 80  # fuse_in_header + fuse_write_in
    assert writes and all(int(n) - header == 1 << 20 for n in writes), writes
    # 8 MiB of O_DIRECT reads in about 8 requests (128 KiB requests would be 64)
    assert 8 <= trace.count("opcode: READ (15)") <= 12
    assert "max_write=1048576 max_pages=256" in trace


def test_policy_parser_fuzz_corpus_replays_clean() -> None:
    """The libFuzzer harness (make fuzz) over its committed corpus: no sanitizer finding."""
    if shutil.which("clang") is None:
        pytest.fail("clang is missing: apt-get install clang (the fuzz harness needs libFuzzer)")
    built = parallel.make(SRC, "fuzz")
    assert built.returncode == 0, built.stdout + built.stderr
    r = subprocess.run([str(SRC / "fuzz-control"), "-runs=0", str(SRC / "fuzz-corpus")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def test_request_parser_fuzz_corpus_replays_clean(tmp_path: Path) -> None:
    """The FUSE request parser's libFuzzer harness (fuzz_transport.c) over its corpus: no
    sanitizer finding and no protocol finding (two replies, a reply to FORGET, a READ
    answered from another buffer than the one the operation wrote)."""
    if shutil.which("clang") is None:
        pytest.fail("clang is missing: apt-get install clang (the fuzz harness needs libFuzzer)")
    built = parallel.make(SRC, "fuzz-transport")
    assert built.returncode == 0, built.stdout + built.stderr
    seeds = sorted(str(p) for p in (SRC / "fuzz-transport-corpus").iterdir() if p.suffix != ".py")
    r = subprocess.run([str(SRC / "fuzz-transport"), "-runs=0", f"-artifact_prefix={tmp_path}/", *seeds],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_sqlite_in_wal_mode_runs_on_the_mount(daemon: Path) -> None:
    """A real database: WAL with its shared-memory file mapped, POSIX locks, fsync,
    truncation of the log at checkpoints; two connections at once."""
    import sqlite3

    with mounted(daemon) as m:
        db = m.p("app.db")
        a = sqlite3.connect(db)
        a.execute("PRAGMA journal_mode=WAL")
        a.execute("PRAGMA synchronous=FULL")
        a.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        with a:
            a.executemany("INSERT INTO t VALUES (?, ?)", ((i, os.urandom(300)) for i in range(3000)))
        b = sqlite3.connect(db)
        assert b.execute("SELECT count(*) FROM t").fetchone() == (3000,)
        with a:
            a.execute("DELETE FROM t WHERE k % 2 = 0")
        assert b.execute("SELECT count(*) FROM t").fetchone() == (1500,)
        a.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert a.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        b.close()
        a.close()
        with contextlib.closing(sqlite3.connect(m.b("app.db"))) as direct:
            assert direct.execute("SELECT count(*) FROM t").fetchone() == (1500,)


def test_a_broken_frame_ends_the_channel_like_end_of_file(daemon: Path) -> None:
    with mounted(daemon, control=True) as m:
        assert m.control is not None
        m.control.sock.sendall(struct.pack(">IHHI", 0xFFFFFFF0, VERSION, SET_KEY, 1))
        assert m.proc.wait(timeout=15) == 0
        assert not in_mount_table(m.mnt)
