# ruff: noqa: S103 - permissive modes are the point: another user must reach the mount
"""The guard point daemon's FUSE transport on real mounts, through the control plane
(agents/guardpoint/dataplane.py), format v1 below: what the kernel's writeback cache,
FUSE_HANDLE_KILLPRIV_V2 and FUSE over io_uring (agents/dataplane/fuse/transport.h) must
not change. Each behaviour is checked against a plain directory on the same host where
the kernel alone decides it (the reference), not against what we expect of it.

Every test runs once per transport mode the built daemon offers: the libfuse build has
one; the native transport's `--writeback-cache on|off` (and `--io-uring` where the host
enables it) each make one.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.cryptfile import EncryptedFile, KeyVersion, StaticKeyring
from agents.guardpoint.dataplane import DAEMON, DataPlane, Event, available, recover_journal
from agents.guardpoint.policy import AccessPolicy, Effect, Rule

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                                reason="needs /dev/fuse and root (mounts, another user, drop_caches)")

# STRONGROOM_TEST_FUSE=/path/to/strongroom-fuse runs the module against another build
FUSE = Path(os.environ.get("STRONGROOM_TEST_FUSE", str(DAEMON)))
NOBODY = 65534  # uid and gid of nobody/nogroup: no file of the test belongs to them beforehand
PAGE = 4096


def _modes() -> list[str]:
    """The transport modes this build of the daemon has (its --help names its options)."""
    try:
        r = subprocess.run([str(FUSE), "--help"], capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return ["libfuse"]  # not built: the fixture says so
    usage = r.stdout + r.stderr
    if "--writeback-cache" not in usage:
        return ["libfuse"]
    modes = ["writeback-on", "writeback-off"]
    with contextlib.suppress(OSError):
        if "--io-uring" in usage and Path("/sys/module/fuse/parameters/enable_uring").read_text().strip() == "Y":
            modes.append("io-uring")
    return modes


MODE_ARGS = {"libfuse": [], "writeback-on": ["--writeback-cache", "on"],
             "writeback-off": ["--writeback-cache", "off"], "io-uring": ["--writeback-cache", "on", "--io-uring"]}

# root may do anything; nobody may write, never read
POLICY = AccessPolicy(rules=(
    Rule(Effect.PERMIT, uids=frozenset({0})),
    Rule(Effect.PERMIT, uids=frozenset({NOBODY}), access="write"),
    Rule(Effect.DENY, uids=frozenset({NOBODY}), access="read", audit=True),
))


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


class _StderrTap(logging.Handler):
    """The daemon's stderr lines: DataPlane logs each one as `<mountpoint>: <line>`."""

    def __init__(self, prefix: str) -> None:
        super().__init__(logging.DEBUG)
        self.prefix, self.lines = prefix, []  # type: ignore[var-annotated]

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith(self.prefix):
            self.lines.append(msg[len(self.prefix):])


