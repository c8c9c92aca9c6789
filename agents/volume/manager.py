"""Block volumes on this host: standard LUKS2 volumes whose keyslot passphrase the key
server seals, opened only when it unseals it (docs/volumes.md).

Two ways to open, one format: with dm-crypt where the kernel has device-mapper
(cryptsetup maps it, the kernel does the I/O), otherwise in userspace through the native
data plane (`strongroom-volume` serves the decrypted data segment as a file, attached
to a loop device). What is open, and how, is kept in `run_dir` (gone at reboot, like
the mappings themselves).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import secrets
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agents.config import AgentConfig
from agents.cryptfile.replace import atomic_replace
from agents.errors import AgentError, Exit
from agents.guardpoint.dataplane import available
from agents.guardpoint.shield import mounts_at
from agents.keyclient.cache import ServerUnreachable
from agents.keyclient.client import HostRevoked, ServerClient, ServerRefused, VolumeSecret
from agents.keyclient.identity import HostIdentity
from agents.keyclient.revocation import (
    GRACE_DIR,
    KEY_REVOKED_CODES,
    KNOWN_FILE,
    VOLUME_REVOKED_CODES,
    RevocationLedger,
    Tombstone,
    host_refusal_message,
)
from agents.keyclient.spool import EventSpool
from agents.volume import luks

# What is remembered of the server's list for use while it is unreachable (no secret).
KNOWN_FIELDS = ("id", "name", "path", "state", "scope", "key_name", "key_version", "has_recovery", "grace_seconds",
                "rekey_generation", "rekey_applied", "rekey")
DAEMON = Path(__file__).resolve().parent.parent / "dataplane" / "volume" / "strongroom-volume"
READY_SECONDS = 30.0
STOP_SECONDS = 30.0


_KIND_EXIT = {"usage": Exit.USAGE, "file": Exit.FILE, "key": Exit.KEY, "unreachable": Exit.UNREACHABLE,
              "host": Exit.NOT_ENROLLED, "failed": Exit.FAILED}


class VolumeError(AgentError):
    """What went wrong and what to do; `kind` picks the CLI's exit status."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.kind = kind  # usage | file | key | unreachable | host | failed

    @property
    def exit_code(self) -> Exit:
        return _KIND_EXIT[self.kind]


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


def _sh(argv: list[str], what: str) -> str:
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


def recovery_passphrase() -> str:
    """Nine groups of five characters from an alphabet without look-alikes (31 symbols):
    about 220 bits, typeable from paper."""
    alphabet = "23456789abcdefghjkmnpqrstuvwxyz"
    groups = ["".join(secrets.choice(alphabet) for _ in range(5)) for _ in range(9)]
    return "-".join(groups)


