"""The guard-point mount through a real FUSE mount: plaintext above, format v1 below."""

from __future__ import annotations

import errno
import mmap
import multiprocessing
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.cryptfile import EncryptedFile, IntegrityError, KeyVersion, StaticKeyring, read_header

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                                reason="needs /dev/fuse and fusermount3 (apt-get install fuse3)")


def _serve(backing: str, mountpoint: str, key: KeyVersion) -> None:
    """A guard point on the native data plane (strongroom-fuse), in a process of its own
    that is its control plane; the journal lives beside the backing directory."""
    from agents.guardpoint.dataplane import serve

    serve(backing, mountpoint, [key], key, chunk_size=4096, journal=backing + ".journal")


def _daemon_pid(proc: multiprocessing.process.BaseProcess) -> int:
    """The strongroom-fuse process a _serve process started."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@dataclass
class Mounted:
    mnt: Path
    backing: Path
    key: KeyVersion


@pytest.fixture
def gp(tmp_path: Path) -> Iterator[Mounted]:
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    proc = multiprocessing.get_context("spawn").Process(target=_serve, args=(str(backing), str(mnt), key))
    proc.start()
    deadline = time.monotonic() + 20
    while not os.path.ismount(mnt):
        assert proc.is_alive() and time.monotonic() < deadline, "the guard point did not mount"
        time.sleep(0.05)
    try:
        yield Mounted(mnt, backing, key)
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)


def test_plaintext_above_ciphertext_below(gp: Mounted) -> None:
    data = b"account 4711: balance 1,000,000\n" * 1000
    (gp.mnt / "ledger.txt").write_bytes(data)
    assert (gp.mnt / "ledger.txt").read_bytes() == data
    assert (gp.mnt / "ledger.txt").stat().st_size == len(data)
    raw = (gp.backing / "ledger.txt").read_bytes()
    assert raw[:4] == b"SRCF" and b"balance" not in raw
    assert read_header(str(gp.backing / "ledger.txt")).key_id == gp.key.key_id
    with EncryptedFile.open(str(gp.backing / "ledger.txt"), StaticKeyring([gp.key])) as f:
        assert f.read(0, f.size) == data


def test_random_access_append_truncate_and_holes(gp: Mounted) -> None:
    p = gp.mnt / "f"
    with open(p, "wb") as f:
        f.write(b"a" * 10_000)
    with open(p, "r+b") as f:
        f.seek(5000)
        f.write(b"B" * 3000)
        f.seek(20_000)
        f.write(b"end")  # a hole from 10,000 to 20,000
    with open(p, "ab") as f:
        f.write(b"+tail")
    expected = b"a" * 5000 + b"B" * 3000 + b"a" * 2000 + bytes(10_000) + b"end" + b"+tail"
    assert p.read_bytes() == expected
    os.truncate(p, 4000)
    assert p.read_bytes() == b"a" * 4000
    os.truncate(p, 9000)
    assert p.read_bytes() == b"a" * 4000 + bytes(5000)
    with open(p, "wb") as f:  # O_TRUNC
        f.write(b"new")
    assert p.read_bytes() == b"new" and p.stat().st_size == 3


def test_names_links_and_metadata(gp: Mounted) -> None:
    m = gp.mnt
    (m / "dir" / "sub").mkdir(parents=True)
    (m / "dir" / "sub" / "a").write_bytes(b"one")
    (m / "dir" / "b").write_bytes(b"two")
    os.rename(m / "dir" / "b", m / "dir" / "sub" / "a")  # over an existing file
    assert (m / "dir" / "sub" / "a").read_bytes() == b"two"
    assert sorted(os.listdir(m / "dir")) == ["sub"]
    os.symlink("sub/a", m / "dir" / "link")
    assert os.readlink(m / "dir" / "link") == "sub/a"
    assert (m / "dir" / "link").read_bytes() == b"two"
    os.link(m / "dir" / "sub" / "a", m / "dir" / "hard")
    assert (m / "dir" / "hard").stat().st_nlink == 2
    with open(m / "dir" / "hard", "ab") as f:
        f.write(b"+more")
    assert (m / "dir" / "sub" / "a").read_bytes() == b"two+more"
    os.chmod(m / "dir" / "hard", 0o640)
    assert (m / "dir" / "sub" / "a").stat().st_mode & 0o777 == 0o640
    os.utime(m / "dir" / "hard", ns=(1_000_000_000, 2_000_000_000))
    assert (m / "dir" / "hard").stat().st_mtime_ns == 2_000_000_000
    os.setxattr(m / "dir" / "hard", "user.owner", b"payments")
    assert os.getxattr(m / "dir" / "hard", "user.owner") == b"payments"
    assert "user.owner" in os.listxattr(m / "dir" / "hard")
    os.removexattr(m / "dir" / "hard", "user.owner")
    with pytest.raises(OSError) as exc:
        os.rmdir(m / "dir")
    assert exc.value.errno == errno.ENOTEMPTY
    for name in ("link", "hard", "sub/a"):
        os.unlink(m / "dir" / name)
    os.rmdir(m / "dir" / "sub")
    os.rmdir(m / "dir")
    assert os.listdir(m) == []
    assert os.statvfs(m).f_bsize > 0


def test_unlinked_open_file_stays_readable(gp: Mounted) -> None:
    p = gp.mnt / "tmp"
    p.write_bytes(b"still here")
    with open(p, "rb") as f:
        os.unlink(p)
        assert not p.exists()
        assert f.read() == b"still here"
    p.write_bytes(b"a new file with the same name")
    assert p.read_bytes() == b"a new file with the same name"


def test_mmap_through_the_kernel(gp: Mounted) -> None:
    p = gp.mnt / "mapped"
    p.write_bytes(bytes(8192))
    with open(p, "r+b") as f, mmap.mmap(f.fileno(), 8192) as m:
        m[100:105] = b"hello"
        m.flush()
    assert p.read_bytes()[100:105] == b"hello"


def test_fsync_and_concurrent_writers(gp: Mounted) -> None:
    from concurrent.futures import ThreadPoolExecutor

    p = gp.mnt / "shared"
    p.write_bytes(bytes(64 * 4096))

    def writer(i: int) -> None:
        fd = os.open(p, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes([i]) * 4096, i * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(writer, range(64)))
    data = p.read_bytes()
    assert all(data[i * 4096:(i + 1) * 4096] == bytes([i]) * 4096 for i in range(64))


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount's read-ahead is root's to tune")
def test_the_mount_reads_ahead_in_large_requests(gp: Mounted) -> None:
    """The kernel caps a FUSE mount's read-ahead at 128 KiB; strongroom-fuse widens it
    before INIT to 4 MiB, so that a sequential reader keeps several 1 MiB requests in
    flight (the kernel keeps the smaller of the device's value and our max_readahead)."""
    READ_AHEAD_KB = 4096  # SR_READ_AHEAD: several 1 MiB requests in flight

    st = os.stat(gp.mnt)
    ra = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
    deadline = time.monotonic() + 10
    while ra.read_text().strip() != str(READ_AHEAD_KB) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(ra.read_text()) == READ_AHEAD_KB > 128
    data = os.urandom(3 << 20)
    (gp.mnt / "big").write_bytes(data)
    fd = os.open(gp.mnt / "big", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read it through the mount again
    os.close(fd)
    assert (gp.mnt / "big").read_bytes() == data


def test_tampered_backing_file_reads_as_eio_never_garbage(gp: Mounted) -> None:
    p = gp.mnt / "victim"
    p.write_bytes(os.urandom(20_000))
    raw = bytearray((gp.backing / "victim").read_bytes())
    raw[128 + 4124 + 50] ^= 1  # inside chunk 1
    (gp.backing / "victim").write_bytes(bytes(raw))
    with open(p, "rb") as f:
        # The kernel still caches what was written through the mount (authentic data: the
        # mount keeps its page cache, docs/guardpoints.md); the disk is read once it is gone.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert len(f.read(4096)) == 4096  # chunk 0 is fine
        with pytest.raises(OSError) as exc:
            f.read(4096)
    assert exc.value.errno == errno.EIO


def test_a_plain_file_in_the_backing_directory_is_not_served(gp: Mounted) -> None:
    (gp.backing / "stray.txt").write_bytes(b"this was never encrypted")
    with pytest.raises(OSError) as exc:
        (gp.mnt / "stray.txt").read_bytes()
    assert exc.value.errno == errno.EIO


def _serve_with_control(backing: str, mountpoint: str, keys: list[KeyVersion], conn: object) -> None:
    """A guard point whose rotation the test drives through a pipe, as the agent's
    control plane does it (agents/guardpoint/manager.py): the new version is handed to
    the data plane, then each header is re-wrapped in place."""
    import threading

    from agents.cryptfile import rewrap_in_place
    from agents.guardpoint.dataplane import DataPlane
    from agents.guardpoint.policy import PERMIT_ALL

    def configure(p: DataPlane) -> None:
        p.set_key(keys[0])
        p.set_active(keys[0])
        p.set_policy(PERMIT_ALL)

    plane = DataPlane(backing, mountpoint, chunk_size=4096).start(configure=configure)

    def control() -> None:
        while True:
            op, path, version = conn.recv()  # type: ignore[attr-defined]
            try:
                key = next(k for k in keys if k.version == version)
                if op == "rewrap":
                    plane.set_key(key)
                    plane.set_active(key)
                    conn.send(("ok", rewrap_in_place(os.path.join(backing, path.lstrip("/")),  # type: ignore[attr-defined]
                                                     StaticKeyring(keys), key)))
                else:
                    conn.send(("ok", plane.rekey(path.lstrip("/"))))  # type: ignore[attr-defined]
            except Exception as exc:
                conn.send(("error", repr(exc)))  # type: ignore[attr-defined]

    threading.Thread(target=control, daemon=True).start()
    plane.wait()


def test_rotation_while_files_are_open_and_written(tmp_path: Path) -> None:
    import threading

    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    kid = uuid.uuid4()
    v1, v2 = KeyVersion(kid, 1, os.urandom(32)), KeyVersion(kid, 2, os.urandom(32))
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_with_control, args=(str(backing), str(mnt), [v1, v2], child))
    proc.start()
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mnt):
            assert proc.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        (mnt / "closed").write_bytes(b"at rest" * 10_000)
        model = bytearray(os.urandom(256 * 1024))
        (mnt / "busy").write_bytes(model)
        errors: list[BaseException] = []
        stop = threading.Event()

        def writer() -> None:
            try:
                fd = os.open(mnt / "busy", os.O_RDWR)
                i = 0
                while not stop.is_set():
                    off = (i * 7919) % (len(model) - 100)
                    data = os.urandom(100)
                    os.pwrite(fd, data, off)
                    model[off:off + 100] = data
                    assert os.pread(fd, 100, off) == data
                    i += 1
                os.fsync(fd)
                os.close(fd)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=writer)
        t.start()
        time.sleep(0.3)
        parent.send(("rewrap", "/busy", 2))
        assert parent.recv() == ("ok", True)
        parent.send(("rewrap", "/closed", 2))
        assert parent.recv() == ("ok", True)
        parent.send(("rewrap", "/busy", 2))
        assert parent.recv() == ("ok", False)  # already there
        time.sleep(0.3)
        stop.set()
        t.join(10)
        assert errors == []
        assert read_header(str(backing / "busy")).key_version == 2
        assert read_header(str(backing / "closed")).key_version == 2
        assert (mnt / "busy").read_bytes() == bytes(model)
        assert (mnt / "closed").read_bytes() == b"at rest" * 10_000
        with EncryptedFile.open(str(backing / "busy"), StaticKeyring([v2])) as f:  # v1 no longer needed
            assert f.read(0, f.size) == bytes(model)
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def test_kill_9_mid_write_loses_nothing_fsynced(tmp_path: Path) -> None:
    """The agent killed with SIGKILL while a client writes: after remounting, every file
    authenticates, and every byte fsynced before the kill reads back."""
    import signal
    import threading

    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    ctx = multiprocessing.get_context("spawn")

    def start() -> multiprocessing.process.BaseProcess:
        p = ctx.Process(target=_serve, args=(str(backing), str(mnt), key))
        p.start()
        deadline = time.monotonic() + 20
        while not os.path.ismount(mnt):
            assert p.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        return p

    proc = start()
    synced: dict[str, bytes] = {}
    stop = threading.Event()

    def client() -> None:
        # Appends of varying sizes (up to 1 MiB) to several files; after each fsync the
        # file's content so far is recorded as "must survive".
        contents = {f"f{i}": bytearray() for i in range(4)}
        n = 0
        try:
            while not stop.is_set():
                name = f"f{n % 4}"
                data = os.urandom(1 + (n * 7919) % (1 << 20))
                with open(mnt / name, "ab") as f:
                    f.write(data)
                    contents[name] += data
                    if n % 3 == 0:
                        f.flush()
                        os.fsync(f.fileno())
                        synced[name] = bytes(contents[name])
                n += 1
        except OSError:
            pass  # the mount went away under us: expected

    t = threading.Thread(target=client)
    t.start()
    time.sleep(1.5)
    os.kill(_daemon_pid(proc), signal.SIGKILL)  # the data plane itself, mid-write
    stop.set()
    t.join(20)
    proc.join(10)
    subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)
    assert synced, "the client never got to fsync"
    proc = start()
    try:
        for name in sorted(os.listdir(mnt)):
            with EncryptedFile.open(str(backing / name), StaticKeyring([key])) as f:
                f.verify()  # every chunk authenticates: no file was left unreadable
            data = (mnt / name).read_bytes()
            if name in synced:
                assert data[:len(synced[name])] == synced[name]
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.join(10)
        if proc.is_alive():
            proc.kill()


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed; scripts/test installs it")
def test_fio_with_data_verification(gp: Mounted) -> None:
    """A standard file-system exerciser: random writes of mixed sizes from two jobs, then
    every block read back and checked (crc32c with headers naming block and job)."""
    r = subprocess.run(
        ["fio", "--name=gp", f"--directory={gp.mnt}", "--size=24M", "--numjobs=2", "--rw=randrw",
         "--bsrange=4k-256k", "--ioengine=psync", "--verify=crc32c", "--verify_fatal=1",
         "--do_verify=1", "--verify_state_save=0", "--fsync=16", "--group_reporting",
         "--output-format=terse"],
        capture_output=True, text=True, timeout=300, cwd=gp.mnt.parent)  # fio drops state files in its cwd
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify" not in r.stderr.lower(), r.stderr
    for name in os.listdir(gp.backing):
        with EncryptedFile.open(str(gp.backing / name), StaticKeyring([gp.key])) as f:
            f.verify()


