"""The machine description at the top of every report, read from this machine."""

from __future__ import annotations

import os
from pathlib import Path

from kmsbench.machine import CPU_FLAGS, _mount_of, describe, summary


def test_this_machine_is_described(tmp_path: Path) -> None:
    m = describe(tmp_path / "not-yet")  # the benchmark directory does not exist before the run
    assert m["cpu"]["model"] and m["cpu"]["cores"] == os.cpu_count()
    assert set(m["cpu"]["flags"]) == set(CPU_FLAGS)
    if "aes" in Path("/proc/cpuinfo").read_text().split():
        assert m["cpu"]["flags"]["aes"] is True
    assert m["memory_gib"] > 0 and m["kernel"] == os.uname().release
    assert m["disk"]["fstype"] not in ("", "?") and m["disk"]["free_gib"] > 0
    labels = [label for label, _ in summary(m)]
    assert labels[:5] == ["CPU", "CPU flags", "Memory", "OS / kernel", "Benchmark directory"]


def test_the_benchmark_directory_maps_to_its_own_mount() -> None:
    mounts = ("/dev/vda / ext4 rw 0 0\n/dev/vdb /srv/data xfs rw 0 0\ntmpfs /srv/data/tmp tmpfs rw 0 0\n"
              "/dev/vdc /srv/data2 ext4 rw 0 0\n")
    assert _mount_of(Path("/srv/data/bench/x"), mounts)["fstype"] == "xfs"
    assert _mount_of(Path("/srv/data/tmp/bench"), mounts)["fstype"] == "tmpfs"
    assert _mount_of(Path("/srv/data22"), mounts)["device"] == "/dev/vda"  # a prefix of the name is not a parent