class VolumeManager:
    def __init__(self, client: ServerClient, config: AgentConfig, *, spool: EventSpool | None = None) -> None:
        self._client = client
        self._config = config
        self._dir = config.run_dir / "volumes"
        # Passphrases a volume's offline grace lets this host keep, wrapped under its key.
        self._grace = config.state_dir / GRACE_DIR
        # Revocations seen: checked before anything kept is used, offline.
        self._revoked = RevocationLedger(config.state_dir)
        self._spool = spool

    # --- the offline grace ------------------------------------------------------------
    def _keep_for_grace(self, secret: VolumeSecret) -> None:
        vid = secret.volume["id"]
        if not secret.grace_until:
            self._revoked.drop_grace(vid)
            return
        self._grace.mkdir(mode=0o700, parents=True, exist_ok=True)
        with atomic_replace(self._grace / f"{vid}.json", mode=0o600) as f:
            f.write(json.dumps({"until": secret.grace_until, "mechanism": secret.mechanism,
                                "wrapped": base64.b64encode(secret.wrapped).decode()}).encode())

    def _from_grace(self, volume_id: str) -> bytes | None:
        """The kept passphrase while the grace lasts; an expired one is deleted, and so is
        one of a volume (or host) whose revocation this host has seen."""
        if self._revoked.refusal(volume_id) is not None:
            self._revoked.drop_grace(volume_id)
            return None
        path = self._grace / f"{volume_id}.json"
        try:
            kept = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        if datetime.fromisoformat(kept["until"]) <= datetime.now(UTC):
            self._revoked.drop_grace(volume_id)
            return None
        identity = HostIdentity.load_or_create(self._config.state_dir)
        return identity.unwrap(base64.b64decode(kept["wrapped"]), mechanism=kept["mechanism"])

    def _record(self, event: str, **fields: Any) -> None:
        if self._spool is not None:  # shipped, and audited, when the server answers
            self._spool.append({"event": event, **fields})

    # --- revocation, remembered (agents/keyclient/revocation.py) ----------------------
    def host_refusal(self) -> Tombstone | None:
        """This host's revocation, if it has seen one since it was last enrolled."""
        return self._revoked.host()

    def _check_host(self, ref: str) -> None:
        seen = self._revoked.host()
        if seen is None:
            return
        known = next((v for v in self._known() if ref in (v["name"], v["id"], v["path"])), None)
        what = {"volume_id": known["id"], "name": known["name"]} if known else {"name": ref}
        self._record("volume.open_failed", **what, reason="revoked", revocation=seen.code)
        raise VolumeError(host_refusal_message(seen), "host")

    def _seen(self, vol: dict[str, Any], code: str, detail: str) -> None:
        """The server said no to this volume for good: forget its passphrase, remember why."""
        if self._revoked.volume(vol["id"]) is not None:  # seen before: that record (and its time) stands
            self._revoked.drop_grace(vol["id"])
            return
        self._revoked.mark_volume(vol["id"], name=vol["name"], code=code, detail=detail)
        # In the audit chain too, beside the server's own refusal: a later offline open of
        # this volume (a tombstone removed by hand) stands out against it.
        self._record("volume.revocation_seen", volume_id=vol["id"], name=vol["name"], revocation=code)

    @contextmanager
    def _asking(self, vol: dict[str, Any], *, unseal: bool) -> Iterator[None]:
        """A call about `vol`: a refusal that ends its use is remembered before it is
        raised (an unseal's refusal by its key too, see KEY_REVOKED_CODES)."""
        try:
            yield
        except HostRevoked:
            raise  # remembered by the client, for the whole host
        except ServerRefused as exc:
            if exc.code in VOLUME_REVOKED_CODES or (unseal and exc.code in KEY_REVOKED_CODES):
                self._seen(vol, exc.code, exc.detail)
            raise

    # --- local state ----------------------------------------------------------------
    def _save_known(self, volumes: list[dict[str, Any]]) -> None:
        """The server's last list: names and paths to open by while it is unreachable.
        A volume it lists as revoked is a revocation seen; one it no longer lists loses
        its kept passphrase."""
        for v in volumes:
            if v["state"] == "revoked":
                self._seen(v, "volume_revoked", f"volume '{v['name']}' is revoked on the key server")
        listed = {v["id"] for v in volumes}
        for gone in self._known():
            if gone["id"] not in listed:
                self._revoked.drop_grace(gone["id"])
        self._grace.mkdir(mode=0o700, parents=True, exist_ok=True)
        keep = [{k: v.get(k) for k in KNOWN_FIELDS} for v in volumes]
        with atomic_replace(self._grace / KNOWN_FILE, mode=0o600) as f:
            f.write(json.dumps(keep).encode())

    def _known(self) -> list[dict[str, Any]]:
        try:
            return list(json.loads((self._grace / KNOWN_FILE).read_text()))
        except FileNotFoundError:
            return []

    def _state_file(self, name: str) -> Path:
        return self._dir / f"{name}.json"

    def opened(self, name: str) -> OpenVolume | None:
        try:
            return OpenVolume(**json.loads(self._state_file(name).read_text()))
        except FileNotFoundError:
            return None

    def _save(self, state: OpenVolume) -> None:
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self._state_file(state.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state)))
        tmp.replace(self._state_file(state.name))

    # --- the server's view ----------------------------------------------------------
    def _listed(self) -> list[dict[str, Any]]:
        """The server's list of this host's volumes, remembered (and what it says is
        revoked remembered as seen)."""
        listed = self._client.volumes()
        self._save_known(listed)
        return [self._interrupted(v) for v in listed]

    def _interrupted(self, vol: dict[str, Any]) -> dict[str, Any]:
        """A volume of this host the server believes `rekeying` while no re-key runs
        here: the run was killed (kill -9, a reboot). Said to the server, as it stands
        (progress kept, not finished), so the console stops showing a re-key under way.
        Shared volumes are left alone: another host of the group may be re-keying them."""
        if vol["state"] != "rekeying" or vol.get("scope", "host") != "host" or self._rekey_running(vol["name"]):
            return vol
        progress = dict(vol.get("rekey") or {"generation": vol["rekey_generation"], "done": 0,
                                              "total": vol.get("size_bytes") or 0})
        progress["finished"] = False
        with suppress(ServerRefused, ServerUnreachable):
            return self._client.report_volume(
                vol["id"], "closed", rekey=progress,
                detail=f"re-key interrupted: `kms-agent volume rekey {vol['name']}` resumes it")
        return vol

    def _rekey_lock(self, name: str) -> Path:
        return self._dir / f"{name}.rekey.lock"

    def _rekey_running(self, name: str) -> bool:
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

    def find(self, ref: str, *, offline: bool = False) -> dict[str, Any]:
        """A volume this host may open, by name, id or path (`offline`: from what is
        known here when the server is unreachable: a volume with a kept passphrase)."""
        try:
            listed = self._listed()
        except ServerUnreachable:
            if not offline:
                raise
            listed = self._known()
        for v in listed:
            if ref in (v["name"], v["id"], v["path"]):
                return v
        raise VolumeError(f"no volume '{ref}' for this host on the key server: `kms-agent volume status` lists "
                          "them; `kms-agent volume create` makes one", "usage")

    def _sealed(self, path: Path) -> tuple[int, dict[str, Any]]:
        found = luks.token(path)
        if found is None:
            raise VolumeError(f"{path} has no Strongroom token in its LUKS2 header: it was not made with "
                              "`kms-agent volume create` (or its token was removed); open it with its recovery "
                              "passphrase and cryptsetup", "file")
        return found

    # --- create ---------------------------------------------------------------------
    def create(self, *, name: str, path: Path, key: str, size: int | None, sector_size: int = 4096,
               scope: str = "host") -> dict[str, Any]:
        """Format `path` (made `size` bytes long if it is a new image file) as LUKS2 with
        a keyslot sealed by the server, and its token."""
        luks.cryptsetup_path()
        made = False
        if path.exists():
            if luks.is_luks(path):
                raise VolumeError(f"{path} is already a LUKS volume: nothing was changed (to reuse the device, "
                                  "wipe its header with `cryptsetup erase` and `wipefs -a` first)", "file")
            if size is not None and not path.is_block_device() and path.stat().st_size != size:
                raise VolumeError(f"{path} exists with another size: leave out --size, or remove the file", "file")
        else:
            if size is None:
                raise VolumeError(f"{path} does not exist: name a block device, or give --size to make an "
                                  "image file", "usage")
            if size < 32 << 20:
                raise VolumeError("a volume needs at least 32 MiB (16 MiB of it is the LUKS2 header)", "usage")
            with open(path, "xb") as f:  # exclusive create, then a sparse length
                f.truncate(size)
            made = True
        try:
            length = _device_size(path)
            secret = self._client.create_volume(name=name, path=str(path), key=key, scope=scope,
                                                sector_size=sector_size, size_bytes=length)
            luks.format_volume(path, secret.passphrase, sector_size=sector_size, label=f"strongroom:{name}")
        except BaseException:
            if made:  # an image this call made and could not make a volume of: not left behind
                path.unlink(missing_ok=True)
            raise
        vid = secret.volume["id"]
        self._write_token(path, secret, slot=0)
        return self._client.report_volume(vid, "closed", luks_uuid=luks.luks_uuid(path), size_bytes=length,
                                          detail="formatted")

    def _write_token(self, path: Path, secret: VolumeSecret, *, slot: int) -> None:
        luks.write_token(path, {
            "type": luks.TOKEN_TYPE, "keyslots": [str(slot)], "server": self._client.server_url,
            "volume_id": secret.volume["id"], "key": secret.key_name, "key_id": secret.volume["key_id"],
            "key_version": secret.key_version, "blob": base64.b64encode(secret.blob).decode()})

    # --- open / close ---------------------------------------------------------------
    def open(self, ref: str, *, mountpoint: Path | None = None, userspace: bool | None = None) -> OpenVolume:
        self._check_host(ref)
        vol = self.find(ref, offline=True)
        name, path = vol["name"], Path(vol["path"])
        current = self.opened(name)
        if current is not None and self._still_open(current):
            raise VolumeError(f"volume '{name}' is already open at {current.device}", "usage")
        # Its data plane died (kill -9, a crash): its dead mounts, loop device and FUSE
        # mount go first, or the new instance would be stacked over them.
        self._clear_debris(name, current)
        self._state_file(name).unlink(missing_ok=True)
        if not path.exists():
            raise VolumeError(f"{path} (volume '{name}') is not on this host: attach the device, then open it",
                              "file")
        meta = luks.metadata(path)
        if luks.reencryption_pending(meta):
            raise VolumeError(f"a re-key of '{name}' was interrupted: finish it with `kms-agent volume rekey {name}` "
                              "(it resumes where it stopped), then open the volume", "usage")
        _, tok = self._sealed(path)
        if tok.get("volume_id") != vol["id"]:
            raise VolumeError(f"{path} holds volume {tok.get('volume_id')}, not '{name}' ({vol['id']}): check the "
                              "device path", "file")
        offline = False
        try:
            with self._asking(vol, unseal=True):
                secret = self._client.unseal_volume(vol["id"], base64.b64decode(tok["blob"]))
            # The server's word now: a refusal remembered before no longer holds.
            self._revoked.clear_volume(vol["id"])
            self._keep_for_grace(secret)
            passphrase = secret.passphrase
        except ServerUnreachable as exc:
            passphrase = self._offline_passphrase(vol, str(exc))
            offline = True
        use_dm = luks.dm_crypt_available() if userspace is None else not userspace
        if use_dm:
            mapping = f"strongroom-{name}"
            device = luks.dm_open(path, passphrase, mapping)
            state = OpenVolume(name, vol["id"], str(path), "dm-crypt", str(device), mapping=mapping)
        else:
            state = self._open_userspace(name, vol["id"], path, passphrase)
        self._save(state)
        try:
            if mountpoint is not None:
                mountpoint.mkdir(parents=True, exist_ok=True)
                _sh(["mount", state.device, str(mountpoint)], f"mount {state.device} on {mountpoint}")
                state.mountpoint = str(mountpoint)
                self._save(state)
        except VolumeError:
            self.close(name, report=False)
            raise
        if not offline:
            try:
                with self._asking(vol, unseal=False):
                    self._client.report_volume(vol["id"], "open", opened_by=state.opened_by)
            except ServerRefused:
                if self._revoked.refusal(vol["id"]) is not None:  # revoked since the unseal: fail closed
                    self.close(name, report=False)
                raise
        return state

    def _offline_passphrase(self, vol: dict[str, Any], why: str) -> bytes:
        """The kept passphrase of `vol`, unless a revocation was seen (checked first) or
        its grace is over. Every outcome is spooled with the volume's id and name."""
        name = vol["name"]
        seen = self._revoked.refusal(vol["id"])
        if seen is not None:
            self._revoked.drop_grace(vol["id"])
            self._record("volume.open_failed", volume_id=vol["id"], name=name, reason="revoked",
                         revocation=seen.code)
            if seen.subject == "host":
                raise VolumeError(host_refusal_message(seen), "host")
            raise VolumeError(f"volume '{name}' was refused by the key server ({seen.describe()}); it does not open "
                              "offline again. The key server is unreachable now, and only its answer can open the "
                              "volume (or its recovery passphrase with cryptsetup, if one was made)", "key")
        kept = self._from_grace(vol["id"])
        if kept is None:  # fail closed
            self._record("volume.open_failed", volume_id=vol["id"], name=name, reason="server_unreachable")
            raise VolumeError(f"the key server is unreachable ({why}) and volume '{name}' has no offline grace "
                              "left: it stays closed until the server answers (or open it with its recovery "
                              "passphrase and cryptsetup)", "unreachable")
        self._record("volume.open_offline", volume_id=vol["id"], name=name, reason="server_unreachable")
        return kept

    def _open_userspace(self, name: str, volume_id: str, path: Path, passphrase: bytes) -> OpenVolume:
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
            loop = _sh(["losetup", "--find", "--show", str(served)], f"attach {served} to a loop device").strip()
        except VolumeError:
            _sh(["fusermount3", "-u", str(fuse_dir)], f"unmount {fuse_dir}")
            raise
        return OpenVolume(name, volume_id, str(path), "userspace", loop, pid=proc.pid, fuse_dir=str(fuse_dir),
                          loop=loop)

    def _clear_debris(self, name: str, state: OpenVolume | None) -> None:
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
                _sh(["umount", "-l", target], f"unmount {target}")
        elif state is not None and state.mountpoint and _mounts_of({state.device}, at=state.mountpoint):
            _sh(["umount", state.mountpoint], f"unmount {state.mountpoint} (is something still using it? "
                                              f"`fuser -vm {state.mountpoint}` shows what)")
        for loop in sorted(loops):
            _detach_loop(loop)
        if state is not None and state.mapping and Path(state.device).exists():
            luks.dm_close(state.mapping)
        if mounts_at(str(fuse_dir)):
            subprocess.run(["fusermount3", "-u", "-z", str(fuse_dir)], capture_output=True, check=False)
        if state is not None:
            _wait_gone(state.pid)

    def _still_open(self, state: OpenVolume) -> bool:
        if state.opened_by == "dm-crypt":
            return Path(state.device).exists()
        return _alive(state.pid)

    def close(self, ref: str, *, report: bool = True) -> OpenVolume | None:
        """Unmount, detach and stop serving; safe to repeat after a crash part way."""
        name = ref if self.opened(ref) is not None else self.find(ref)["name"]
        state = self.opened(name)
        if state is None:
            self._clear_debris(name, None)  # a record lost with its instance dead: what it left
            return None
        self._clear_debris(name, state)
        self._state_file(name).unlink(missing_ok=True)
        if report:
            # Closed here whatever the server says: at shutdown it may be gone already.
            with suppress(ServerUnreachable, ServerRefused):
                self._client.report_volume(state.volume_id, "closed")
        return state

    # --- rotate, recovery, re-key ---------------------------------------------------
    def rotate(self, ref: str) -> dict[str, Any]:
        """Re-seal under the key's Active version: a new keyslot with a new passphrase,
        the token pointing at it, the old keyslot removed. No data is rewritten."""
        vol = self.find(ref)
        path = Path(vol["path"])
        _, tok = self._sealed(path)
        with self._asking(vol, unseal=False):
            current, new = self._client.reseal_volume(vol["id"], base64.b64decode(tok["blob"]))
        old_slot = luks.slot_of(path, current.passphrase)
        slot = luks.add_keyslot(path, current.passphrase, new.passphrase, sealed=True)
        self._write_token(path, new, slot=slot)
        luks.kill_slot(path, old_slot, new.passphrase)
        return self._client.report_volume(vol["id"], self._server_state(vol), key_version=new.key_version,
                                          detail=f"re-sealed: keyslot {old_slot} -> {slot}")

    def recovery(self, ref: str) -> str:
        """A recovery passphrase keyslot (Argon2id), once; the passphrase is returned to be
        shown once and is kept nowhere."""
        vol = self.find(ref)
        if vol["has_recovery"]:
            raise VolumeError(f"volume '{vol['name']}' already has a recovery passphrase (it was shown once, when "
                              "it was made)", "usage")
        path = Path(vol["path"])
        _, tok = self._sealed(path)
        with self._asking(vol, unseal=True):
            secret = self._client.unseal_volume(vol["id"], base64.b64decode(tok["blob"]))
        words = recovery_passphrase()
        slot = luks.add_keyslot(path, secret.passphrase, words.encode(), sealed=False)
        try:
            self._client.record_volume_recovery(vol["id"])
        except Exception:
            luks.kill_slot(path, slot, secret.passphrase)
            raise
        return words

    def rekey(self, ref: str, progress: Callable[[int, int], None]) -> dict[str, Any]:
        """Re-encrypt the data under a new volume key (LUKS2 reencryption, offline: the
        volume must be closed here). Resumes an interrupted run. Only the sealed keyslot
        survives: a recovery passphrase must be made again afterwards."""
        vol = self.find(ref)
        name, path = vol["name"], Path(vol["path"])
        state = self.opened(name)
        if state is not None and self._still_open(state):
            raise VolumeError(f"volume '{name}' is open: close it first (`kms-agent volume close {name}`); the "
                              "re-key runs offline", "usage")
        _, tok = self._sealed(path)
        with self._rekey_held(name):
            return self._rekey(vol, path, tok, progress)

    @contextmanager
    def _rekey_held(self, name: str) -> Iterator[None]:
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

    def _rekey(self, vol: dict[str, Any], path: Path, tok: dict[str, Any],
               progress: Callable[[int, int], None]) -> dict[str, Any]:
        with self._asking(vol, unseal=True):
            secret = self._client.unseal_volume(vol["id"], base64.b64decode(tok["blob"]))
        resume = luks.reencryption_pending(luks.metadata(path))
        generation = max(vol["rekey_generation"], vol["rekey_applied"] + 1)
        last = [0.0]

        def tick(done: int, total: int) -> None:
            progress(done, total)
            if time.monotonic() - last[0] >= 5:  # the console's progress, not every tick
                last[0] = time.monotonic()
                self._client.report_volume(vol["id"], "rekeying", rekey={
                    "generation": generation, "done": done, "total": total, "finished": False})

        self._client.report_volume(vol["id"], "rekeying", rekey={"generation": generation, "done": 0,
                                                                 "total": vol["size_bytes"] or 0,
                                                                 "finished": False})
        slot = None if resume else luks.slot_of(path, secret.passphrase)
        luks.reencrypt(path, secret.passphrase, slot, progress=tick)
        size = _device_size(path)
        return self._client.report_volume(vol["id"], "closed", rekey={
            "generation": generation, "done": size, "total": size, "finished": True},
            luks_uuid=luks.luks_uuid(path), detail="re-encrypted under a new volume key")

    def wait_for_server(self, seconds: float, *, sleep: Callable[[float], None] = time.sleep) -> None:
        """At boot the network or the server may come up after us: try until `seconds`
        have passed (fail closed: no volume opens without the server's answer)."""
        end, delay = time.monotonic() + seconds, 1.0
        while True:
            try:
                self._client.volumes()
                return
            except ServerUnreachable:
                if time.monotonic() + delay > end:
                    raise
                sleep(delay)
                delay = min(delay * 2, 30.0)

    def open_all(self, entries: list[TabEntry]) -> list[tuple[TabEntry, OpenVolume | None, str | None]]:
        """Each volume of volumes.tab that is not open yet; one failure does not stop
        the others."""
        results: list[tuple[TabEntry, OpenVolume | None, str | None]] = []
        for entry in entries:
            current = self.opened(entry.name)
            if current is not None and self._still_open(current):
                results.append((entry, current, None))
                continue
            try:
                results.append((entry, self.open(entry.name, mountpoint=entry.mountpoint,
                                                 userspace=entry.userspace), None))
            except (VolumeError, luks.LuksError, ServerRefused, ServerUnreachable) as exc:
                results.append((entry, None, str(exc)))
        return results

    def close_all(self) -> list[tuple[str, str | None]]:
        """Every volume open here (the reverse of open_all, at shutdown)."""
        results: list[tuple[str, str | None]] = []
        for state in sorted(self._dir.glob("*.json")) if self._dir.exists() else []:
            try:
                self.close(state.stem)
                results.append((state.stem, None))
            except (VolumeError, luks.LuksError, ServerRefused, ServerUnreachable) as exc:
                results.append((state.stem, str(exc)))
        return results

    @staticmethod
    def _server_state(vol: dict[str, Any]) -> str:
        return "open" if vol["state"] == "open" else "closed"

    def status(self) -> tuple[list[dict[str, Any]], str | None]:
        """The server's volumes for this host, with what is open here, what is kept for
        an offline open and what revocation was seen; with the server unreachable, its
        list as last seen here, and why it is unreachable."""
        unreachable = None
        try:
            listed = self._listed()
        except ServerUnreachable as exc:
            listed, unreachable = self._known(), str(exc)
        rows = []
        for v in listed:
            state = self.opened(v["name"])
            local = None
            if state is not None:
                local = {**asdict(state), "alive": self._still_open(state)}
            seen = self._revoked.refusal(v["id"])
            rows.append({**v, "local": local, "revoked_here": seen.describe() if seen else None,
                         "grace_kept": seen is None and (self._grace / f"{v['id']}.json").exists(),
                         "rekey_asked": self._rekey_asked(v), "rekey_here": self._rekey_here(v),
                         "as_of": "last seen (server unreachable)" if unreachable else "now"})
        return rows, unreachable

    @staticmethod
    def _rekey_asked(vol: dict[str, Any]) -> int | None:
        """The re-key generation asked for in the console and not done yet (None: none)."""
        asked, applied = vol.get("rekey_generation"), vol.get("rekey_applied")
        return int(asked) if asked is not None and applied is not None and asked > applied else None

    def _rekey_here(self, vol: dict[str, Any]) -> str | None:
        """`running` (a `volume rekey` of it runs here), `interrupted` (its header holds a
        half-done re-encryption) or None."""
        if self._rekey_running(vol["name"]):
            return "running"
        path = Path(vol["path"])
        try:
            if path.exists() and luks.reencryption_pending(luks.metadata(path)):
                return "interrupted"
        except (luks.LuksError, OSError):
            pass  # not readable here: nothing to say of it
        return None


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


def _device_size(path: Path) -> int:
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