class GuardPoint:
    """One guard point (backing, mount, journal) and a plain twin directory `ref` beside
    it; started, stopped, killed and restarted as the agent's manager would."""

    def __init__(self, base: Path, mode: str) -> None:
        self.base, self.mode = base, mode
        self.backing, self.mnt, self.ref, self.journal = base / "backing", base / "mnt", base / "ref", base / "journal"
        for d in (self.backing, self.mnt, self.ref):
            d.mkdir()
        os.chmod(self.mnt, 0o755)
        os.chmod(self.ref, 0o777)
        self.key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
        self.events: list[Event] = []
        self.tap = _StderrTap(f"{self.mnt}: ")
        logging.getLogger("strongroom.agent.dataplane").addHandler(self.tap)
        self.plane: DataPlane | None = None

    def start(self) -> None:
        recover_journal(str(self.backing), str(self.journal), StaticKeyring([self.key]))

        def configure(p: DataPlane) -> None:
            p.set_key(self.key)
            p.set_active(self.key)
            p.set_policy(POLICY)

        self.plane = DataPlane(str(self.backing), str(self.mnt), chunk_size=4096, journal=str(self.journal),
                               on_event=self.events.append, executable=FUSE, extra_args=MODE_ARGS[self.mode])
        self.plane.start(configure=configure)

    def stop(self) -> None:
        if self.plane is not None:
            rc = self.plane.shutdown()
            self.plane = None
            assert rc == 0, f"the daemon exited {rc}: {self.stderr()}"

    def kill9(self) -> None:
        assert self.plane is not None and self.plane.process is not None
        os.kill(self.plane.process.pid, signal.SIGKILL)
        self.plane.process.wait()
        self.plane.kill()
        self.plane = None
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], check=False, capture_output=True)

    def restart(self, *, kill: bool = False) -> None:
        if kill:
            self.kill9()
        else:
            self.stop()
        self.start()

    def stderr(self) -> str:
        time.sleep(0.1)  # the reader thread logs what the pipe still held
        return "\n".join(self.tap.lines)

    def close(self) -> None:
        try:
            if self.plane is not None:
                self.plane.shutdown()
        finally:
            subprocess.run(["fusermount3", "-uz", str(self.mnt)], check=False, capture_output=True)
            logging.getLogger("strongroom.agent.dataplane").removeHandler(self.tap)

    def verify_backing(self) -> None:
        """Every stored file authenticates, chunk by chunk."""
        for dirpath, _, names in os.walk(self.backing):
            for name in names:
                with EncryptedFile.open(os.path.join(dirpath, name), StaticKeyring([self.key])) as f:
                    f.verify()

    def wait_events(self, pred: object, timeout: float = 5) -> list[Event]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in list(self.events) if pred(e)]  # type: ignore[operator]
            if found:
                return found
            time.sleep(0.02)
        return []


@pytest.fixture(params=_modes())
def gp(request: pytest.FixtureRequest) -> Iterator[GuardPoint]:
    why = available(FUSE)
    if why is not None:
        pytest.fail(why)
    # Not pytest's tmp_path: its parents are 0700 and nobody must reach the mount.
    base = Path(tempfile.mkdtemp(prefix="gp-transport-", dir="/tmp"))
    os.chmod(base, 0o755)
    g = GuardPoint(base, request.param)
    try:
        g.start()
        yield g
        report = g.stderr()
        assert "Sanitizer" not in report and "runtime error" not in report, report
    finally:
        g.close()
        shutil.rmtree(base, ignore_errors=True)


_PRELUDE = """\
import errno, json, mmap, os, sys
def err(f, *a, **k):
    try:
        f(*a, **k)
        return 0
    except OSError as e:
        return e.errno
os.setgroups([])
os.setresgid({uid}, {uid}, {uid})
os.setresuid({uid}, {uid}, {uid})
out = {{}}
"""


def as_user(code: str, uid: int = NOBODY) -> dict[str, object]:
    """Run `code` in a child Python that drops to uid/gid `uid` (setresgid, setresuid: no
    way back) before it runs; what it puts in `out` comes back."""
    prog = _PRELUDE.format(uid=uid) + code + "\nprint(json.dumps(out))\n"
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])  # type: ignore[no-any-return]


