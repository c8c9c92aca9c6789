"""What the report says about the machine: the figures only mean something next to it."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

# The CPU features that decide cipher speed (AES-NI and its vector forms, carry-less
# multiply for GHASH, the vector widths OpenSSL picks its code paths by).
CPU_FLAGS = ("aes", "vaes", "pclmulqdq", "vpclmulqdq", "avx", "avx2", "avx512f", "sha_ni")


def _cpuinfo(text: str) -> dict[str, Any]:
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags_line = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    sockets = {m.group(1) for m in re.finditer(r"^physical id\s*:\s*(\d+)", text, re.M)}
    return {"model": model.group(1).strip() if model else platform.processor() or platform.machine(),
            "flags": {f: f in flags for f in CPU_FLAGS}, "sockets": len(sockets) or None}


def _meminfo(text: str) -> float | None:
    m = re.search(r"^MemTotal:\s*(\d+) kB", text, re.M)
    return round(int(m.group(1)) / 2**20, 1) if m else None


def _mount_of(path: Path, mounts: str) -> dict[str, str]:
    """The /proc/mounts entry holding `path` (longest mount point that is a prefix)."""
    best = {"device": "?", "mountpoint": "/", "fstype": "?"}
    target = str(path.resolve())
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mnt, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best["mountpoint"]):
            best = {"device": device, "mountpoint": mnt, "fstype": fstype}
    return best


def _block_device(device: str) -> dict[str, Any]:
    """Model and rotational flag of the disk behind `device` (a partition's parent)."""
    name = Path(device).name
    sys_block = Path("/sys/class/block") / name
    info: dict[str, Any] = {}
    if not sys_block.exists():
        return info
    disk = sys_block.resolve()
    if (disk / "partition").exists():
        disk = disk.parent
    with contextlib.suppress(OSError):
        info["model"] = (disk / "device" / "model").read_text().strip()
    with contextlib.suppress(OSError, ValueError):
        info["rotational"] = (disk / "queue" / "rotational").read_text().strip() == "1"
    with contextlib.suppress(OSError, ValueError):
        info["size_gib"] = round(int((disk / "size").read_text()) * 512 / 2**30, 1)
    return info


def _version(*cmd: str) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0].strip() if text else None


def _os_name() -> str:
    with contextlib.suppress(OSError):
        m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', Path("/etc/os-release").read_text(), re.M)
        if m:
            return m.group(1)
    return platform.system()


def describe(bench_dir: Path) -> dict[str, Any]:
    """CPU (model, cipher-relevant flags, cores), memory, kernel, OS, the file system and
    disk of `bench_dir` (or its nearest existing parent), and the peers' versions."""
    cpu: dict[str, Any] = {"model": platform.machine(), "flags": {}, "sockets": None}
    with contextlib.suppress(OSError):
        cpu = _cpuinfo(Path("/proc/cpuinfo").read_text())
    memory = None
    with contextlib.suppress(OSError):
        memory = _meminfo(Path("/proc/meminfo").read_text())
    where = bench_dir
    while not where.exists() and where != where.parent:
        where = where.parent
    mount = {"device": "?", "mountpoint": "/", "fstype": "?"}
    with contextlib.suppress(OSError):
        mount = _mount_of(where, Path("/proc/self/mounts").read_text())
    usage = shutil.disk_usage(where)
    return {
        "cpu": {**cpu, "cores": os.cpu_count(),
                "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None},
        "memory_gib": memory,
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "disk": {"path": str(bench_dir), **mount, **_block_device(mount["device"]),
                 "free_gib": round(usage.free / 2**30, 1), "total_gib": round(usage.total / 2**30, 1)},
        "tools": {"openssl": _version("openssl", "version"), "gocryptfs": _version("gocryptfs", "-version"),
                  "pgbench": _version("pgbench", "--version"), "wrk": _version("wrk", "-v")},
    }


def summary(m: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines for the top of the report."""
    cpu, disk = m["cpu"], m["disk"]
    flags = ", ".join(f"{name.upper().replace('_', '-')} {'yes' if on else 'no'}"
                      for name, on in cpu.get("flags", {}).items()) or "unknown"
    disk_txt = f"{disk.get('fstype', '?')} on {disk.get('device', '?')} (mounted at {disk.get('mountpoint', '?')})"
    if disk.get("model"):
        disk_txt += f", {disk['model']}"
    if "rotational" in disk:
        disk_txt += ", rotational" if disk["rotational"] else ", non-rotational"
    disk_txt += f"; {disk.get('free_gib', '?')} GiB free of {disk.get('total_gib', '?')} GiB"
    tools = ", ".join(f"{k}: {v}" for k, v in m.get("tools", {}).items() if v) or "none"
    return [
        ("CPU", f"{cpu.get('model', '?')}, {cpu.get('cores', '?')} logical cores"),
        ("CPU flags", flags),
        ("Memory", f"{m.get('memory_gib', '?')} GiB"),
        ("OS / kernel", f"{m.get('os', '?')} / Linux {m.get('kernel', '?')}, Python {m.get('python', '?')}"),
        ("Benchmark directory", f"{disk.get('path', '?')}: {disk_txt}"),
        ("Load average at start", " / ".join(str(x) for x in m.get("load_average", []))),
        ("Tools", tools),
    ]
