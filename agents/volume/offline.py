"""What this host keeps of the key server's answers, for use while it is unreachable:
its last list of the host's volumes (no secret), the passphrases a volume's offline
grace lets it keep (wrapped under the host's key) and the revocations it has seen,
which are checked before anything kept is used (agents/keyclient/revocation.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from agents.config import AgentConfig
from agents.cryptfile.replace import atomic_replace
from agents.keyclient.client import HostRevoked, ServerRefused, VolumeSecret
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
from agents.volume.errors import VolumeError

# What is remembered of the server's list for use while it is unreachable (no secret).
KNOWN_FIELDS = ("id", "name", "path", "state", "scope", "key_name", "key_version", "has_recovery", "grace_seconds",
                "rekey_generation", "rekey_applied", "rekey")


class OfflineMemory:
    def __init__(self, config: AgentConfig, spool: EventSpool | None) -> None:
        self._config = config
        # Passphrases a volume's offline grace lets this host keep, wrapped under its key.
        self._grace = config.state_dir / GRACE_DIR
        # Revocations seen: checked before anything kept is used, offline.
        self.revoked = RevocationLedger(config.state_dir)
        self._spool = spool

    def grace_kept(self, volume_id: str) -> bool:
        return (self._grace / f"{volume_id}.json").exists()

    # --- the offline grace ------------------------------------------------------------
    def keep_for_grace(self, secret: VolumeSecret) -> None:
        vid = secret.volume["id"]
        if not secret.grace_until:
            self.revoked.drop_grace(vid)
            return
        self._grace.mkdir(mode=0o700, parents=True, exist_ok=True)
        with atomic_replace(self._grace / f"{vid}.json", mode=0o600) as f:
            f.write(json.dumps({"until": secret.grace_until, "mechanism": secret.mechanism,
                                "wrapped": base64.b64encode(secret.wrapped).decode()}).encode())

    def from_grace(self, volume_id: str) -> bytes | None:
        """The kept passphrase while the grace lasts; an expired one is deleted, and so is
        one of a volume (or host) whose revocation this host has seen."""
        if self.revoked.refusal(volume_id) is not None:
            self.revoked.drop_grace(volume_id)
            return None
        path = self._grace / f"{volume_id}.json"
        try:
            kept = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        if datetime.fromisoformat(kept["until"]) <= datetime.now(UTC):
            self.revoked.drop_grace(volume_id)
            return None
        identity = HostIdentity.load_or_create(self._config.state_dir)
        return identity.unwrap(base64.b64decode(kept["wrapped"]), mechanism=kept["mechanism"])

    def record(self, event: str, **fields: Any) -> None:
        if self._spool is not None:  # shipped, and audited, when the server answers
            self._spool.append({"event": event, **fields})

    # --- revocation, remembered (agents/keyclient/revocation.py) ----------------------
    def host_refusal(self) -> Tombstone | None:
        """This host's revocation, if it has seen one since it was last enrolled."""
        return self.revoked.host()

    def check_host(self, ref: str) -> None:
        seen = self.revoked.host()
        if seen is None:
            return
        known = next((v for v in self.known() if ref in (v["name"], v["id"], v["path"])), None)
        what = {"volume_id": known["id"], "name": known["name"]} if known else {"name": ref}
        self.record("volume.open_failed", **what, reason="revoked", revocation=seen.code)
        raise VolumeError(host_refusal_message(seen), "host")

    def seen(self, vol: dict[str, Any], code: str, detail: str) -> None:
        """The server said no to this volume for good: forget its passphrase, remember why."""
        if self.revoked.volume(vol["id"]) is not None:  # seen before: that record (and its time) stands
            self.revoked.drop_grace(vol["id"])
            return
        self.revoked.mark_volume(vol["id"], name=vol["name"], code=code, detail=detail)
        # In the audit chain too, beside the server's own refusal: a later offline open of
        # this volume (a tombstone removed by hand) stands out against it.
        self.record("volume.revocation_seen", volume_id=vol["id"], name=vol["name"], revocation=code)

    @contextmanager
    def asking(self, vol: dict[str, Any], *, unseal: bool) -> Iterator[None]:
        """A call about `vol`: a refusal that ends its use is remembered before it is
        raised (an unseal's refusal by its key too, see KEY_REVOKED_CODES)."""
        try:
            yield
        except HostRevoked:
            raise  # remembered by the client, for the whole host
        except ServerRefused as exc:
            if exc.code in VOLUME_REVOKED_CODES or (unseal and exc.code in KEY_REVOKED_CODES):
                self.seen(vol, exc.code, exc.detail)
            raise

    def save_known(self, volumes: list[dict[str, Any]]) -> None:
        """The server's last list: names and paths to open by while it is unreachable.
        A volume it lists as revoked is a revocation seen; one it no longer lists loses
        its kept passphrase."""
        for v in volumes:
            if v["state"] == "revoked":
                self.seen(v, "volume_revoked", f"volume '{v['name']}' is revoked on the key server")
        listed = {v["id"] for v in volumes}
        for gone in self.known():
            if gone["id"] not in listed:
                self.revoked.drop_grace(gone["id"])
        self._grace.mkdir(mode=0o700, parents=True, exist_ok=True)
        keep = [{k: v.get(k) for k in KNOWN_FIELDS} for v in volumes]
        with atomic_replace(self._grace / KNOWN_FILE, mode=0o600) as f:
            f.write(json.dumps(keep).encode())

    def known(self) -> list[dict[str, Any]]:
        try:
            return list(json.loads((self._grace / KNOWN_FILE).read_text()))
        except FileNotFoundError:
            return []

    def offline_passphrase(self, vol: dict[str, Any], why: str) -> bytes:
        """The kept passphrase of `vol`, unless a revocation was seen (checked first) or
        its grace is over. Every outcome is spooled with the volume's id and name."""
        name = vol["name"]
        seen = self.revoked.refusal(vol["id"])
        if seen is not None:
            self.revoked.drop_grace(vol["id"])
            self.record("volume.open_failed", volume_id=vol["id"], name=name, reason="revoked",
                         revocation=seen.code)
            if seen.subject == "host":
                raise VolumeError(host_refusal_message(seen), "host")
            raise VolumeError(f"volume '{name}' was refused by the key server ({seen.describe()}); it does not open "
                              "offline again. The key server is unreachable now, and only its answer can open the "
                              "volume (or its recovery passphrase with cryptsetup, if one was made)", "key")
        kept = self.from_grace(vol["id"])
        if kept is None:  # fail closed
            self.record("volume.open_failed", volume_id=vol["id"], name=name, reason="server_unreachable")
            raise VolumeError(f"the key server is unreachable ({why}) and volume '{name}' has no offline grace "
                              "left: it stays closed until the server answers (or open it with its recovery "
                              "passphrase and cryptsetup)", "unreachable")
        self.record("volume.open_offline", volume_id=vol["id"], name=name, reason="server_unreachable")
        return kept