# --- a. the policy through the writeback cache ------------------------------------------
def test_write_only_user_fills_a_partial_page_and_never_reads_plaintext(gp: GuardPoint) -> None:
    """A partial-page write makes a writeback cache read the page first; the write-only
    caller still gets no byte of it: read and mmap on its descriptor fail, opens for
    reading are refused by the policy (an event each), and the file ends up as the old
    content with the new bytes over it."""
    old = os.urandom(3 * PAGE + 100)
    new = b"N" * 100
    off = PAGE + 1000  # inside page 1, neither end aligned
    f = gp.mnt / "f"
    f.write_bytes(old)
    os.chmod(f, 0o666)  # the kernel's permission check lets nobody read: only the policy refuses
    gp.events.clear()
    res = as_user(f"""
fd = os.open({str(f)!r}, os.O_WRONLY)
out["pwrite"] = os.pwrite(fd, {new!r}, {off})
out["read"] = err(os.read, fd, 10)
out["pread"] = err(os.pread, fd, 10, {off})
out["mmap"] = err(mmap.mmap, fd, {PAGE}, prot=mmap.PROT_READ)
out["rdonly"] = err(os.open, {str(f)!r}, os.O_RDONLY)
out["rdwr"] = err(os.open, {str(f)!r}, os.O_RDWR)
out["close"] = err(os.close, fd)
""")
    assert res == {"pwrite": len(new), "read": errno.EBADF, "pread": errno.EBADF, "mmap": errno.EACCES,
                   "rdonly": errno.EACCES, "rdwr": errno.EACCES, "close": 0}
    assert gp.wait_events(lambda e: e.kind == "access.denied" and e.uid == NOBODY)
    time.sleep(0.2)  # both opens' events
    denied = [e for e in gp.events if e.kind == "access.denied"]
    assert len(denied) == 2 and all((e.access, e.op, e.path) == ("read", "open", "/f") for e in denied), denied
    assert not [e for e in gp.events if e.access == "write" and e.kind != "access.permitted"], gp.events
    expected = old[:off] + new + old[off + len(new):]
    assert f.read_bytes() == expected
    drop_caches()
    assert f.read_bytes() == expected and f.stat().st_size == len(old)
    gp.verify_backing()


# --- b. set-user/group-ID bits on write, truncate, O_TRUNC, chown ----------------------
def test_set_id_bits_die_like_on_a_plain_directory(gp: GuardPoint) -> None:
    """Each operation on a fresh 06775 root:nogroup file (nobody may write through the
    group) on the mount and on the plain twin: the resulting modes must agree, as the
    mount shows them and as the backing file keeps them."""
    cases = ("user_write", "user_ftruncate", "user_truncate", "user_otrunc", "root_write", "root_chown")
    for d in (gp.mnt, gp.ref):
        for c in cases:
            p = d / c
            p.write_bytes(b"#!/bin/sh\necho set-id\n")
            os.chown(p, 0, NOBODY)
            os.chmod(p, 0o6775)
            assert stat.S_IMODE(p.stat().st_mode) == 0o6775
    as_user("\n".join(f"""
d = {str(d)!r}
fd = os.open(d + "/user_write", os.O_WRONLY); os.pwrite(fd, b"x", 3); os.close(fd)
fd = os.open(d + "/user_ftruncate", os.O_WRONLY); os.ftruncate(fd, 5); os.close(fd)
os.truncate(d + "/user_truncate", 4)
os.close(os.open(d + "/user_otrunc", os.O_WRONLY | os.O_TRUNC))""" for d in (gp.mnt, gp.ref)))
    for d in (gp.mnt, gp.ref):
        fd = os.open(d / "root_write", os.O_WRONLY)
        os.pwrite(fd, b"y", 2)
        os.close(fd)
        os.chown(d / "root_chown", NOBODY, NOBODY)

    def modes(d: Path) -> dict[str, str]:
        return {c: oct(stat.S_IMODE(os.stat(d / c).st_mode)) for c in cases}

    reference = modes(gp.ref)
    assert modes(gp.mnt) == reference
    assert modes(gp.backing) == reference  # kept, not only shown
    gp.restart()
    assert modes(gp.mnt) == reference


# --- c. O_APPEND under concurrency ---------------------------------------------------------
WRITERS, RECORDS = 4, 2000
_RECORD = re.compile(rb"<(\d):(\d{5}):(\d{5}):")


def _record(p: int, i: int) -> bytes:
    """Record i of writer p: its length (17 to 8,025 bytes) differs from every other
    record's (7919 and 8009 are prime), its header names it, its body is one letter."""
    n = 17 + ((i * WRITERS + p) * 7919) % 8009
    head = b"<%d:%05d:%05d:" % (p, i, n)
    return head + bytes([65 + (p * 7 + i) % 26]) * (n - len(head) - 2) + b">\n"


_APPENDER = """
import os
WRITERS = {writers}
{record}
fd = os.open({path!r}, os.O_WRONLY | os.O_APPEND)
for i in range({n}):
    r = _record({p}, i)
    assert os.write(fd, r) == len(r)
os.close(fd)
"""


