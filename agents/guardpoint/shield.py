"""The shield under a guard point's mount: what the protected path shows whenever no
data plane serves it (docs/decisions/0014-guard-points-fail-closed.md).

A FUSE mount dies with its process, and unmounting a dead one used to uncover the bare
directory underneath, writable by every program, for as long as the next data plane
took to start: programs wrote plaintext there, outside the policy and unaudited. So the
agent stacks the path before its first mount:

1. the bare directory is locked: mode 000 and, where the file system has it, the
   immutable flag, so that even before the agent starts after a reboot nothing can be
   created in it (root included, short of CAP_LINUX_IMMUTABLE);
2. an empty read-only tmpfs, the shield, with the directory's owner and mode, is mounted
   on it;
3. the data plane (or mode off's bind mount) is mounted on the shield.

Mounts outlive processes, so a crash of the data plane, its supervisor or the agent
only ever takes away layer 3; while it is away a program sees an empty directory that
answers EROFS to every change. Only deleting the guard point takes the shield away and
unlocks the directory (`unshield`), with the owner and mode it had.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import json
import logging
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agents.errors import AgentError

log = logging.getLogger("strongroom.agent.guardpoints")

SOURCE = "strongroom-shield"  # the shield's name in the mount table: how it is told from anything else
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10
_MNT_FORCE, _MNT_DETACH, _UMOUNT_NOFOLLOW = 1, 2, 8
_libc = ctypes.CDLL(None, use_errno=True)


class ShieldError(AgentError):
    """The path cannot be shielded; the guard point is then not served (fail closed)."""


@dataclass(frozen=True, slots=True)
class Mount:
    id: int
    parent: int
    fstype: str
    source: str
    device: int  # st_dev of what is mounted

    @property
    def shield(self) -> bool:
        return self.fstype == "tmpfs" and self.source == SOURCE


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_at(path: str) -> list[Mount]:
    """Every mount stacked at `path`, bottom first. From the mount table: a dead FUSE
    mount cannot even be stat()ed ("transport endpoint is not connected")."""
    target = os.path.realpath(path)
    found: dict[int, Mount] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if _unescape(fields[4]) != target:
                continue
            rest = fields[fields.index("-") + 1:]
            major, minor = fields[2].split(":")
            found[int(fields[0])] = Mount(int(fields[0]), int(fields[1]), rest[0], _unescape(rest[1]),
                                          os.makedev(int(major), int(minor)))
    # Mounted on a mount point, a mount's parent is the one it covers: follow the chain up.
    ordered, below = [], next((m for m in found.values() if m.parent not in found), None)
    while below is not None:
        ordered.append(below)
        below = next((m for m in found.values() if m.parent == below.id), None)
    return ordered


def top(path: str) -> Mount | None:
    stack = mounts_at(path)
    return stack[-1] if stack else None


def shielded(path: str) -> bool:
    return any(m.shield for m in mounts_at(path))


def serving(path: str) -> bool:
    """Something other than the shield is mounted on top: the data plane or mode off's view."""
    t = top(path)
    return t is not None and not t.shield


def _umount(path: str, *, abort: bool = False) -> None:
    """umount(2) of whatever is on top, detached when busy. `abort` (a FUSE mount):
    MNT_FORCE first, which ends the FUSE connection even when the mount is busy, so a
    data plane still alive serves nothing more through it — not even files held open —
    and exits; two data planes never serve one backing directory at once."""
    raw = os.fsencode(os.path.realpath(path))
    if _libc.umount2(raw, (_MNT_FORCE if abort else 0) | _UMOUNT_NOFOLLOW) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EBUSY and _libc.umount2(raw, _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0:
        return
    code = ctypes.get_errno() or code
    if code not in (errno.EINVAL, errno.ENOENT):  # EINVAL: gone in the meantime
        log.warning("could not unmount %s: %s", path, os.strerror(code))


def unmount_to_shield(path: str) -> None:
    """Take away every mount above the shield (a dead or live data plane, mode off's
    view); the shield itself stays. Without a shield (a path shielded by no agent
    yet), everything goes, as before the shield existed."""
    for _ in range(16):
        stack = mounts_at(path)
        if not stack or stack[-1].shield:
            return
        _umount(path, abort=stack[-1].fstype.startswith("fuse"))
        after = mounts_at(path)
        if len(after) >= len(stack) and after and after[-1].id == stack[-1].id:
            return  # could not unmount (said above); do not spin


# --- the bare directory ---------------------------------------------------------------------
def _flags(fd: int) -> int:
    buf = array.array("l", [0])
    fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buf, True)
    return int(buf[0]) & 0xFFFFFFFF


