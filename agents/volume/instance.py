"""What is open on this host and how, kept in `run_dir/volumes` (gone at reboot, like the
mappings themselves): a volume's record (`<name>.json`), its userspace data plane
(`strongroom-volume` serving the decrypted data segment as a file on FUSE, attached to a
loop device) and how to undo all of it, also when the data plane died."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

from agents.guardpoint.dataplane import available
from agents.guardpoint.shield import mounts_at
from agents.volume import luks
from agents.volume.errors import VolumeError

DAEMON = Path(__file__).resolve().parent.parent / "dataplane" / "volume" / "strongroom-volume"
READY_SECONDS = 30.0
STOP_SECONDS = 30.0


@dataclass
class OpenVolume:
    """An open volume as this host left it: how to reach the plaintext and undo it."""

    name: str
    volume_id: str
    path: str
    opened_by: str  # userspace | dm-crypt
    device: str  # what to mount: /dev/loopN or /dev/mapper/NAME
    pid: int | None = None  # strongroom-volume
    fuse_dir: str | None = None
    loop: str | None = None
    mountpoint: str | None = None
    mapping: str | None = None


def sh(argv: list[str], what: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VolumeError(f"{what}: {(proc.stderr.strip() or proc.stdout.strip() or 'failed').splitlines()[-1]}")
    return proc.stdout


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child that exited) is not serving anything.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


class RunDir:
    """The volumes open here, one record each, and their instances."""

    def __init__(self, run_dir: Path) -> None:
        self._dir = run_dir / "volumes"

    def names(self) -> list[str]:
        """Every volume with a record here (open, or left by an instance that died)."""
        return [p.stem for p in sorted(self._dir.glob("*.json"))] if self._dir.exists() else []

    def forget(self, name: str) -> None:
        self._state_file(name).unlink(missing_ok=True)

    def _state_file(self, name: str) -> Path:
        return self._dir / f"{name}.json"

    def opened(self, name: str) -> OpenVolume | None:
        try:
            return OpenVolume(**json.loads(self._state_file(name).read_text()))
        except FileNotFoundError:
            return None

    def save(self, state: OpenVolume) -> None:
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self._state_file(state.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state)))
        tmp.replace(self._state_file(state.name))

    def _rekey_lock(self, name: str) -> Path:
        return self._dir / f"{name}.rekey.lock"

    def rekey_running(self, name: str) -> bool:
        """A `volume rekey` of `name` holds its lock while it runs (the kernel drops it
        with the process, however it ends)."""
        try:
            fd = os.open(self._rekey_lock(name), os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    @contextmanager
    def rekey_held(self, name: str) -> Iterator[None]:
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._rekey_lock(name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise VolumeError(f"a re-key of '{name}' is already running on this host", "usage") from None
            yield
        finally:
            os.close(fd)

    def serve_userspace(self, name: str, volume_id: str, path: Path, passphrase: bytes) -> OpenVolume:
        why = available(DAEMON)
        if why is not None:
            raise VolumeError(f"this host cannot open volumes in userspace: {why} (it also needs libcryptsetup12)")
        fuse_dir = self._dir / name
        fuse_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = (self._dir / f"{name}.log").open("ab")
        r, w = os.pipe()
        try:
            # The served file only ever backs a loop device (fixed size): the kernel may cache
            # writes until a flush, as a loop device over a plain file does.
            proc = subprocess.Popen([str(DAEMON), "-f", "--writeback-cache", "--ready-fd", str(w), str(path),
                                     str(fuse_dir)],
                                    stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=[w],
                                    start_new_session=True)
            os.close(w)
            assert proc.stdin is not None
            proc.stdin.write(passphrase)
            proc.stdin.close()
            line = _read_line(r, READY_SECONDS)
        finally:
            os.close(r)
            log.close()
        if not line.startswith("ready"):
            code = proc.wait(timeout=STOP_SECONDS) if line == "" else None
            tail = (self._dir / f"{name}.log").read_text(errors="replace").strip().splitlines()
            raise VolumeError(f"strongroom-volume could not serve '{name}' (exit {code}): "
                              f"{tail[-1] if tail else 'no message'}")
        served = fuse_dir / "volume"
        try:
            loop = sh(["losetup", "--find", "--show", str(served)], f"attach {served} to a loop device").strip()
        except VolumeError:
            sh(["fusermount3", "-u", str(fuse_dir)], f"unmount {fuse_dir}")
            raise
        return OpenVolume(name, volume_id, str(path), "userspace", loop, pid=proc.pid, fuse_dir=str(fuse_dir),
                          loop=loop)

    def clear_debris(self, name: str, state: OpenVolume | None) -> None:
        """Unmount, detach and stop what an instance of `name` left, whether it still
        serves (a close) or its data plane died (a kill -9: its FUSE mount answers
        nothing, its loop device and any file system on it are dead). A dead instance's
        mounts go lazily, wherever they are: nothing of them can be flushed any more."""
        fuse_dir = Path(state.fuse_dir) if state is not None and state.fuse_dir else self._dir / name
        dead = state is None or (state.opened_by == "userspace" and not _alive(state.pid))
        if state is None and mounts_at(str(fuse_dir)) and _answers(fuse_dir):
            raise VolumeError(f"volume '{name}' is served at {fuse_dir} but this host has no record of it: stop "
                              "that strongroom-volume (fusermount3 -u) before opening it here again", "usage")
        loops = _loops_backed_by(fuse_dir / "volume") | ({state.loop} if state is not None and state.loop else set())
        if dead:
            for target in _mounts_of(loops):
                sh(["umount", "-l", target], f"unmount {target}")
        elif state is not None and state.mountpoint and _mounts_of({state.device}, at=state.mountpoint):
            sh(["umount", state.mountpoint], f"unmount {state.mountpoint} (is something still using it? "
                                              f"`fuser -vm {state.mountpoint}` shows what)")
        for loop in sorted(loops):
            _detach_loop(loop)
        if state is not None and state.mapping and Path(state.device).exists():
            luks.dm_close(state.mapping)
        if mounts_at(str(fuse_dir)):
            subprocess.run(["fusermount3", "-u", "-z", str(fuse_dir)], capture_output=True, check=False)
        if state is not None:
            _wait_gone(state.pid)
        with suppress(OSError):  # the empty mount point of the served file; busy while a lazy unmount holds it
            fuse_dir.rmdir()

    def still_open(self, state: OpenVolume) -> bool:
        if state.opened_by == "dm-crypt":
            return Path(state.device).exists()
        return _alive(state.pid)


def device_size(path: Path) -> int:
    with open(path, "rb") as f:  # a block device has no st_size: its end is its size
        return f.seek(0, os.SEEK_END)


def _read_line(fd: int, timeout: float) -> str:
    """The daemon's ready line, or "" if it exited (or took too long)."""
    end, data = time.monotonic() + timeout, b""
    while b"\n" not in data and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _loops_backed_by(served: Path) -> set[str]:
    """The loop devices attached to `served` (one a previous instance left included:
    `losetup -j` cannot stat a file on a dead FUSE mount, the kernel's list can say)."""
    proc = subprocess.run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return set()
    return {d["name"] for d in json.loads(proc.stdout).get("loopdevices", [])
            if (d.get("back-file") or "").startswith(str(served))}


def _mounts_of(devices: set[str], *, at: str | None = None) -> list[str]:
    """Where `devices` are mounted (at `at` only, if given), last mounted first."""
    targets = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            source = fields[fields.index("-") + 2]
            target = fields[4].encode().decode("unicode_escape")
            if source in devices and (at is None or target == os.path.realpath(at)):
                targets.append(target)
    return targets[::-1]


def _answers(path: Path) -> bool:
    """A FUSE mount whose daemon is alive answers; a dead one says ENOTCONN."""
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def _detach_loop(loop: str) -> None:
    # The kernel detaches a loop device lazily while something still holds it open.
    for _ in range(50):
        proc = subprocess.run(["losetup", "-d", loop], capture_output=True, text=True, check=False)
        if proc.returncode == 0 or "No such device" in proc.stderr:
            return
        time.sleep(0.1)
    raise VolumeError(f"detach {loop}: {proc.stderr.strip()} (is it still mounted?)")


def _wait_gone(pid: int | None) -> None:
    end = time.monotonic() + STOP_SECONDS
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if _alive(pid):
        raise VolumeError(f"strongroom-volume (pid {pid}) did not stop after its mount went away")