def _check_records(data: bytes) -> None:
    seen: dict[int, int] = {}
    pos = 0
    while pos < len(data):
        m = _RECORD.match(data, pos)
        assert m, f"no record starts at {pos}: {data[pos:pos + 40]!r}"
        p, i = int(m[1]), int(m[2])
        rec = _record(p, i)
        assert data[pos:pos + len(rec)] == rec, f"record {p}/{i} at {pos} is torn or interleaved"
        assert i == seen.get(p, -1) + 1, f"writer {p}: record {i} after {seen.get(p)}"
        seen[p] = i
        pos += len(rec)
    assert seen == {p: RECORDS - 1 for p in range(WRITERS)}


def test_o_append_from_four_processes_is_exact(gp: GuardPoint) -> None:
    f = gp.mnt / "log"
    f.write_bytes(b"")
    code = dict(writers=WRITERS, record=inspect.getsource(_record), path=str(f), n=RECORDS)
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER.format(p=p, **code)],
                              stderr=subprocess.PIPE) for p in range(WRITERS)]
    for pr in procs:
        _, err = pr.communicate(timeout=240)
        assert pr.returncode == 0, err.decode()
    total = sum(len(_record(p, i)) for p in range(WRITERS) for i in range(RECORDS))
    assert f.stat().st_size == total
    _check_records(f.read_bytes())  # a new open: close + reopen
    drop_caches()
    assert f.stat().st_size == total
    _check_records(f.read_bytes())
    fd = os.open(f, os.O_WRONLY)
    os.fsync(fd)
    os.close(fd)
    gp.restart(kill=True)
    assert f.stat().st_size == total
    _check_records(f.read_bytes())
    gp.verify_backing()


# --- d. mtime and size exactness ------------------------------------------------------------
def _times(d: Path, remount: object) -> dict[str, int]:
    """What stat says of one file's size and mtime along a write's life: the write, fsync,
    close, drop_caches, remount; a read; a later write; utime then close."""
    p = d / "t"
    out: dict[str, int] = {}
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, b"w" * 10_000)
    out["size_stat"], out["size_fstat"] = os.stat(p).st_size, os.fstat(fd).st_size
    out["write"] = os.stat(p).st_mtime_ns
    out["fstat"] = os.fstat(fd).st_mtime_ns
    os.fsync(fd)
    out["fsync"] = os.stat(p).st_mtime_ns
    os.close(fd)
    out["close"] = os.stat(p).st_mtime_ns
    drop_caches()
    out["drop_caches"] = os.stat(p).st_mtime_ns
    remount()  # type: ignore[operator]
    out["remount"] = os.stat(p).st_mtime_ns
    out["size_remount"] = os.stat(p).st_size
    time.sleep(0.05)
    drop_caches()
    assert p.read_bytes() == b"w" * 10_000
    out["after_read"] = os.stat(p).st_mtime_ns
    fd = os.open(p, os.O_WRONLY)
    os.pwrite(fd, b"second", 20_000)
    out["size_extended"] = os.stat(p).st_size
    out["second_write"] = os.stat(p).st_mtime_ns
    os.utime(p, ns=(1_600_000_000_123_456_789, 1_500_000_000_987_654_321))  # while dirty, if cached
    os.close(fd)
    out["utime_close"] = os.stat(p).st_mtime_ns
    drop_caches()
    out["utime_drop_caches"] = os.stat(p).st_mtime_ns
    remount()  # type: ignore[operator]
    out["utime_remount"] = os.stat(p).st_mtime_ns
    out["atime_remount"] = os.stat(p).st_atime_ns
    return out


