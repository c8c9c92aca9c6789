"""The guard point's control plane hands a key to the data plane without keeping copies of
it: the frames that carry a key are mutable buffers wiped after sending (a concatenation
or bytes() of the material would make immutable copies no one can wipe), so after a
SET_KEY the material is in the process exactly once — the KeyVersion the caller holds.
Counted by reading the process's memory from outside, as a core dump or /proc/PID/mem
would show it. (Freed immutable copies are usually overwritten by CPython's allocator
within a few calls, so this catches a copy kept, not every copy ever made; the wipe
itself is what the code guarantees.)"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from agents.cryptfile import KeyVersion
from agents.guardpoint.dataplane import DataPlane
from agents.guardpoint.policy import PERMIT_ALL

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                                reason="needs /dev/fuse and fusermount3 (apt-get install fuse3)")

def _copies_in_this_process(needle: bytes) -> int:
    """How many times `needle` is in this process's readable memory, counted by a forked
    child reading /proc/PPID/mem: scanning from here, or asking a helper through a pipe,
    would allocate in the very heap being counted and overwrite freed copies first."""
    parent = os.getpid()
    child = os.fork()
    if child == 0:  # no imports, no threads: only reads, and the count as the exit status
        found = 0
        try:
            with open(f"/proc/{parent}/maps") as maps, open(f"/proc/{parent}/mem", "rb", 0) as mem:
                for line in maps:
                    fields = line.split()
                    if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                        continue
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    try:
                        mem.seek(start)
                        found += mem.read(end - start).count(needle)
                    except OSError:
                        pass
        finally:
            os._exit(min(found, 100))
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def test_set_key_leaves_no_copy_of_the_material(tmp_path: Path) -> None:
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    keys = [KeyVersion(uuid.uuid4(), v, os.urandom(32)) for v in (1, 2, 3)]

    def configure(p: DataPlane) -> None:
        p.set_key(keys[0])
        p.set_active(keys[0])
        p.set_policy(PERMIT_ALL)

    plane = DataPlane(str(backing), str(mnt), chunk_size=4096).start(configure=configure)
    try:
        (mnt / "f").write_bytes(b"x" * 10_000)
        for key in keys:  # as on rotation, re-wrap and re-key; counted at once, before
            plane.set_key(key)  # the allocator reuses what a copy was freed into
            # the caller's own KeyVersion is the one copy; every frame that carried it is wiped
            assert _copies_in_this_process(key.material) == 1, f"copies of key v{key.version} left behind"
        assert plane.status()["keys"] == len(keys)
    finally:
        plane.shutdown()
