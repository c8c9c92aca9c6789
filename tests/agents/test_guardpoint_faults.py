"""Fault injection on a guard point's data plane (issue 25): a write, truncate or
fallocate that fails — ENOSPC from a real full file system, EIO/ENOSPC/EFBIG injected
into the Nth backing call, EFBIG from the backing file system's size limit, or the
daemon killed with SIGKILL at any of its steps — leaves every file exactly as it was
before the call or as after it, never torn, and every fsynced byte readable: through a
remounted guard point (after the supervisor's journal recovery) and through the Python
reference decryptor (agents/cryptfile).

The injecting layer is agents/dataplane/tests/faultfs.c, an LD_PRELOAD shim built by
`make -C agents/dataplane faultfs`. STRONGROOM_TEST_FUSE names another daemon binary
(to show that these tests fail on an older build).

The daemon runs write-through here (`--writeback-cache off`): these tests check every
backing call of every request, which needs one write(2) to be one request answered with
its own errno. Under the kernel's writeback cache (the default) the same requests come
later, from the kernel, and their errors reach the application at fsync: the test at the
end ("writeback") holds that mode to its own contract."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import random
import shutil
import struct
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.cryptfile import EncryptedFile, KeyVersion, StaticKeyring, read_header
from agents.daemon import AgentDaemon
from agents.guardpoint.shield import serving
from tests import parallel
from tests.agents.test_agent_port import Host
from tests.agents.test_guardpoint_daemon import agent, eventually  # noqa: F401 - the agent fixture
from tests.conftest import unique

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                                reason="needs /dev/fuse and fusermount3 (apt-get install fuse3)")

DATAPLANE = Path(__file__).resolve().parents[2] / "agents" / "dataplane"
SHIM = DATAPLANE / "build" / "faultfs.so"
KILL = 9999  # faultfs.c: SIGKILL at that call
CS = 4096
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
FALLOC_FL_KEEP_SIZE = 1


def _daemon() -> Path:
    from agents.guardpoint.dataplane import DAEMON
    return Path(os.environ.get("STRONGROOM_TEST_FUSE", str(DAEMON)))


@pytest.fixture(scope="module")
def shim() -> Path:
    r = parallel.make(DATAPLANE, "faultfs")
    if r.returncode != 0:
        pytest.fail(f"make faultfs failed:\n{r.stdout}{r.stderr}", pytrace=False)
    return SHIM


class Faults:
    """The shim's shared control block (faultfs.c)."""

    def __init__(self, path: Path) -> None:
        path.write_bytes(bytes(64))
        self.path = path
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 64)

    def _set(self, slot: int, value: int) -> None:
        struct.pack_into("<q", self._map, slot * 8, value)

    def _get(self, slot: int) -> int:
        return int(struct.unpack_from("<q", self._map, slot * 8)[0])

    def arm(self, nth: int, err: int, *, ops: int = 0, sticky: bool = False, torn: bool = False) -> None:
        self._set(3, ops)
        self._set(1, err)
        self._set(5, 1 if sticky else 0)
        self._set(6, 1 if torn else 0)
        self._set(0, nth)

    def disarm(self) -> None:
        self._set(0, 0)
        self._set(5, 0)

    @property
    def calls(self) -> int:
        return self._get(2)

    @property
    def injected(self) -> int:
        return self._get(4)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class GuardPoint:
    """A guard point the way the agent's supervisor runs one: journal recovery, then the
    daemon; `restart` after a kill does what the supervisor does (lazy unmount, recover,
    start again)."""

    def __init__(self, root: Path, mnt: Path, env: dict[str, str] | None = None, *,
                 writeback: bool = False) -> None:
        self.root, self.mnt = root, mnt
        self.writeback = writeback
        self.backing, self.journal = root / "backing", root / "backing.journal"
        self.backing.mkdir(exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        self.key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
        self.env = env or {}
        self.plane: object = None
        self.start()

    def start(self) -> None:
        from agents.guardpoint.dataplane import DataPlane, recover_journal
        from agents.guardpoint.policy import PERMIT_ALL

        recover_journal(str(self.backing), str(self.journal), StaticKeyring([self.key]))
        plane = DataPlane(str(self.backing), str(self.mnt), chunk_size=CS, journal=str(self.journal),
                          executable=_daemon(), threads=4, writeback_cache=self.writeback)
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            def configure(p: DataPlane) -> None:
                p.set_key(self.key)
                p.set_active(self.key)
                p.set_policy(PERMIT_ALL)
            plane.start(configure=configure)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.plane = plane

    def stop(self) -> None:
        from agents.guardpoint.dataplane import DataPlane
        assert isinstance(self.plane, DataPlane)
        if self.plane.process is not None and self.plane.process.poll() is None:
            self.plane.shutdown()
        self.plane.kill()
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], check=False, capture_output=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def died(self) -> bool:
        """Whether the daemon is dying or dead (its connection closes before it is reaped)."""
        from agents.guardpoint.dataplane import DataPlane
        assert isinstance(self.plane, DataPlane) and self.plane.process is not None
        try:
            self.plane.process.wait(30)
        except subprocess.TimeoutExpired:
            return False
        return True

    def reference(self, name: str) -> bytes:
        """The file as the Python reference decryptor reads it from the backing store:
        every chunk must authenticate and the file must end in its final chunk."""
        with EncryptedFile.open(str(self.backing / name), StaticKeyring([self.key])) as f:
            f.verify()
            return f.read(0, f.size)

    def mounted(self, name: str) -> bytes:
        return (self.mnt / name).read_bytes()