def test_size_and_mtime_are_exact_through_the_cache(gp: GuardPoint) -> None:
    """Sizes exact at once; an mtime, once shown, stays what it was through fsync, close,
    the caches dropped and a remount (a writeback cache holds its own times: the backing
    file's must end up the same, to the nanosecond, as on a plain directory); a read
    leaves it; utime while pages are dirty wins over their later flush."""
    wrong = []
    for name, t in (("reference", _times(gp.ref, lambda: None)), ("mount", _times(gp.mnt, gp.restart))):
        sizes = (t["size_stat"], t["size_fstat"], t["size_remount"], t["size_extended"])
        if sizes != (10_000, 10_000, 10_000, 20_006):
            wrong.append(f"{name}: sizes {sizes}")
        wrong += [f"{name}: mtime after {when} {t[when]} != {t['write']} after the write"
                  for when in ("fstat", "fsync", "close", "drop_caches", "remount", "after_read")
                  if t[when] != t["write"]]
        if t["second_write"] <= t["write"]:
            wrong.append(f"{name}: a later write left mtime at {t['second_write']}")
        wrong += [f"{name}: mtime after {when} {t[when]}, utime set 1500000000987654321"
                  for when in ("utime_close", "utime_drop_caches", "utime_remount")
                  if t[when] != 1_500_000_000_987_654_321]
        if t["atime_remount"] != 1_600_000_000_123_456_789:
            wrong.append(f"{name}: atime {t['atime_remount']} after utime and a remount")
    assert not wrong, "\n".join(wrong)


# --- e. size races ----------------------------------------------------------------------------
def test_extend_truncate_and_stat_race_to_an_exact_size(gp: GuardPoint) -> None:
    """One thread writes past the end, one truncates down, one stats and reads; none may
    meet an error, and the size after the last operation is that operation's."""
    p = gp.mnt / "race"
    p.write_bytes(b"s" * 10_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(fn: object) -> None:
        try:
            while not stop.is_set():
                fn()  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    wfd, tfd, rfd = os.open(p, os.O_WRONLY), os.open(p, os.O_WRONLY), os.open(p, os.O_RDONLY)
    n = [0]

    def extend() -> None:
        n[0] += 1
        size = os.fstat(wfd).st_size
        os.pwrite(wfd, b"e" * (1 + n[0] % 5000), size + (n[0] * 613) % 9000)

    def cut() -> None:
        os.ftruncate(tfd, (n[0] * 1237) % 20_000)

    def look() -> None:
        st = os.stat(p)
        os.pread(rfd, 8192, (st.st_size // 2) & ~4095)
        assert os.fstat(rfd).st_size >= 0

    threads = [threading.Thread(target=run, args=(fn,)) for fn in (extend, cut, look)]
    for t in threads:
        t.start()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(30)
    assert errors == []
    assert n[0] > 50, "the extender hardly ran"
    os.ftruncate(tfd, 7000)
    os.pwrite(wfd, b"Z" * 10, 30_000)
    for fd in (wfd, tfd, rfd):
        assert os.fstat(fd).st_size == 30_010
    assert os.stat(p).st_size == 30_010
    for fd in (wfd, tfd, rfd):
        os.close(fd)
    drop_caches()
    data = p.read_bytes()
    assert len(data) == 30_010 and data[7000:30_000] == bytes(23_000) and data[30_000:] == b"Z" * 10
    gp.restart()
    assert p.read_bytes() == data
    gp.verify_backing()
    report = gp.stderr()
    assert not re.search(r"(?i)sanitizer|runtime error|error|EIO", report), report


# --- f. data reaches the disk on close and on fsync --------------------------------------
def test_close_and_fsync_put_the_data_where_kill_9_cannot_take_it(gp: GuardPoint) -> None:
    closed = os.urandom(300_000 + 123)
    synced = os.urandom(200_000 + 77)
    with open(gp.mnt / "closed", "wb") as f:
        f.write(closed)  # no fsync: close alone must push it to the daemon
    partial = gp.mnt / "partial"
    partial.write_bytes(b"p" * 10_000)
    fd = os.open(partial, os.O_WRONLY)
    os.pwrite(fd, b"Q" * 100, 5000)  # partial pages over existing content, then closed
    os.close(fd)
    fd = os.open(gp.mnt / "synced", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, synced)
    os.fsync(fd)
    gp.kill9()  # with "synced" still open
    with contextlib.suppress(OSError):
        os.close(fd)
    gp.start()
    assert (gp.mnt / "closed").read_bytes() == closed
    assert (gp.mnt / "synced").read_bytes() == synced
    assert partial.read_bytes() == b"p" * 5000 + b"Q" * 100 + b"p" * 4900
    gp.verify_backing()