def test_o_direct_is_served_like_any_io(gp: Mounted) -> None:
    """O_DIRECT opens work: FUSE hands the I/O to us uncached, aligned or not, and the
    data goes through the same chunk encryption (databases and fio use it)."""
    import mmap

    aligned = mmap.mmap(-1, 8192)
    aligned.write(os.urandom(8192))
    fd = os.open(gp.mnt / "direct", os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    try:
        assert os.write(fd, aligned) == 8192
        assert os.pwrite(fd, b"unaligned", 8192 + 3) == 9
        back = mmap.mmap(-1, 12288)
        assert os.preadv(fd, [back], 0) == 8192 + 12
        assert back[:8192] == aligned[:] and back[8192:8204] == b"\0\0\0unaligned"
    finally:
        os.close(fd)
    assert (gp.mnt / "direct").read_bytes() == aligned[:] + b"\0\0\0unaligned"
    assert b"unaligned" not in (gp.backing / "direct").read_bytes()


def test_recovery_repairs_only_files_the_journal_lists(tmp_path: Path) -> None:
    """A crash mid-extension leaves a tail without a final chunk. The mount repairs it
    at the next start only when its journal says the file was being written; the same
    tail on any other file stays an integrity error (a truncation attack)."""
    from agents.cryptfile.chunks import ChunkCipher
    from agents.cryptfile.header import HEADER_SIZE
    from agents.guardpoint.dataplane import recover_journal

    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    ring = StaticKeyring([key])
    backing = tmp_path / "backing"
    backing.mkdir()
    journal = tmp_path / "journal"
    journal.mkdir()
    for name in ("written", "attacked"):
        with EncryptedFile.create(str(backing / name), key) as f:
            f.write(0, b"x" * 10000)
            file_key = f.header.unwrap(key)
            assert file_key is not None
            sealed = ChunkCipher(file_key, f.header.file_id).seal(2, b"x" * 4096, last=False)
        with open(backing / name, "r+b") as raw:  # chunk 2 grown and no longer final; then the crash
            raw.seek(HEADER_SIZE + 2 * (4096 + 28))
            raw.write(sealed)
    (journal / "1-2-abcd").write_text("written")
    assert recover_journal(str(backing), str(journal), ring) == ["written"]
    assert not os.listdir(journal)
    with EncryptedFile.open(str(backing / "written"), ring) as f:
        f.verify()
        assert f.read(0, f.size) == b"x" * 12288
    with EncryptedFile.open(str(backing / "attacked"), ring) as f, pytest.raises(IntegrityError):
        f.verify()


def test_a_file_under_a_key_the_host_does_not_hold_is_enokey(gp: Mounted) -> None:
    """A file whose header names a key version the data plane was not given answers
    ENOKEY (not EIO: nothing is wrong with it), and the mount goes on serving the rest."""
    other = KeyVersion(uuid.uuid4(), 3, os.urandom(32))
    with EncryptedFile.create(str(gp.backing / "foreign"), other) as f:
        f.write(0, b"not ours to read")
    with pytest.raises(OSError) as exc:
        (gp.mnt / "foreign").read_bytes()
    assert exc.value.errno == errno.ENOKEY
    assert (gp.mnt / "foreign").stat().st_size == len(b"not ours to read")  # sizes need no key
    (gp.mnt / "ours").write_bytes(b"fine")
    assert (gp.mnt / "ours").read_bytes() == b"fine"