def _set_immutable(fd: int, on: bool) -> bool:
    """chattr +i / -i; False where the file system has no such flag."""
    try:
        flags = _flags(fd)
        wanted = flags | _FS_IMMUTABLE_FL if on else flags & ~_FS_IMMUTABLE_FL
        if wanted != flags:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, array.array("l", [wanted]), True)
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return False
        raise


@dataclass(frozen=True, slots=True)
class Owner:
    mode: int
    uid: int
    gid: int


def _read_record(record: Path) -> Owner | None:
    try:
        data = json.loads(record.read_text())
        return Owner(int(data["mode"]), int(data["uid"]), int(data["gid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(record: Path, path: str, owner: Owner) -> None:
    tmp = record.with_name(record.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"path": path, "mode": owner.mode, "uid": owner.uid, "gid": owner.gid}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, record)


def _shield_owner(path: str) -> Owner | None:
    """The owner and mode the shield on top shows, checked to be the shield's (by its
    device) and not those of whatever the path is a moment later."""
    t = top(path)
    if t is None or not t.shield:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return Owner(stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) if st.st_dev == t.device else None


def shield(path: str, record: Path) -> Owner:
    """Make sure the shield is in place at `path` (an existing directory), under whatever
    is mounted there: the bare directory locked and the read-only tmpfs on it. `record`
    keeps the directory's owner and mode while it is locked (mode 000): the shield shows
    them, and unshield() gives them back. Idempotent; returns the owner and mode shown."""
    if shielded(path):
        # The record, not a stat of the path: the path may stop being the shield between
        # two calls (a dying data plane unmounts by path), and the locked directory
        # underneath would then say mode 000.
        return _read_record(record) or _shield_owner(path) or Owner(0o700, 0, 0)
    unmount_to_shield(path)  # what a legacy agent left: nothing may sit under the shield
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        recorded = _read_record(record)
        if os.listdir(fd):
            raise ShieldError(f"{path} is not empty: it cannot be shielded")
        if mode == 0 and recorded is not None:  # locked by us before (a reboot took the shield away)
            owner = recorded
        else:  # mode 000 without a record: locked by an agent that lost it; the safest owner and mode
            owner = Owner(mode or 0o700, st.st_uid, st.st_gid)
            _write_record(record, path, owner)
        if mode != 0:
            _set_immutable(fd, False)
            os.fchmod(fd, 0)
        if not _set_immutable(fd, True):
            log.info("%s: the file system has no immutable flag; mode 000 and the shield guard it", path)
    finally:
        os.close(fd)
    opts = f"ro,nosuid,nodev,noexec,size=4k,nr_inodes=16,mode={owner.mode:o},uid={owner.uid},gid={owner.gid}"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, SOURCE, path], capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        raise ShieldError(f"could not mount the shield on {path}: {r.stderr.strip() or r.returncode} "
                          "(the agent runs as root?)")
    log.info("%s shielded (mode %o, uid %d, gid %d; the directory underneath locked)", path, owner.mode,
             owner.uid, owner.gid)
    return owner


def unshield(path: str, record: Path) -> bool:
    """Deleting a guard point: unmount everything at `path`, shield included, and give
    the bare directory back its owner and mode (the shield's, which a chmod of the
    path may have changed). False when something stays mounted."""
    unmount_to_shield(path)
    owner = _read_record(record) or _shield_owner(path)
    for _ in range(8):
        t = top(path)
        if t is None or not t.shield:
            break
        _umount(path)
    if mounts_at(path):
        log.warning("%s: could not take the shield away; it stays", path)
        return False
    if os.path.isdir(path):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            _set_immutable(fd, False)
            if owner is not None:
                os.fchmod(fd, owner.mode)
                os.fchown(fd, owner.uid, owner.gid)
        finally:
            os.close(fd)
    record.unlink(missing_ok=True)
    log.info("%s unshielded (%s)", path, f"mode {owner.mode:o}" if owner else "no owner recorded")
    return True


def unshield_all(state_dir: Path) -> list[str]:
    """Every shield this agent's state names, taken away (deleted guard points whose
    deletion the agent missed; tests). Returns the paths unshielded."""
    done = []
    for record in sorted((state_dir / "guardpoints").glob("*.shield.json")):
        try:
            path = json.loads(record.read_text())["path"]
        except (OSError, ValueError, KeyError):
            continue
        if unshield(path, record):
            done.append(path)
    return done
