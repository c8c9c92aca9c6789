"""What this host has been told is revoked, remembered on its own disk, so that no
offline path (an offline grace, a guard point started while the server is away) ever
uses it again (docs/volumes.md, "Revocation is sticky").

`state_dir/revoked/host.json` — the server refused this host (`host_revoked`,
`host_unknown`): nothing opens or mounts until the host is enrolled again. It names the
certificate it was seen with; enrolling again (a new certificate) makes it stale, and
`enroll` deletes it.

`state_dir/revoked/volumes/<volume id>.json` — the server refused to unseal that volume
(revoked, destroyed or revoked key, deleted, another host's): it never opens offline
again; only a later unseal the server grants for the same volume id clears it.

Writing one deletes at once, durably, what an offline open would use (the volume's kept
passphrase, or every kept passphrase for the host) before the record itself is written:
the record guards the agent's own offline paths, the deletion is what takes the means
away. Each write is new file + fsync + rename + fsync of the directory. A record that
cannot be read counts as a revocation (fail closed).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from agents.cryptfile.replace import atomic_replace

REVOKED_DIR = "revoked"
# The volumes' kept passphrases (agents/volume/manager.py): `<volume id>.json`.
GRACE_DIR = "volume-grace"
# Beside them, the server's last list of this host's volumes (names and paths, no secret).
KNOWN_FILE = "volumes.json"
_VOLUME_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# The server's refusals of an unseal that are about the volume itself (its state, its
# key's, whose it is), not about this request: each one ends the volume's offline use.
VOLUME_REVOKED_CODES = frozenset({
    "volume_revoked",  # 403: revoked on the server
    "forbidden",  # 403: another host's (or no longer this group's) volume
    "volume_not_found",  # 404: deleted on the server
})
# An unseal's refusals about the key version sealing the keyslot. Only an unseal's: a
# rotation's illegal_state may mean no more than "no Active version to re-seal under"
# (a deactivated key), which still opens the volume.
KEY_REVOKED_CODES = frozenset({
    "key_not_found",  # 404: its key is gone
    "illegal_state",  # 409: the version is compromised or destroyed: it cannot decrypt
    "key_destroyed",  # 409: the version's material is destroyed
})


@dataclass(frozen=True, slots=True)
class Tombstone:
    """One revocation this host has seen: what, the server's code and words, when."""

    subject: str  # "host" or a volume id
    code: str
    detail: str
    seen_at: str
    name: str = ""  # the volume's name
    certificate: str = ""  # host: SHA-256 of the host certificate the refusal was for

    def describe(self) -> str:
        return f"{self.code}: {self.detail} (seen {self.seen_at})" if self.detail else \
            f"{self.code} (seen {self.seen_at})"


def host_refusal_message(seen: Tombstone) -> str:
    return (f"this host was refused by the key server ({seen.describe()}): it opens no volume and serves no guard "
            "point, online or offline, until it is enrolled again: `kms-agent enroll --token TOKEN` with a new "
            "token from the console (Hosts > Enroll a host)")


def host_revocation(state_dir: Path) -> str | None:
    """Why this host may not start a guard point or open a volume (its revocation, seen
    once and remembered), or None. The one check every start path calls."""
    seen = RevocationLedger(state_dir).host()
    return None if seen is None else host_refusal_message(seen)


def certificate_fingerprint(state_dir: Path) -> str:
    """SHA-256 of the host certificate in `state_dir` ("" when not enrolled)."""
    try:
        return hashlib.sha256((state_dir / "host.crt").read_bytes()).hexdigest()
    except FileNotFoundError:
        return ""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RevocationLedger:
    def __init__(self, state_dir: Path) -> None:
        self._state = state_dir
        self._dir = state_dir / REVOKED_DIR
        self._grace = state_dir / GRACE_DIR

    # --- reading ------------------------------------------------------------------------
    def _read(self, path: Path, subject: str) -> Tombstone | None:
        try:
            raw = json.loads(path.read_text())
            return Tombstone(**raw)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError):
            # Damaged or edited: still a revocation, only without the server's words.
            return Tombstone(subject, "record_damaged", f"{path} cannot be read", "unknown")

    def host(self) -> Tombstone | None:
        """The host's revocation, unless the host has been enrolled again since (a new
        certificate: the record was about the old one)."""
        seen = self._read(self._dir / "host.json", "host")
        if seen is None or (seen.certificate and seen.certificate != certificate_fingerprint(self._state)):
            return None
        return seen

    def volume(self, volume_id: str) -> Tombstone | None:
        if not _VOLUME_ID.match(volume_id):
            raise ValueError(f"not a volume id: {volume_id!r}")
        return self._read(self._dir / "volumes" / f"{volume_id}.json", volume_id)

    def refusal(self, volume_id: str) -> Tombstone | None:
        """Why an offline open of this volume is refused (the host's revocation first)."""
        return self.host() or self.volume(volume_id)

    # --- writing ------------------------------------------------------------------------
    def _write(self, folder: Path, name: str, record: Tombstone) -> None:
        for d in (self._dir, folder):  # parents=True would make the first one with the umask's mode
            d.mkdir(mode=0o700, exist_ok=True)
        with atomic_replace(folder / name, mode=0o600) as f:
            f.write(json.dumps(asdict(record)).encode())

    def mark_host(self, *, code: str, detail: str, certificate: str | None = None) -> Tombstone:
        """The server refused this host (with `certificate`, by default the one on disk):
        every kept passphrase goes, then the record."""
        self.drop_grace()
        record = Tombstone("host", code, detail[:500], _now(),
                           certificate=certificate_fingerprint(self._state) if certificate is None else certificate)
        self._write(self._dir, "host.json", record)
        return record

    def mark_volume(self, volume_id: str, *, name: str, code: str, detail: str) -> Tombstone:
        """The server refused this volume: its kept passphrase goes, then the record."""
        if not _VOLUME_ID.match(volume_id):
            raise ValueError(f"not a volume id: {volume_id!r}")
        self.drop_grace(volume_id)
        record = Tombstone(volume_id, code, detail[:500], _now(), name=name)
        self._write(self._dir / "volumes", f"{volume_id}.json", record)
        return record

    def clear_host(self) -> None:
        """Enrolled again."""
        self._unlink(self._dir / "host.json")

    def clear_volume(self, volume_id: str) -> None:
        """The server unsealed this volume again: its word now, not the old refusal."""
        if _VOLUME_ID.match(volume_id):
            self._unlink(self._dir / "volumes" / f"{volume_id}.json")

    def drop_grace(self, volume_id: str | None = None) -> None:
        """Delete kept passphrases: one volume's, or every one."""
        if volume_id is not None:
            self._unlink(self._grace / f"{volume_id}.json")
            return
        if self._grace.is_dir():
            for kept in self._grace.iterdir():
                # Every passphrase, and any half-written one; not the list of volumes (no
                # secret) nor the new copy of it a beat may be writing this very moment:
                # taking that away made the write, and with it the daemon, fail.
                if kept.name != KNOWN_FILE and not kept.name.endswith(f"-{KNOWN_FILE}"):
                    kept.unlink(missing_ok=True)
            _fsync_dir(self._grace)

    @staticmethod
    def _unlink(path: Path) -> None:
        with suppress(FileNotFoundError):
            path.unlink()
            _fsync_dir(path.parent)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
