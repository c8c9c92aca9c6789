"""volumes.tab: the volumes to open at boot, crypttab-style (docs/volumes.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agents.volume.errors import VolumeError


@dataclass(frozen=True, slots=True)
class TabEntry:
    """A line of volumes.tab: `NAME MOUNTPOINT|- [OPTIONS]`, options comma-separated:
    `userspace` or `dm-crypt` (how to open; default: dm-crypt where the kernel has it),
    `nofail` (boot goes on without it)."""

    name: str
    mountpoint: Path | None
    userspace: bool | None
    nofail: bool


def parse_tab(path: Path) -> list[TabEntry]:
    """volumes.tab, like crypttab: one volume a line, `#` comments. Errors name the line."""
    entries: list[TabEntry] = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for number, raw in enumerate(lines, 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 3:
            raise VolumeError(f"{path}:{number}: NAME MOUNTPOINT|- [OPTIONS] expected, got {len(fields)} fields",
                              "usage")
        options = set(fields[2].split(",")) if len(fields) == 3 else set()
        unknown = options - {"userspace", "dm-crypt", "nofail", "defaults"}
        if unknown or {"userspace", "dm-crypt"} <= options:
            raise VolumeError(f"{path}:{number}: options are userspace or dm-crypt, and nofail "
                              f"(not {', '.join(sorted(unknown)) or 'both userspace and dm-crypt'})", "usage")
        mount = fields[1] if len(fields) > 1 else "-"
        if mount != "-" and not mount.startswith("/"):
            raise VolumeError(f"{path}:{number}: the mount point must be an absolute path or -", "usage")
        entries.append(TabEntry(fields[0], None if mount == "-" else Path(mount),
                                True if "userspace" in options else False if "dm-crypt" in options else None,
                                "nofail" in options))
    return entries