@contextlib.contextmanager
def guard_point(root: Path, mnt: Path, env: dict[str, str] | None = None, *,
                writeback: bool = False) -> Iterator[GuardPoint]:
    gp = GuardPoint(root, mnt, env, writeback=writeback)
    try:
        yield gp
    finally:
        gp.stop()


def _outside_backing(root: Path) -> list[str]:
    """Files a failure left beside the backing store (nothing may be)."""
    return sorted(p.name for p in root.iterdir() if p.name not in ("backing", "backing.journal", "faults"))


# ---- the scripted workload ---------------------------------------------------------------
# Each step: (name, setup content, operation on an O_RDWR descriptor, expected content after).
Step = tuple[str, bytes, Callable[[int], None], bytes]
_written: list[int] = []  # what the last pwrite answered


def _pwrite(fd: int, data: bytes, off: int) -> None:
    """A write the kernel may split into several requests (a partial page ends one): if
    a later one fails, the call answers the bytes that made it — a legal short write,
    whose chunks must each be old or new."""
    _written.clear()
    written = 0
    while written < len(data):
        n = os.pwrite(fd, data[written:], off + written)
        written += n
        _written.append(written)
        if n == 0:
            break


def _fallocate(fd: int, mode: int, off: int, length: int) -> None:
    if _libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _write(off: int, data: bytes) -> Callable[[int], None]:
    op = lambda fd: _pwrite(fd, data, off)  # noqa: E731
    op.write = (off, data)  # type: ignore[attr-defined]
    return op


def _steps() -> list[Step]:
    rnd = random.Random(25)
    base = rnd.randbytes(3 * CS + 1234)  # a partial final chunk
    patch, tail, far, last = rnd.randbytes(CS + 300), rnd.randbytes(2 * CS + 77), rnd.randbytes(555), rnd.randbytes(100)
    sparse = base + bytes(8 * CS)
    return [
        ("overwrite across chunks", base, _write(1000, patch), _apply(base, 1000, patch)),
        ("overwrite in the final partial chunk", base, _write(3 * CS + 500, last), _apply(base, 3 * CS + 500, last)),
        ("append from a partial final chunk", base, _write(len(base), tail), base + tail),
        ("write far past the end", base, _write(40 * CS + 3, far), _apply(base, 40 * CS + 3, far)),
        ("truncate up", base, lambda fd: os.ftruncate(fd, 25 * CS + 9), base + bytes(25 * CS + 9 - len(base))),
        ("truncate down mid-chunk", base, lambda fd: os.ftruncate(fd, CS + 17), base[:CS + 17]),
        ("truncate down within the final chunk", base, lambda fd: os.ftruncate(fd, 3 * CS + 3), base[:3 * CS + 3]),
        ("truncate to zero", base, lambda fd: os.ftruncate(fd, 0), b""),
        ("fallocate extends", base, lambda fd: _fallocate(fd, 0, 0, 9 * CS), base + bytes(9 * CS - len(base))),
        ("fallocate keep size", base, lambda fd: _fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 20 * CS), base),
        ("fill a hole", sparse, _write(5 * CS + 11, patch), _apply(sparse, 5 * CS + 11, patch)),
    ]


