"""A model-based test of the guard point: the same random operations on the mount and on
a plain directory, compared byte for byte and stat for stat, with remounts in between."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import tempfile
import time
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from agents.cryptfile import KeyVersion
from tests.agents.test_guardpoint import _serve

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                                reason="needs /dev/fuse and fusermount3 (apt-get install fuse3)")
NAMES = st.sampled_from(["a", "b", "c", "d/x", "d/y"])
CHUNK = 4096


class MountVsPlain(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="gp-model-")
        self.backing, self.mnt, self.plain = (os.path.join(self.root, n) for n in ("backing", "mnt", "plain"))
        for d in (self.backing, self.mnt, self.plain):
            os.mkdir(d)
        self.key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
        self.proc: multiprocessing.process.BaseProcess | None = None
        self._mount()

    def _mount(self) -> None:
        self.proc = multiprocessing.get_context("spawn").Process(target=_serve, args=(self.backing, self.mnt, self.key))
        self.proc.start()
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mnt):
            assert self.proc.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)

    def _unmount(self) -> None:
        # An unmount right after the invariant's reads can find the mount still busy for a
        # moment (EBUSY); a mount left behind would have the next one stacked on top of it,
        # and its server would keep pytest from exiting. Retry, then detach it lazily.
        for _ in range(50):
            if subprocess.run(["fusermount3", "-u", self.mnt], check=False, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["fusermount3", "-uz", self.mnt], check=False, capture_output=True)
        if self.proc is not None:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(10)
        assert not os.path.ismount(self.mnt), "the guard point did not unmount"

    def both(self, fn: object, *args: object) -> None:
        """Run an operation on both trees; they must agree on success or the errno."""
        results = []
        for base in (self.mnt, self.plain):
            try:
                fn(base, *args)  # type: ignore[operator]
                results.append(None)
            except OSError as exc:
                results.append(exc.errno)
        assert results[0] == results[1], f"{args}: mount errno {results[0]} vs plain errno {results[1]}"

    @rule(name=NAMES, offset=st.integers(0, 3 * CHUNK), data=st.binary(min_size=1, max_size=2 * CHUNK))
    def write(self, name: str, offset: int, data: bytes) -> None:
        def op(base: str) -> None:
            path = os.path.join(base, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, data, offset)
            finally:
                os.close(fd)
        self.both(op)

    @rule(name=NAMES, data=st.binary(max_size=CHUNK))
    def append(self, name: str, data: bytes) -> None:
        def op(base: str) -> None:
            path = os.path.join(base, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "ab") as f:
                f.write(data)
        self.both(op)

    @rule(name=NAMES, size=st.integers(0, 4 * CHUNK))
    def truncate(self, name: str, size: int) -> None:
        self.both(lambda base: os.truncate(os.path.join(base, name), size))

    @rule(src=NAMES, dst=NAMES)
    def rename(self, src: str, dst: str) -> None:
        def op(base: str) -> None:
            os.makedirs(os.path.join(base, os.path.dirname(dst)), exist_ok=True)
            os.rename(os.path.join(base, src), os.path.join(base, dst))
        self.both(op)

    @rule(name=NAMES)
    def unlink(self, name: str) -> None:
        self.both(lambda base: os.unlink(os.path.join(base, name)))

    @rule(src=NAMES, dst=NAMES)
    def hardlink(self, src: str, dst: str) -> None:
        def op(base: str) -> None:
            os.makedirs(os.path.join(base, os.path.dirname(dst)), exist_ok=True)
            os.link(os.path.join(base, src), os.path.join(base, dst))
        self.both(op)

    @rule()
    def remount(self) -> None:
        self._unmount()
        self._mount()

    @invariant()
    def same_tree_and_contents(self) -> None:
        def snapshot(base: str) -> dict[str, tuple[int, bytes, int]]:
            out = {}
            for dirpath, _, files in os.walk(base):
                for f in files:
                    p = os.path.join(dirpath, f)
                    st_ = os.stat(p)
                    with open(p, "rb") as fh:
                        out[os.path.relpath(p, base)] = (st_.st_size, fh.read(), st_.st_nlink)
            return out
        assert snapshot(self.mnt) == snapshot(self.plain)

    def teardown(self) -> None:
        self._unmount()
        shutil.rmtree(self.root, ignore_errors=True)


MountVsPlain.TestCase.settings = settings(max_examples=12, stateful_step_count=25, deadline=None,
                                          suppress_health_check=list(HealthCheck))
test_mount_behaves_like_a_plain_directory = MountVsPlain.TestCase
