"""Differential test of the two implementations of format v1: files written through the
native data plane (strongroom-fuse, C) decrypt with the Python reference (`cryptfile`),
and files the Python reference writes read back through the native mount, byte for byte,
across chunk sizes and random sequences of writes, extensions past the end (holes) and
truncations. Every case runs against the optimised build and the ASan + UBSan build of
the daemon (a sanitizer report ends that daemon with a non-zero status, which fails the
test at teardown)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.cryptfile import EncryptedFile, KeyVersion, StaticKeyring
from tests import parallel

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                                reason="needs /dev/fuse and fusermount3 (apt-get install fuse3)")
CHUNKS = (512, 4096, 65536)
KEY = KeyVersion(uuid.UUID("6a4f1c2e-0000-4000-8000-000000000001"), 1, bytes(range(32)))


DAEMONS = Path(__file__).resolve().parents[2] / "agents" / "dataplane" / "fuse"
# A sanitizer report makes the daemon exit with this status (and leaks count at exit).
ASAN_ENV = {"ASAN_OPTIONS": "exitcode=86:detect_leaks=1", "UBSAN_OPTIONS": "halt_on_error=1:exitcode=86"}


def _serve(backing: str, mnt: str, chunk: int, executable: str) -> None:
    import sys

    from agents.guardpoint.dataplane import serve

    os.environ.update(ASAN_ENV)
    sys.exit(serve(backing, mnt, [KEY], KEY, chunk_size=chunk, executable=Path(executable)))


@pytest.fixture(scope="module", params=["strongroom-fuse", "strongroom-fuse-asan"])
def mounts(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, tuple[Path, Path]]]:
    executable = DAEMONS / request.param
    if request.param.endswith("asan"):
        built = parallel.make(DAEMONS, "asan")
        assert built.returncode == 0, built.stderr
    base = tmp_path_factory.mktemp("differential")
    ctx = multiprocessing.get_context("spawn")
    out, procs = {}, []
    for chunk in CHUNKS:
        backing, mnt = base / f"b{chunk}", base / f"m{chunk}"
        backing.mkdir()
        mnt.mkdir()
        p = ctx.Process(target=_serve, args=(str(backing), str(mnt), chunk, str(executable)))
        p.start()
        procs.append((p, mnt))
        deadline = time.monotonic() + 20
        while not os.path.ismount(mnt):
            assert p.is_alive() and time.monotonic() < deadline, "the data plane did not mount"
            time.sleep(0.05)
        out[chunk] = (backing, mnt)
    try:
        yield out
    finally:
        codes = []
        for p, mnt in procs:
            subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
            p.join(20)
            if p.is_alive():
                p.kill()
                subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)
            codes.append(p.exitcode)
        assert codes == [0] * len(procs), f"a data plane ended with {codes} (86: a sanitizer report)"


# An operation: ("write", offset, length, seed) or ("truncate", size). Offsets reach well
# past the current end, so extensions leave holes of whole chunks.
OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 300_000), st.integers(1, 70_000), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 400_000)),
), min_size=1, max_size=12)


def _data(length: int, seed: int) -> bytes:
    return bytes((seed + i * 7) % 251 for i in range(length))


def _apply_model(model: bytearray, op: tuple) -> None:  # type: ignore[type-arg]
    if op[0] == "write":
        _, off, length, seed = op
        if off > len(model):
            model.extend(bytes(off - len(model)))
        model[off:off + length] = _data(length, seed)
    else:
        size = op[1]
        if size < len(model):
            del model[size:]
        else:
            model.extend(bytes(size - len(model)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.sampled_from(CHUNKS), ops=OPS)
def test_native_and_python_read_each_others_files(mounts: dict[int, tuple[Path, Path]], chunk: int,
                                                  ops: list[tuple]) -> None:  # type: ignore[type-arg]
    backing, mnt = mounts[chunk]
    ring = StaticKeyring([KEY])
    name = f"n{uuid.uuid4().hex[:12]}"
    model = bytearray()
    # 1. Written through the native mount, read with the Python reference.
    fd = os.open(mnt / name, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        for op in ops:
            if op[0] == "write":
                os.pwrite(fd, _data(op[2], op[3]), op[1])
            else:
                os.ftruncate(fd, op[1])
            _apply_model(model, op)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert (mnt / name).stat().st_size == len(model)
    with EncryptedFile.open(str(backing / name), ring) as f:
        f.verify()
        assert f.size == len(model)
        assert f.read(0, f.size) == bytes(model)
    # 2. Written by the Python reference (same operations), read through the native mount.
    other = f"p{uuid.uuid4().hex[:12]}"
    with EncryptedFile.create(str(backing / other), KEY, chunk_size=chunk) as f:
        for op in ops:
            if op[0] == "write":
                f.write(op[1], _data(op[2], op[3]))
            else:
                f.truncate(op[1])
        f.fsync()
    assert (mnt / other).stat().st_size == len(model)
    assert (mnt / other).read_bytes() == bytes(model)
    (mnt / name).unlink()
    (mnt / other).unlink()


def test_a_huge_sparse_extension_costs_two_chunks_and_the_impossible_fails_at_once(
        mounts: dict[int, tuple[Path, Path]]) -> None:
    """truncate() far past the end writes the re-sealed old final chunk and the new final
    chunk, nothing between (holes); a size past what the backing file system allows is
    EFBIG at once, the file unchanged."""
    backing, mnt = mounts[4096]
    p = mnt / "sparse"
    p.write_bytes(b"head")
    os.truncate(p, 1 << 40)  # 1 TiB
    assert p.stat().st_size == 1 << 40
    assert (backing / "sparse").stat().st_blocks * 512 < 1 << 20
    with open(p, "rb") as f:
        assert f.read(8) == b"head\0\0\0\0"
        f.seek((1 << 40) - 5)
        assert f.read() == bytes(5)
    with pytest.raises(OSError) as exc:
        os.truncate(p, (1 << 63) - 1)
    assert exc.value.errno == 27  # EFBIG
    assert p.stat().st_size == 1 << 40
    with EncryptedFile.open(str(backing / "sparse"), StaticKeyring([KEY])) as f:
        assert f.size == 1 << 40 and f.read(0, 4) == b"head"
    p.unlink()