def _setup(gp: GuardPoint, name: str, content: bytes) -> None:
    with contextlib.suppress(FileNotFoundError):
        (gp.mnt / name).unlink()
    fd = os.open(gp.mnt / name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if content:
            _pwrite(fd, content, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _run(gp: GuardPoint, name: str, op: Callable[[int], None]) -> OSError | None:
    """The operation's own error, or None; an fsync after it may fail too (EIO) without
    making the operation's answer a lie."""
    fd = os.open(gp.mnt / name, os.O_RDWR)
    try:
        try:
            op(fd)
        except OSError as exc:
            return exc
        with contextlib.suppress(OSError):
            os.fsync(fd)
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _apply(before: bytes, off: int, data: bytes) -> bytes:
    out = bytearray(before)
    if off + len(data) > len(out):
        out.extend(bytes(off + len(data) - len(out)))
    out[off:off + len(data)] = data
    return bytes(out)


def _old_or_new(got: bytes, before: bytes, after: bytes, what: str, write: tuple[int, bytes] | None) -> str:
    if got == before:
        return "old"
    if got == after:
        return "new"
    if write is not None and _written and got == _apply(before, write[0], write[1][:_written[-1]]):
        return "short"  # the call answered this many bytes: each chunk old or new
    raise AssertionError(f"{what}: torn — {len(got)} bytes, neither the {len(before)} before "
                         f"nor the {len(after)} after")


# ---- (2) the Nth backing call fails ------------------------------------------------------
@pytest.mark.parametrize("sticky", [False, True], ids=["one-call", "every-call-after"])
def test_every_backing_call_of_a_workload_failing_leaves_old_or_new(tmp_path: Path, shim: Path,
                                                                    sticky: bool) -> None:
    """For each step of the workload, and for every backing write, truncate, fallocate
    and fsync that step makes (its journal and undo writes too), that call fails — a
    torn half-write where it is a write, then ENOSPC, EIO or EFBIG — once, or (sticky)
    with every call after it as well, so the put-back itself fails and only the journal
    can repair the file. The call answers an error or succeeds; the file reads back old
    or new, through the mount, the reference decryptor and after a remount."""
    root = tmp_path / "gp"
    root.mkdir()
    faults = Faults(tmp_path / "faults")
    env = {"LD_PRELOAD": str(shim), "SR_FAULT_CTL": str(faults.path), "SR_FAULT_DIR": str(root)}
    errors = [errno.ENOSPC, errno.EIO, errno.EFBIG]
    tried = 0
    with guard_point(root, tmp_path / "mnt", env) as gp:
        for i, (what, before, op, after) in enumerate(_steps()):
            name = f"f{i}"
            _setup(gp, name, before)
            start = faults.calls
            assert _run(gp, name, op) is None, what
            calls = faults.calls - start
            assert calls > 0, f"{what}: the shim saw no backing call"
            assert gp.reference(name) == after
            # Every call from the first on, journal and undo writes included, until the
            # step runs out of calls (their number can vary: a journal entry kept from
            # the last close is taken back without I/O).
            for nth in range(1, 4 * calls + 16):
                name = f"f{i}-{nth}"
                _setup(gp, name, before)
                err = errors[nth % len(errors)]
                injected = faults.injected
                faults.arm(nth, err, sticky=sticky, torn=True)
                exc = _run(gp, name, op)
                faults.disarm()
                label = f"{what}, call {nth} failing with {errno.errorcode[err]}"
                if faults.injected == injected:
                    assert exc is None and gp.mounted(name) == gp.reference(name) == after, label
                    break
                tried += 1
                if sticky:
                    gp.restart()  # a failed put-back leaves the file to the journal
                got = gp.mounted(name)
                state = _old_or_new(got, before, after, label, getattr(op, "write", None))
                assert gp.reference(name) == got, label
                if exc is not None and not sticky:  # short: an earlier request succeeded, then this one failed
                    assert state in ("old", "short"), f"{label}: answered {exc} yet changed the file"
            gp.restart()
            assert gp.mounted(name) == gp.reference(name) == after, f"{what}: after a remount"
    faults.close()
    assert tried > len(_steps())
    assert _outside_backing(root) == []


def test_a_file_left_to_the_journal_takes_no_more_writes_until_the_restart(tmp_path: Path, shim: Path) -> None:
    """Every backing write fails, so a failed write cannot be put back either: the file
    is left to its journal (undo record armed). When the disk recovers, the file
    reopened must refuse writes (EIO) until the restart puts it back — a write taken
    then would be undone by the old record, and bytes fsynced after it lost."""
    root = tmp_path / "gp"
    root.mkdir()
    faults = Faults(tmp_path / "faults")
    env = {"LD_PRELOAD": str(shim), "SR_FAULT_CTL": str(faults.path), "SR_FAULT_DIR": str(root / "backing")}
    before = os.urandom(3 * CS + 100)
    with guard_point(root, tmp_path / "mnt", env) as gp:
        _setup(gp, "f", before)
        faults.arm(1, errno.EIO, sticky=True, torn=True)  # the run's write (in place: nothing to reserve), the put-back
        assert _run(gp, "f", _write(10, os.urandom(2 * CS))) is not None
        faults.disarm()
        fd = os.open(gp.mnt / "f", os.O_RDWR)
        try:
            with pytest.raises(OSError) as info:
                os.pwrite(fd, b"later", 0)
            assert info.value.errno == errno.EIO
        finally:
            os.close(fd)
        gp.restart()
        assert gp.mounted("f") == gp.reference("f") == before
        fd = os.open(gp.mnt / "f", os.O_RDWR)
        try:
            assert os.pwrite(fd, b"later", 0) == 5  # back to normal
        finally:
            os.close(fd)
        assert gp.mounted("f") == b"later" + before[5:]
    faults.close()


# ---- (4) kill -9 at every step --------------------------------------------------------
def test_kill_9_at_every_backing_call_leaves_old_or_new(tmp_path: Path, shim: Path) -> None:
    """The daemon SIGKILLs itself at each backing call of each step (after writing half
    of it, where it is a write): after the supervisor's recovery and a remount every
    file is old or new, and what was fsynced before the step is intact."""
    root = tmp_path / "gp"
    root.mkdir()
    faults = Faults(tmp_path / "faults")
    env = {"LD_PRELOAD": str(shim), "SR_FAULT_CTL": str(faults.path), "SR_FAULT_DIR": str(root)}
    kills = 0
    with guard_point(root, tmp_path / "mnt", env) as gp:
        for i, (what, before, op, after) in enumerate(_steps()):
            if "fallocate keep" in what:
                continue  # changes no byte: nothing to tear
            name = f"k{i}"
            _setup(gp, name, before)
            start = faults.calls
            assert _run(gp, name, op) is None, what
            calls = faults.calls - start
            for nth in range(1, 4 * calls + 16):  # until the step runs out of calls
                name = f"k{i}-{nth}"
                _setup(gp, name, before)  # fsynced: must survive whatever follows
                injected = faults.injected
                faults.arm(nth, KILL, torn=True)
                _run(gp, name, op)
                faults.disarm()
                label = f"{what}, killed at call {nth}"
                if faults.injected == injected:
                    assert gp.mounted(name) == gp.reference(name) == after, label
                    break
                kills += 1
                assert gp.died(), f"{label}: the daemon lives on"
                gp.restart()
                got = gp.mounted(name)
                _old_or_new(got, before, after, label, getattr(op, "write", None))
                assert gp.reference(name) == got, label
    faults.close()
    assert kills > 2 * len(_steps())
    assert _outside_backing(root) == []


def test_kill_9_at_random_points_of_writes_and_fsyncs(tmp_path: Path, shim: Path) -> None:
    """Random writes, appends, truncates and fsyncs on three files, the daemon killed at
    a random backing call each round (seeded: a failure names its round): after the
    supervisor's recovery every file holds exactly what was acknowledged, except the
    one whose call was cut, which is as before or after that call."""
    root = tmp_path / "gp"
    root.mkdir()
    faults = Faults(tmp_path / "faults")
    env = {"LD_PRELOAD": str(shim), "SR_FAULT_CTL": str(faults.path), "SR_FAULT_DIR": str(root / "backing")}
    rnd = random.Random(int(os.environ.get("STRONGROOM_FAULT_SEED", "2025")))
    model = {f"r{k}": b"" for k in range(3)}
    killed = 0
    with guard_point(root, tmp_path / "mnt", env) as gp:
        for name in model:
            _setup(gp, name, b"")
        for rnd_round in range(12):
            faults.arm(rnd.randint(1, 60), KILL, torn=rnd.random() < 0.7)
            cut: tuple[str, bytes, bytes, Callable[[int], None]] | None = None
            for _ in range(40):
                name = rnd.choice(sorted(model))
                before = model[name]
                kind = rnd.choice(["write", "append", "append", "truncate", "fallocate"])
                if kind == "write":
                    off = rnd.randrange(len(before) + 2 * CS)
                    data = rnd.randbytes(rnd.choice([1, 300, CS, 2 * CS + 5]))
                    op, after = _write(off, data), _apply(before, off, data)
                elif kind == "append":
                    data = rnd.randbytes(rnd.choice([7, CS - 3, 3 * CS + 1]))
                    op, after = _write(len(before), data), before + data
                elif kind == "truncate":
                    size = rnd.randrange(len(before) + 4 * CS)
                    op = (lambda n: lambda fd: os.ftruncate(fd, n))(size)
                    after = before[:size] + bytes(max(0, size - len(before)))
                else:
                    size = len(before) + rnd.randrange(1, 3 * CS)
                    op = (lambda n: lambda fd: _fallocate(fd, 0, 0, n))(size)
                    after = before + bytes(size - len(before))
                fd = -1
                try:
                    fd = os.open(gp.mnt / name, os.O_RDWR)
                    op(fd)
                    if rnd.random() < 0.4:
                        os.fsync(fd)
                except OSError:
                    cut = (name, before, after, op)
                    break
                finally:
                    if fd >= 0:
                        with contextlib.suppress(OSError):
                            os.close(fd)
                model[name] = after
            faults.disarm()
            if cut is None:
                continue
            killed += 1
            assert gp.died(), f"round {rnd_round}: a call failed but the daemon lives"
            gp.restart()
            for name, content in model.items():
                got = gp.mounted(name)
                assert gp.reference(name) == got, f"round {rnd_round}: {name}"
                if cut[0] == name:
                    state = _old_or_new(got, cut[1], cut[2], f"round {rnd_round}: {name}",
                                        getattr(cut[3], "write", None))
                    if state != "old":
                        model[name] = got
                else:
                    assert got == content, f"round {rnd_round}: {name} lost acknowledged bytes"
    faults.close()
    assert killed >= 6, f"only {killed} of 12 rounds reached their kill"
    assert _outside_backing(root) == []


def test_an_undo_record_is_never_put_onto_another_file(tmp_path: Path, shim: Path) -> None:
    """A kill leaves an armed undo record for a file; before the restart another file
    takes its name (a rename in the backing store). Recovery must leave that other file
    as it is: the record names its file by file id, not only by path."""
    root = tmp_path / "gp"
    root.mkdir()
    faults = Faults(tmp_path / "faults")
    env = {"LD_PRELOAD": str(shim), "SR_FAULT_CTL": str(faults.path), "SR_FAULT_DIR": str(root / "backing")}
    with guard_point(root, tmp_path / "mnt", env) as gp:
        _setup(gp, "victim", os.urandom(3 * CS + 5))
        other = os.urandom(5 * CS)
        _setup(gp, "other", other)
        faults.arm(1, KILL, torn=True)  # in the run's write (in place: nothing to reserve)
        assert _run(gp, "victim", _write(100, os.urandom(2 * CS))) is not None
        faults.disarm()
        assert gp.died()
        assert any(n.endswith(".undo") for n in os.listdir(gp.journal)), "no undo record was armed"
        os.replace(gp.backing / "other", gp.backing / "victim")
        gp.restart()
        assert gp.mounted("victim") == gp.reference("victim") == other
    faults.close()


# ---- (1) a real full file system ---------------------------------------------------------
@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "tiny"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(where)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


@pytest.mark.parametrize("fallocate", [True, False], ids=["reserved", "no-fallocate"])
def test_writers_filling_a_tiny_file_system_lose_nothing(tmp_path: Path, tiny_tmpfs: Path, shim: Path,
                                                         fallocate: bool) -> None:
    """Three writers extend their files on a 3 MiB tmpfs until it is full (appends of
    odd sizes, fsync after some), then try truncates up and overwrites of the final
    partial chunk on the full file system. Each file must hold exactly what its writes
    that succeeded wrote (a failed one changed nothing), before and after a remount,
    through the mount and the reference decryptor. Again with every fallocate answering
    EOPNOTSUPP (a file system without it): nothing is reserved, and a write that meets
    ENOSPC half way is put back."""
    env = None
    if not fallocate:
        faults = Faults(tmp_path / "faults")
        faults.arm(1, errno.EOPNOTSUPP, ops=4, sticky=True)
        env = {"LD_PRELOAD": str(shim), "SR_FAULT_CTL": str(faults.path), "SR_FAULT_DIR": str(tiny_tmpfs)}
    with guard_point(tiny_tmpfs, tmp_path / "mnt", env) as gp:
        expect: dict[str, bytearray] = {}
        synced: dict[str, bytes] = {}
        lock = threading.Lock()

        def writer(k: int) -> None:
            rnd = random.Random(k)
            name = f"w{k}"
            data = bytearray()
            fd = os.open(gp.mnt / name, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                full = 0
                while full < 5:
                    chunk = rnd.randbytes(rnd.choice([1, 100, CS - 1, CS + 1, 3 * CS + 5, 40000]))
                    try:
                        n = os.pwrite(fd, chunk, len(data))
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
                        full += 1
                        continue
                    data += chunk[:n]
                    if rnd.random() < 0.3:
                        os.fsync(fd)
                        with lock:
                            synced[name] = bytes(data)
                # on the full file system: a truncate up and an overwrite of the final chunk
                for size in (len(data) + 10 * CS + 1, len(data) + 1):
                    try:
                        os.ftruncate(fd, size)
                        data += bytes(size - len(data))
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
                if data:
                    at = max(len(data) - 10, 0)
                    with contextlib.suppress(OSError):
                        if os.pwrite(fd, b"Z" * 10, at) == 10:
                            data[at:at + 10] = b"Z" * 10
            finally:
                os.close(fd)
                with lock:
                    expect[name] = data

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert set(expect) == {"w0", "w1", "w2"}, "a writer failed (its assertion is above)"
        for name, data in expect.items():
            assert gp.mounted(name) == bytes(data), name
            assert gp.reference(name) == bytes(data), name
        gp.restart()
        for name, data in expect.items():
            assert gp.mounted(name) == gp.reference(name) == bytes(data), f"{name} after a remount"
            fsynced = synced.get(name, b"")[:-10]  # the last ten bytes may have been overwritten since
            assert gp.mounted(name).startswith(fsynced), f"{name}: fsynced bytes lost"
        assert synced, "no writer got to fsync"
    if not fallocate:
        assert faults.injected > 0, "the daemon reserved nothing: no fallocate to refuse"


# ---- (3) EFBIG from the backing file system -------------------------------------------------
@pytest.fixture(params=["tmpfs", "ext4"])
def small_fs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    where = tmp_path / "fs"
    where.mkdir()
    if request.param == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(where)]
    else:
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("mkfs.ext4 is missing (apt-get install e2fsprogs; scripts/test installs it)")
        image = tmp_path / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(32 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", str(image)], check=True, capture_output=True)
        cmd = ["mount", "-o", "loop", str(image), str(where)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {request.param} here (needs root and loop devices): {r.stderr.strip()}")
    try:
        yield request.param, where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def test_a_size_the_backing_file_system_refuses_is_efbig_and_changes_nothing(
        tmp_path: Path, small_fs: tuple[str, Path]) -> None:
    """`printf hello > g; sync; truncate -s 17T g` and a pwrite at 17 TiB: ext4 (16 TiB
    at most) refuses them, and the guard point must answer EFBIG up front with the file
    unchanged; tmpfs takes 17 TiB but not a stored length past 2^63, which is refused the
    same way. Either way the file is old or new, never torn."""
    kind, where = small_fs
    with guard_point(where, tmp_path / "mnt") as gp:
        g = gp.mnt / "g"
        g.write_bytes(b"hello")
        os.sync()
        sizes = [17 << 40, (1 << 63) - 1]
        for size in sizes:
            before = gp.mounted("g")
            try:
                os.truncate(g, size)
            except OSError as exc:
                assert exc.errno == errno.EFBIG, exc
                assert os.stat(g).st_size == len(before)
                assert gp.mounted("g") == gp.reference("g") == before
            else:
                assert kind == "tmpfs" and size == 17 << 40, f"{kind} took a {size}-byte file"
                assert os.stat(g).st_size == size
                os.truncate(g, len(before))
            assert gp.mounted("g") == gp.reference("g") == before
            fd = os.open(g, os.O_RDWR)
            try:
                os.pwrite(fd, b"x", size - 1)  # ends at `size`
            except OSError as exc:
                assert exc.errno == errno.EFBIG, exc
            else:
                assert kind == "tmpfs" and size == 17 << 40, f"{kind} took a write at {size}"
                assert os.fstat(fd).st_size == size
                os.ftruncate(fd, len(before))
            finally:
                os.close(fd)
            assert gp.mounted("g") == gp.reference("g") == before
        gp.restart()
        assert gp.mounted("g") == gp.reference("g") == b"hello"


# ---- one integrity failure, one audit event ------------------------------------------------
def test_a_damaged_file_reports_once_however_often_it_is_opened(tmp_path: Path) -> None:
    """A file that fails to authenticate, opened 50 times, gives one integrity event
    (agent.guardpoint.integrity_error) for the period, not fifty."""
    from agents.guardpoint.dataplane import DataPlane
    from agents.guardpoint.policy import PERMIT_ALL

    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    events: list[str] = []
    plane = DataPlane(str(backing), str(mnt), chunk_size=CS, executable=_daemon(), writeback_cache=False,
                      on_event=lambda e: events.append(e.as_audit()["event"]))

    def configure(p: DataPlane) -> None:
        p.set_key(key)
        p.set_active(key)
        p.set_policy(PERMIT_ALL)

    plane.start(configure=configure)
    try:
        (mnt / "d").write_bytes(os.urandom(3 * CS))
        (mnt / "other").write_bytes(os.urandom(3 * CS))
        for name in ("d", "other"):
            with open(backing / name, "r+b") as f:
                f.seek(128 + CS + 40)
                f.write(b"\xff")
        for name in ("d", "other"):  # the mount's page cache still holds what was written
            fd = os.open(mnt / name, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        for _ in range(50):
            for name in ("d", "other"):
                with pytest.raises(OSError) as info, open(mnt / name, "rb", buffering=0) as f:
                    f.read()
                assert info.value.errno == errno.EIO
        plane.status()  # a round trip: every event sent before it has arrived
        integrity = [e for e in events if e.endswith("integrity_error")]
        assert len(integrity) == 2, integrity  # one per damaged file
    finally:
        plane.shutdown()
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)


# ---- re-key: bounded free space, a damaged file does not block the others -------------------
def test_rekey_says_enospc_before_it_starts_and_skips_nothing_else(tmp_path: Path, tiny_tmpfs: Path,
                                                                    shim: Path) -> None:
    """A re-key writes the file anew beside itself: on a file system without room for
    that copy it answers ENOSPC before writing anything (the file as it was, no
    temporary file left); a file that fails to authenticate answers EIO, and the next
    file re-keys all the same."""
    from agents.guardpoint.dataplane import DataPlane

    faults = Faults(tmp_path / "faults")  # never armed: it counts the backing writes
    env = {"LD_PRELOAD": str(shim), "SR_FAULT_CTL": str(faults.path), "SR_FAULT_DIR": str(tiny_tmpfs / "backing")}
    with guard_point(tiny_tmpfs, tmp_path / "mnt", env) as gp:
        assert isinstance(gp.plane, DataPlane)
        big = os.urandom(1900 * 1024)  # more than half of the 3 MiB
        (gp.mnt / "big").write_bytes(big)
        (gp.mnt / "bad").write_bytes(os.urandom(3 * CS))
        (gp.mnt / "good").write_bytes(b"good" * 1000)
        with open(gp.backing / "bad", "r+b") as f:
            f.seek(128 + CS + 9)
            f.write(b"\0")
        new = KeyVersion(gp.key.key_id, 2, os.urandom(32))
        gp.plane.set_key(new)
        gp.plane.set_active(new)
        stored = (gp.backing / "big").read_bytes()
        calls = faults.calls
        assert gp.plane.rekey("big") == errno.ENOSPC
        assert faults.calls == calls, "the re-key wrote before it found there was no room"
        assert (gp.backing / "big").read_bytes() == stored
        assert sorted(os.listdir(gp.backing)) == ["bad", "big", "good"]
        assert gp.plane.rekey("bad") == errno.EIO
        assert gp.plane.rekey("good") == 0
        keyring = StaticKeyring([gp.key, new])
        with EncryptedFile.open(str(gp.backing / "good"), keyring) as f:
            assert f.header.key_version == 2 and f.read(0, f.size) == b"good" * 1000
        assert gp.mounted("big") == big


def test_the_agent_rekeys_around_a_damaged_file_and_says_when_there_is_no_room(
        tmp_path: Path, tiny_tmpfs: Path, agent: tuple[Host, AgentDaemon], admin: httpx.Client) -> None:  # noqa: F811
    """Through the agent and the key server: a re-key finishes with the damaged file
    skipped and named in the guard point's status; a re-key the backing file system has
    no room for is refused before it starts, with the reason in the status, every file
    as it was."""
    host, daemon = agent
    key = admin.post("/api/v1/keys", json={"name": unique("gpf")}).json()
    mnt, backing = tmp_path / "protected", tiny_tmpfs / "b"
    gp = admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": str(mnt), "backing_path": str(backing),
                                                  "key": key["name"], "default_effect": "permit"}).json()
    daemon.beat()
    eventually(lambda: serving(str(mnt)), "the mount")
    (mnt / "good").write_bytes(b"good" * 1000)
    (mnt / "bad").write_bytes(os.urandom(3 * CS))
    with open(backing / "bad", "r+b") as f:
        f.seek(128 + CS + 9)
        f.write(b"\0")
    good_id = read_header(str(backing / "good")).file_id

    def status() -> dict[str, Any]:
        daemon.beat()
        return dict(admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"][0])

    assert admin.post(f"/api/v1/guard-points/{gp['id']}/rekey").status_code == 202
    daemon.beat()
    eventually(lambda: (status().get("rekey") or {}).get("finished"), "the re-key around the damaged file")
    assert read_header(str(backing / "good")).file_id != good_id
    assert "fail to authenticate: bad" in status()["detail"]
    assert (mnt / "good").read_bytes() == b"good" * 1000

    big = os.urandom(1900 * 1024)
    (mnt / "big").write_bytes(big)
    big_id = read_header(str(backing / "big")).file_id
    assert admin.post(f"/api/v1/guard-points/{gp['id']}/rekey").status_code == 202
    daemon.beat()
    detail = eventually(lambda: "re-key needs" in status()["detail"] and status()["detail"], "the refusal")
    assert "bytes free on the backing file system" in detail
    assert read_header(str(backing / "big")).file_id == big_id
    assert (mnt / "big").read_bytes() == big
    assert not [n for n in os.listdir(backing) if n.startswith(".srtmp-")]


# ---- the writeback cache's contract ---------------------------------------------------------
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_writeback_failures_reach_fsync_and_reads_show_what_is_stored(tmp_path: Path, shim: Path,
                                                                      err: int) -> None:
    """Under the writeback cache a write(2) completes in the kernel and the daemon gets it
    later; when that backing write fails (torn half-way, then `err`), the error must reach
    the application at fsync, the stored file must be old or new (never torn: the reference
    decryptor authenticates it), and reads through the mount must show what is stored, not
    the pages the kernel kept. What an fsync confirmed survives a remount."""
    root = tmp_path / "gp"
    root.mkdir()
    faults = Faults(tmp_path / "faults")
    env = {"LD_PRELOAD": str(shim), "SR_FAULT_CTL": str(faults.path), "SR_FAULT_DIR": str(root)}
    with guard_point(root, tmp_path / "mnt", env, writeback=True) as gp:
        old = os.urandom(5 * CS + 7)
        (gp.mnt / "f").write_bytes(old)
        fd = os.open(gp.mnt / "f", os.O_RDWR)
        try:
            os.fsync(fd)
            new = bytearray(old)
            new[CS - 5:3 * CS + 9] = os.urandom(2 * CS + 14)  # across chunks, not aligned
            assert os.pwrite(fd, bytes(new[CS - 5:3 * CS + 9]), CS - 5) == 2 * CS + 14  # the cache took it
            faults.arm(1, err, sticky=True, torn=True)
            with pytest.raises(OSError) as e:
                os.fsync(fd)
            faults.disarm()
            assert e.value.errno in (err, errno.EIO), e.value
            stored = gp.reference("f")
            assert stored in (old, bytes(new))
            eventually(lambda: os.pread(fd, len(old) + 10, 0) == stored, "reads to show the stored file")
        finally:
            os.close(fd)
        # a write that an fsync confirmed, after the failure
        with open(gp.mnt / "g", "wb") as g:
            g.write(b"confirmed")
            os.fsync(g.fileno())
        gp.restart()
        assert gp.mounted("f") == gp.reference("f") == stored
        assert gp.mounted("g") == b"confirmed"
    assert faults.injected > 0, "no backing call failed: the test proved nothing"

