"""Block volumes on this host: standard LUKS2 volumes whose keyslot passphrase the key
server seals, opened only when it unseals it (docs/volumes.md).

Two ways to open, one format: with dm-crypt where the kernel has device-mapper
(cryptsetup maps it, the kernel does the I/O), otherwise in userspace through the native
data plane (`strongroom-volume` serves the decrypted data segment as a file, attached
to a loop device). What is open, and how, is kept in `run_dir` (instance.py: gone at
reboot, like the mappings themselves); what the server said is kept for its outages in
`state_dir` (offline.py).
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agents.config import AgentConfig
from agents.keyclient.cache import ServerUnreachable
from agents.keyclient.client import HostRevoked, ServerClient, ServerRefused, VolumeSecret
from agents.keyclient.revocation import Tombstone
from agents.keyclient.spool import EventSpool
from agents.volume import luks
from agents.volume.errors import VolumeError
from agents.volume.instance import DAEMON, OpenVolume, RunDir, device_size, sh
from agents.volume.offline import OfflineMemory
from agents.volume.tab import TabEntry, parse_tab

__all__ = ["DAEMON", "OpenVolume", "Resealed", "TabEntry", "VolumeError", "VolumeManager", "parse_tab",
           "recovery_passphrase"]


def recovery_passphrase() -> str:
    """Nine groups of five characters from an alphabet without look-alikes (31 symbols):
    about 220 bits, typeable from paper."""
    alphabet = "23456789abcdefghjkmnpqrstuvwxyz"
    groups = ["".join(secrets.choice(alphabet) for _ in range(5)) for _ in range(9)]
    return "-".join(groups)


@dataclass(frozen=True, slots=True)
class Resealed:
    """A volume the daemon re-sealed off a retiring version (`updated`: the server's
    record after it), or could not (`error`)."""

    volume: dict[str, Any]
    from_version: int | None
    updated: dict[str, Any] | None
    error: str | None


class VolumeManager:
    """The host's volumes: made, opened and closed, rotated, re-keyed, with the key
    server's answer (or, while it is unreachable, what `OfflineMemory` kept)."""

    def __init__(self, client: ServerClient, config: AgentConfig, *, spool: EventSpool | None = None) -> None:
        self._client = client
        self._here = RunDir(config.run_dir)
        self._memory = OfflineMemory(config, spool)

    def host_refusal(self) -> Tombstone | None:
        """This host's revocation, if it has seen one since it was last enrolled."""
        return self._memory.host_refusal()

    def opened(self, name: str) -> OpenVolume | None:
        return self._here.opened(name)

    # --- the server's view ----------------------------------------------------------
    def _listed(self) -> list[dict[str, Any]]:
        """The server's list of this host's volumes, remembered (and what it says is
        revoked remembered as seen)."""
        listed = self._client.volumes()
        self._memory.save_known(listed)
        return [self._interrupted(v) for v in listed]

    def check_rekeys(self) -> None:
        """The daemon's turn: the server's list, with every re-key it believes running
        that no longer runs here reported interrupted (see _interrupted)."""
        self._listed()

    def _interrupted(self, vol: dict[str, Any]) -> dict[str, Any]:
        """A volume of this host the server believes `rekeying` while no re-key runs
        here: the run was killed (kill -9, a reboot). Said to the server, as it stands
        (progress kept, not finished), so the console stops showing a re-key under way.
        Shared volumes are left alone: another host of the group may be re-keying them."""
        if vol["state"] != "rekeying" or vol.get("scope", "host") != "host" or self._here.rekey_running(vol["name"]):
            return vol
        progress = dict(vol.get("rekey") or {"generation": vol["rekey_generation"], "done": 0,
                                              "total": vol.get("size_bytes") or 0})
        progress["finished"] = False
        with suppress(ServerRefused, ServerUnreachable):
            return self._client.report_volume(
                vol["id"], "closed", rekey=progress,
                detail=f"re-key interrupted: `kms-agent volume rekey {vol['name']}` resumes it")
        return vol

    def find(self, ref: str, *, offline: bool = False) -> dict[str, Any]:
        """A volume this host may open, by name, id or path (`offline`: from what is
        known here when the server is unreachable: a volume with a kept passphrase)."""
        try:
            listed = self._listed()
        except ServerUnreachable:
            if not offline:
                raise
            listed = self._memory.known()
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
            length = device_size(path)
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
        self._memory.check_host(ref)
        vol = self.find(ref, offline=True)
        name, path = vol["name"], Path(vol["path"])
        current = self._here.opened(name)
        if current is not None and self._here.still_open(current):
            raise VolumeError(f"volume '{name}' is already open at {current.device}", "usage")
        # Its data plane died (kill -9, a crash): its dead mounts, loop device and FUSE
        # mount go first, or the new instance would be stacked over them.
        self._here.clear_debris(name, current)
        self._here.forget(name)
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
            with self._memory.asking(vol, unseal=True):
                secret = self._client.unseal_volume(vol["id"], base64.b64decode(tok["blob"]))
            # The server's word now: a refusal remembered before no longer holds.
            self._memory.revoked.clear_volume(vol["id"])
            self._memory.keep_for_grace(secret)
            passphrase = secret.passphrase
        except ServerUnreachable as exc:
            passphrase = self._memory.offline_passphrase(vol, str(exc))
            offline = True
        use_dm = luks.dm_crypt_available() if userspace is None else not userspace
        if use_dm:
            mapping = f"strongroom-{name}"
            device = luks.dm_open(path, passphrase, mapping)
            state = OpenVolume(name, vol["id"], str(path), "dm-crypt", str(device), mapping=mapping)
        else:
            state = self._here.serve_userspace(name, vol["id"], path, passphrase)
        self._here.save(state)
        try:
            if mountpoint is not None:
                mountpoint.mkdir(parents=True, exist_ok=True)
                sh(["mount", state.device, str(mountpoint)], f"mount {state.device} on {mountpoint}")
                state.mountpoint = str(mountpoint)
                self._here.save(state)
        except VolumeError:
            self.close(name, report=False)
            raise
        if not offline:
            try:
                with self._memory.asking(vol, unseal=False):
                    self._client.report_volume(vol["id"], "open", opened_by=state.opened_by)
            except ServerRefused:
                if self._memory.revoked.refusal(vol["id"]) is not None:  # revoked since the unseal: fail closed
                    self.close(name, report=False)
                raise
        return state

    def close(self, ref: str, *, report: bool = True) -> OpenVolume | None:
        """Unmount, detach and stop serving; safe to repeat after a crash part way."""
        name = ref if self._here.opened(ref) is not None else self.find(ref)["name"]
        state = self._here.opened(name)
        if state is None:
            self._here.clear_debris(name, None)  # a record lost with its instance dead: what it left
            return None
        self._here.clear_debris(name, state)
        self._here.forget(name)
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
        return self._reseal(vol, path, tok)

    def reseal_retiring(self, retiring: dict[str, list[int]], *, host_id: str | None) -> list[Resealed]:
        """The daemon's turn (decision 0024): each volume of this host whose token says
        it is sealed under a version in `retiring` (per key id) is re-sealed as `rotate`
        does, once; what failed is tried again at the next turn. Left alone: a volume
        whose device is not here, one being re-keyed (its header is cryptsetup's until it
        ends), and a shared volume of another host (two hosts rewriting one header would
        race: its own host re-seals it)."""
        if not any(retiring.values()):
            return []
        out: list[Resealed] = []
        for vol in self._listed():
            versions = retiring.get(str(vol["key_id"])) or []
            path = Path(vol["path"])
            if not versions or vol["state"] in ("revoked", "rekeying") or not path.exists():
                continue
            if vol.get("scope", "host") != "host" and host_id is not None and str(vol.get("host_id")) != host_id:
                continue
            try:
                # The re-key's lock: a `volume rekey` started now waits for this one, and
                # one running now makes this volume wait for the next turn.
                with self._here.rekey_held(vol["name"]):
                    done = self._reseal_if_retiring(vol, path, versions)
            except HostRevoked:
                raise
            except (VolumeError, luks.LuksError, ServerRefused) as exc:
                out.append(Resealed(vol, None, None, exc.describe()))
                continue
            if done is not None:
                out.append(done)
        return out

    def _reseal_if_retiring(self, vol: dict[str, Any], path: Path, versions: list[int]) -> Resealed | None:
        if luks.reencryption_pending(luks.metadata(path)):
            raise VolumeError(f"a re-key of '{vol['name']}' was interrupted: it is re-sealed once "
                              f"`kms-agent volume rekey {vol['name']}` has finished it", "usage")
        _, tok = self._sealed(path)
        if tok.get("volume_id") != vol["id"]:
            raise VolumeError(f"{path} holds volume {tok.get('volume_id')}, not '{vol['name']}' ({vol['id']})", "file")
        sealed = int(tok["key_version"])
        if sealed not in versions:
            if vol["key_version"] in versions:  # re-sealed here before, its report lost: the server learns it now
                with self._memory.asking(vol, unseal=False):
                    self._client.report_volume(vol["id"], self._server_state(vol), key_version=sealed,
                                               detail=f"sealed under version {sealed}")
            return None
        updated = self._reseal(vol, path, tok)
        return Resealed(vol, sealed, updated, None)

    def _reseal(self, vol: dict[str, Any], path: Path, tok: dict[str, Any]) -> dict[str, Any]:
        with self._memory.asking(vol, unseal=False):
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
        with self._memory.asking(vol, unseal=True):
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
        state = self._here.opened(name)
        if state is not None and self._here.still_open(state):
            raise VolumeError(f"volume '{name}' is open: close it first (`kms-agent volume close {name}`); the "
                              "re-key runs offline", "usage")
        _, tok = self._sealed(path)
        with self._here.rekey_held(name):
            return self._rekey(vol, path, tok, progress)

    def _rekey(self, vol: dict[str, Any], path: Path, tok: dict[str, Any],
               progress: Callable[[int, int], None]) -> dict[str, Any]:
        with self._memory.asking(vol, unseal=True):
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
        size = device_size(path)
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
            current = self._here.opened(entry.name)
            if current is not None and self._here.still_open(current):
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
        for name in self._here.names():
            try:
                self.close(name)
                results.append((name, None))
            except (VolumeError, luks.LuksError, ServerRefused, ServerUnreachable) as exc:
                results.append((name, str(exc)))
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
            listed, unreachable = self._memory.known(), str(exc)
        rows = []
        for v in listed:
            state = self._here.opened(v["name"])
            local = None
            if state is not None:
                local = {**asdict(state), "alive": self._here.still_open(state)}
            seen = self._memory.revoked.refusal(v["id"])
            rows.append({**v, "local": local, "revoked_here": seen.describe() if seen else None,
                         "grace_kept": seen is None and self._memory.grace_kept(v["id"]),
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
        if self._here.rekey_running(vol["name"]):
            return "running"
        path = Path(vol["path"])
        try:
            if path.exists() and luks.reencryption_pending(luks.metadata(path)):
                return "interrupted"
        except (luks.LuksError, OSError):
            pass  # not readable here: nothing to say of it
        return None
