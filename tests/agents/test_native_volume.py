"""strongroom-volume (agents/dataplane/volume) on real parts: LUKS2 containers that
cryptsetup made, real FUSE mounts, loop devices and ext4.

The checks that do not trust our own code: cryptsetup's offline encryption of a known
plaintext read back through the daemon; the container decrypted independently (the
`cryptography` package's XTS under the volume key cryptsetup dumps); and cryptsetup's
offline re-key, which decrypts what the daemon wrote with cryptsetup's own code. Every
mount test runs against the optimised and the AddressSanitizer + UBSan build; a
sanitizer report on the daemon's stderr fails it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tests import parallel

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "agents" / "dataplane" / "volume"
MiB = 1 << 20

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse (FUSE kernel module)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (FUSE mounts of other users' files, loop devices)"),
    pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="needs cryptsetup (apt-get install cryptsetup-bin)"),
    pytest.mark.timeout(120),
]
needs_loop = pytest.mark.skipif(not os.path.exists("/dev/loop-control") or shutil.which("losetup") is None,
                                reason="needs loop devices (/dev/loop-control, losetup)")

# Binary-safe on purpose: a NUL and a trailing newline are part of the passphrase.
PASSPHRASE = b"correct horse\x00battery staple\n"
FAST = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]


# --- building, containers, serving ------------------------------------------------------
@pytest.fixture(scope="session")
def binaries() -> dict[str, Path]:
    for pkg in ("fuse3", "libcryptsetup", "json-c"):
        if shutil.which("pkg-config") is None or subprocess.run(["pkg-config", "--exists", pkg]).returncode:
            pytest.fail(f"{pkg} development files are missing: apt-get install libfuse3-dev libcryptsetup-dev "
                        "fuse3 pkg-config gcc (scripts/test does)", pytrace=False)
    r = parallel.make(SRC, "all", "asan")
    if r.returncode:
        pytest.fail(f"make -C agents/dataplane/volume all asan failed:\n{r.stdout}{r.stderr}", pytrace=False)
    return {"normal": SRC / "strongroom-volume", "asan": SRC / "strongroom-volume-asan"}


@pytest.fixture(params=["normal", "asan"])
def daemon(request: pytest.FixtureRequest, binaries: dict[str, Path]) -> Path:
    return binaries[request.param]


@pytest.fixture
def passfile(tmp_path: Path) -> Path:
    p = tmp_path / "passphrase"
    p.write_bytes(PASSPHRASE)
    return p


def run(*cmd: str | Path) -> subprocess.CompletedProcess[bytes]:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, check=False, timeout=60)
    assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    return r


def luks_format(path: Path, passfile: Path, size: int, *args: str, sector: int = 4096) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    run("cryptsetup", "luksFormat", "-q", "--key-file", passfile, *FAST, "--sector-size", str(sector), *args, path)
    return path


def metadata(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(run("cryptsetup", "luksDump", "--dump-json-metadata", path).stdout)


def volume_key(path: Path, passfile: Path) -> bytes:
    out = path.with_name(path.name + ".vk")
    out.unlink(missing_ok=True)
    run("cryptsetup", "luksDump", "--dump-volume-key", "--volume-key-file", out, "-q", "--key-file", passfile, path)
    try:
        return out.read_bytes()
    finally:
        out.unlink()


def xts(key: bytes, data: bytes, sector: int, *, decrypt: bool, iv_offset: int = 0) -> bytes:
    """The LUKS2 aes-xts-plain64 data segment, independently of the daemon: one XTS data
    unit per sector, the IV the 512-byte unit count (plus the tweak), little-endian."""
    out = bytearray()
    for at in range(0, len(data), sector):
        cipher = Cipher(algorithms.AES(key), modes.XTS(((at // 512 + iv_offset) % 2**64).to_bytes(16, "little")))
        ctx = cipher.decryptor() if decrypt else cipher.encryptor()
        out += ctx.update(data[at:at + sector]) + ctx.finalize()
    return bytes(out)


def segment(path: Path) -> tuple[int, int]:
    """(offset, sector size) of the one data segment."""
    seg = metadata(path)["segments"]["0"]
    return int(seg["offset"]), int(seg["sector_size"])


def in_mount_table(path: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


def fuse_unmount(path: Path) -> None:
    for _ in range(40):
        if not in_mount_table(path):
            return
        if subprocess.run(["fusermount3", "-u", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.05)
    subprocess.run(["fusermount3", "-uz", str(path)], capture_output=True)


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    mnt: Path
    file: Path
    size: int
    sector: int
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@contextlib.contextmanager
def serving(daemon: Path, container: Path, mnt: Path, *args: str,
            passphrase: bytes = PASSPHRASE) -> Iterator[Served]:
    """Run the daemon in the foreground as the agent does: passphrase on stdin, wait for
    the ready line; on the way out unmount (fusermount3 -u) and expect exit 0 and a
    clean sanitizer report."""
    mnt.mkdir(exist_ok=True)
    stderr_path = mnt.with_name(mnt.name + ".stderr")
    rfd, wfd = os.pipe()
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen([str(daemon), "-f", "--ready-fd", str(wfd), *args, str(container), str(mnt)],
                                stdin=subprocess.PIPE, stderr=err, pass_fds=(wfd,), env=env)
    os.close(wfd)
    served = None
    try:
        assert proc.stdin is not None
        proc.stdin.write(passphrase)
        proc.stdin.close()
        line = b""
        deadline = time.monotonic() + 30
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            assert left > 0, "no ready line"
            if select.select([rfd], [], [], left)[0]:
                chunk = os.read(rfd, 100)
                if not chunk:
                    break
                line += chunk
        if not line:
            proc.wait(timeout=15)
            raise AssertionError(f"daemon exited {proc.returncode}: {stderr_path.read_text()}")
        word, size, sector = line.decode().split()
        assert word == "ready"
        served = Served(proc, mnt, mnt / "volume", int(size), int(sector), stderr_path)
        yield served
    finally:
        os.close(rfd)
        fuse_unmount(mnt)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        report = stderr_path.read_text(errors="replace")
        assert "Sanitizer" not in report and "runtime error" not in report, report
        assert proc.returncode == 0, (proc.returncode, report)


def read_all(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


# --- 1. cryptsetup's own encryption, served -------------------------------------------------
@pytest.mark.parametrize("sector", [512, 4096])
def test_serves_what_cryptsetup_encrypted(binaries: dict[str, Path], passfile: Path, tmp_path: Path,
                                          sector: int) -> None:
    """cryptsetup encrypts a random plaintext in place (its own code writes every
    ciphertext byte); the served file is that plaintext. With --reduce-device-size R,
    cryptsetup keeps the first (image - R) bytes (it takes the last R bytes for free
    space) and moves them behind a header of R/2: the segment runs to the image's end, so
    the served file is image - R/2 bytes, of which the first image - R are the original."""
    image, reduce = 48 * MiB, 32 * MiB
    plain = os.urandom(image)
    container = tmp_path / "encrypted.img"
    container.write_bytes(plain)
    run("cryptsetup", "reencrypt", "-q", "--encrypt", "--type", "luks2", "--cipher", "aes-xts-plain64",
        "--key-size", "512", "--sector-size", str(sector), "--reduce-device-size", f"{reduce // MiB}M",
        "--force-offline-reencrypt", *FAST, "--key-file", passfile, container)
    offset, seg_sector = segment(container)
    assert seg_sector == sector
    with serving(binaries["normal"], container, tmp_path / "m") as s:
        assert (s.size, s.sector) == (image - offset, sector)
        assert s.file.stat().st_size == s.size and oct(s.file.stat().st_mode & 0o777) == "0o600"
        assert os.listdir(s.mnt) == ["volume"]
        served = read_all(s.file)
    kept = image - reduce
    assert served[:kept] == plain[:kept]
    # The rest of the segment (what cryptsetup left there) decrypts the same way.
    ciphertext = container.read_bytes()[offset:]
    assert served == xts(volume_key(container, passfile), ciphertext, sector, decrypt=True)


# --- 2. writes through the mount, checked without the daemon ---------------------------------
@pytest.mark.parametrize("sector", [512, 4096])
def test_writes_at_any_offset_land_as_luks2_ciphertext(daemon: Path, passfile: Path, tmp_path: Path,
                                                       sector: int) -> None:
    container = luks_format(tmp_path / "c.img", passfile, 24 * MiB, "--type", "luks2", "--cipher",
                            "aes-xts-plain64", "--key-size", "512", sector=sector)
    offset, _ = segment(container)
    key = volume_key(container, passfile)
    model = bytearray(xts(key, container.read_bytes()[offset:], sector, decrypt=True))
    size = len(model)
    rng = os.urandom
    writes = [
        (0, rng(1)), (511, rng(2)), (4095, rng(2)), (3 * 4096 - 100, rng(300)), (1000, rng(5000)),
        (sector * 10 + 7, rng(MiB + 12345)),              # more than one FUSE request, unaligned
        (2 * MiB, rng(sector)), (2 * MiB + sector, rng(3 * sector)),  # whole sectors
        (size - 10, rng(10)),                             # the last bytes
    ]
    with serving(daemon, container, tmp_path / "m") as s:
        assert s.size == size
        fd = os.open(s.file, os.O_RDWR)
        try:
            assert os.pread(fd, 4096, 0) == bytes(model[:4096])
            for off, data in writes:
                assert os.pwrite(fd, data, off) == len(data)
                model[off:off + len(data)] = data
            # across the end: the part that fits, then ENOSPC
            assert os.pwrite(fd, b"x" * 20, size - 5) == 5
            model[size - 5:] = b"x" * 5
            with pytest.raises(OSError) as e:
                os.pwrite(fd, b"y", size)
            assert e.value.errno == errno.ENOSPC
            assert os.pread(fd, 100, size) == b""
            # the size is the segment's
            with pytest.raises(OSError) as e:
                os.ftruncate(fd, size - 4096)
            assert e.value.errno == errno.EPERM
            os.chmod(s.file, 0o600)  # accepted, changes nothing
            # eight writers, each its own bytes of the same few sectors: none may be lost
            region = 5 * MiB + 100

            def writer(i: int) -> None:
                wfd = os.open(s.file, os.O_WRONLY)
                try:
                    for round_ in range(40):
                        os.pwrite(wfd, bytes([i * 16 + round_ % 16]) * 37, region + i * 37 * 3)
                finally:
                    os.close(wfd)

            threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for i in range(8):
                at = region + i * 37 * 3
                model[at:at + 37] = bytes([i * 16 + 39 % 16]) * 37
            os.fsync(fd)
            assert os.pread(fd, size, 0) == bytes(model)
        finally:
            os.close(fd)
    # the container, decrypted without the daemon
    assert xts(key, container.read_bytes()[offset:], sector, decrypt=True) == bytes(model)
    # a fresh mount (nothing cached by the kernel): the daemon's own reads
    with serving(daemon, container, tmp_path / "m") as s:
        assert read_all(s.file) == bytes(model)
    # cryptsetup re-keys offline: it decrypts what we wrote with its own code
    run("cryptsetup", "reencrypt", "-q", "--force-offline-reencrypt", "--key-file", passfile, *FAST, container)
    assert volume_key(container, passfile) != key
    with serving(daemon, container, tmp_path / "m") as s:
        assert read_all(s.file) == bytes(model)


# --- 3. a file system on the served file ------------------------------------------------------
def loops_of(path: Path) -> list[str]:
    out = subprocess.run(["losetup", "-j", str(path)], capture_output=True, text=True, check=False).stdout
    return [line.split(":")[0] for line in out.splitlines() if line]


@contextlib.contextmanager
def loop_mounted(file: Path, at: Path) -> Iterator[Path]:
    at.mkdir(exist_ok=True)
    run("mount", "-o", "loop", file, at)
    try:
        yield at
    finally:
        if in_mount_table(at) and subprocess.run(["umount", str(at)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(at)], capture_output=True)
        for dev in loops_of(file):
            subprocess.run(["losetup", "-d", dev], capture_output=True)


@needs_loop
def test_ext4_on_the_served_file_survives_a_restart(daemon: Path, passfile: Path, tmp_path: Path) -> None:
    container = luks_format(tmp_path / "c.img", passfile, 64 * MiB, "--type", "luks2")
    files = {"a.txt": b"hello\n", "dir/b.bin": os.urandom(3 * MiB + 17), "dir/c.bin": os.urandom(4096)}
    with serving(daemon, container, tmp_path / "m") as s:
        run("mkfs.ext4", "-q", "-F", s.file)
        with loop_mounted(s.file, tmp_path / "fs") as fs:
            (fs / "dir").mkdir()
            for name, data in files.items():
                (fs / name).write_bytes(data)
            os.sync()
        assert not loops_of(s.file)
    with serving(daemon, container, tmp_path / "m") as s:
        with loop_mounted(s.file, tmp_path / "fs") as fs:
            for name, data in files.items():
                assert (fs / name).read_bytes() == data
        run("e2fsck", "-fn", s.file)
    run("cryptsetup", "open", "--test-passphrase", "--key-file", passfile, container)


@needs_loop
def test_a_block_device_container_is_claimed(binaries: dict[str, Path], passfile: Path, tmp_path: Path) -> None:
    """A block device's size comes from BLKGETSIZE64, and serving claims it (O_EXCL):
    a second server is refused with exit 3. A regular file is guarded by a lock."""
    container = luks_format(tmp_path / "c.img", passfile, 20 * MiB, "--type", "luks2")
    offset, _ = segment(container)
    with open(container, "r+b") as f:  # a dynamic segment ends on the last whole sector
        f.truncate(20 * MiB + 3000)
    dev = run("losetup", "-f", "--show", container).stdout.decode().strip()
    try:
        with serving(binaries["normal"], Path(dev), tmp_path / "m") as s:
            assert s.size == (20 * MiB + 2560 - offset) // 4096 * 4096  # the loop device ends on 512 bytes
            (tmp_path / "m2").mkdir()
            r = subprocess.run([str(binaries["normal"]), "-f", dev, str(tmp_path / "m2")], input=PASSPHRASE,
                               capture_output=True, timeout=30, check=False)
            assert r.returncode == 3 and b"Device or resource busy" in r.stderr and r.stderr.count(b"\n") == 1, r
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)
    with serving(binaries["normal"], container, tmp_path / "m") as s:
        assert s.size == (20 * MiB + 3000 - offset) // 4096 * 4096
        r = subprocess.run([str(binaries["normal"]), "-f", str(container), str(tmp_path / "m2")],
                           input=PASSPHRASE, capture_output=True, timeout=30, check=False)
        assert r.returncode == 3 and b"served already" in r.stderr, r


# --- 4. refusals ------------------------------------------------------------------------------
def refusal(binary: Path, container: Path, mnt: Path, passphrase: bytes = PASSPHRASE,
            *args: str) -> tuple[int, str]:
    mnt.mkdir(exist_ok=True)
    r = subprocess.run([str(binary), "-f", *args, str(container), str(mnt)], input=passphrase,
                       capture_output=True, timeout=30, check=False)
    assert not in_mount_table(mnt)
    err = r.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("strongroom-volume: "), err
    assert PASSPHRASE.decode(errors="replace").strip() not in err and "correct horse" not in err
    return r.returncode, err


def test_refusals_say_what_to_do(binaries: dict[str, Path], passfile: Path, tmp_path: Path) -> None:
    b, mnt = binaries["normal"], tmp_path / "m"
    good = luks_format(tmp_path / "good.img", passfile, 20 * MiB, "--type", "luks2")

    code, err = refusal(b, good, mnt, b"correct horse\x00battery staple")  # no newline: another passphrase
    assert code == 2 and "no keyslot accepts this passphrase" in err
    code, err = refusal(b, good, mnt, b"p" * 1025)
    assert code == 1 and "longer than 1024 bytes" in err

    junk = tmp_path / "junk.img"
    junk.write_bytes(os.urandom(4 * MiB))
    code, err = refusal(b, junk, mnt)
    assert code == 3 and "not a LUKS2 volume" in err
    code, err = refusal(b, tmp_path / "missing.img", mnt)
    assert code == 3 and "cannot open" in err

    cbc = luks_format(tmp_path / "cbc.img", passfile, 20 * MiB, "--type", "luks2", "--cipher",
                      "aes-cbc-essiv:sha256", "--key-size", "256")
    code, err = refusal(b, cbc, mnt)
    assert code == 4 and "aes-cbc-essiv:sha256, not aes-xts-plain64" in err

    short_key = luks_format(tmp_path / "xts256.img", passfile, 20 * MiB, "--type", "luks2", "--key-size", "256")
    code, err = refusal(b, short_key, mnt)
    assert code == 4 and "256 bits, not 512" in err

    luks1 = tmp_path / "luks1.img"
    with open(luks1, "wb") as f:
        f.truncate(20 * MiB)
    run("cryptsetup", "luksFormat", "-q", "--type", "luks1", "--key-file", passfile, "--iter-time", "1", luks1)
    code, err = refusal(b, luks1, mnt)
    assert code == 3 and "LUKS1, not LUKS2" in err and "cryptsetup convert" in err

    # a reencryption set up but not run: three segments, under two keys
    pending = luks_format(tmp_path / "pending.img", passfile, 20 * MiB, "--type", "luks2")
    run("cryptsetup", "reencrypt", "-q", "--init-only", "--key-file", passfile, *FAST, pending)
    code, err = refusal(b, pending, mnt)
    assert code == 4 and "reencryption is in progress" in err

    code, err = refusal(b, good, mnt, PASSPHRASE, "--name", "../x")
    assert code == 1 and "--name" in err
    r = subprocess.run([str(b), "-f", str(good), str(tmp_path / "nowhere")], input=PASSPHRASE,
                       capture_output=True, timeout=30, check=False)
    assert r.returncode == 5 and r.stderr.count(b"\n") == 1, r


def test_name_option_and_sigterm(binaries: dict[str, Path], passfile: Path, tmp_path: Path) -> None:
    container = luks_format(tmp_path / "c.img", passfile, 20 * MiB, "--type", "luks2")
    mnt = tmp_path / "m"
    with serving(binaries["normal"], container, mnt, "--name", "disk.raw", "--threads", "2") as s:
        assert os.listdir(mnt) == ["disk.raw"]
        assert (mnt / "disk.raw").stat().st_size == s.size
        s.proc.terminate()  # SIGTERM: unmount, exit 0 (checked on the way out)
        s.proc.wait(timeout=15)
        assert not in_mount_table(mnt)


@needs_loop
def test_stops_as_the_agent_stops_it(binaries: dict[str, Path], passfile: Path, tmp_path: Path) -> None:
    """agents/volume: losetup on the served file, then losetup -d and a lazy
    fusermount3 -u -z: the daemon exits 0 and says nothing."""
    container = luks_format(tmp_path / "c.img", passfile, 20 * MiB, "--type", "luks2")
    with serving(binaries["normal"], container, tmp_path / "m") as s:
        loop = run("losetup", "--find", "--show", s.file).stdout.decode().strip()
        try:
            assert int(run("blockdev", "--getsize64", loop).stdout) == s.size
        finally:
            run("losetup", "-d", loop)
        run("fusermount3", "-u", "-z", s.mnt)
        s.proc.wait(timeout=15)
        assert s.stderr() == ""


# --- 5. the fuzz target -------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang (libFuzzer); scripts/test installs it")
def test_fuzz_target_over_the_committed_corpus() -> None:
    assert len(list((SRC / "fuzz-corpus").iterdir())) >= 5
    r = parallel.make(SRC, "fuzz-run", "FUZZ_RUNS=4000", "FUZZ_SECONDS=20", timeout=180)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "Done" in r.stderr and "ERROR" not in r.stderr


def test_threads_on_the_io_core_under_threadsanitizer() -> None:
    """Through the mount the kernel serialises writes to the one file: this program runs
    writers sharing sectors (and readers) on the I/O core at once; a lost update, a torn
    read or a data race fails it."""
    r = parallel.make(SRC, "stress", timeout=120)
    if r.returncode and "tsan" in r.stderr.lower():
        pytest.skip(f"no ThreadSanitizer runtime: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    run_ = subprocess.run([str(SRC / "build" / "stress-volume-io"), "3"], capture_output=True, text=True,
                          timeout=60, check=False, env=dict(os.environ, TSAN_OPTIONS="halt_on_error=1"))
    assert run_.returncode == 0 and "ThreadSanitizer" not in run_.stderr, run_.stdout + run_.stderr
    assert run_.stdout.strip() == "stress-volume-io: ok"
