"""Stock `cryptsetup` (LUKS2) for everything that touches a volume's header: format,
keyslots, the token, re-encryption, and the kernel's dm-crypt where there is one.

Secrets never go on a command line or into a file: each is written into a pipe that
cryptsetup reads as `/dev/fd/N` (a 32-byte passphrase fits a pipe's buffer).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agents.errors import AgentError, Exit

CIPHER = "aes-xts-plain64"
KEY_BITS = 512
TOKEN_TYPE = "strongroom"  # noqa: S105 - the LUKS2 token type name, not a secret
# The server-sealed passphrase is 256 random bits: no password guessing to slow down,
# so the fastest key derivation cryptsetup allows (as Clevis does for its random keys).
SEALED_KDF = ("--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000")


class LuksError(AgentError):
    """cryptsetup failed; the message is its own last line, and what to do."""

    exit_status = Exit.FILE


def cryptsetup_path() -> str:
    found = shutil.which("cryptsetup")
    if found is None:
        raise LuksError("cryptsetup is not installed: install it (Debian: apt-get install cryptsetup-bin)")
    return found


def dm_crypt_available() -> bool:
    """The kernel maps volumes itself where it has device-mapper (not in most containers,
    nor on kernels without it). /dev/mapper/control alone proves nothing: installing
    cryptsetup creates the node whether or not the kernel has the driver behind it."""
    try:
        return any(line.split()[-1] == "device-mapper" for line in Path("/proc/misc").read_text().splitlines()
                   if line.strip())
    except OSError:
        return False


@contextmanager
def _secret_fds(secrets: list[bytes]) -> Iterator[list[int]]:
    fds: list[int] = []
    try:
        for secret in secrets:
            r, w = os.pipe()
            fds.append(r)
            try:
                os.write(w, secret)
            finally:
                os.close(w)
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def run(args: list[str], *, secrets: tuple[bytes, ...] | list[bytes] = (), what: str,
        on_line: Callable[[str], None] | None = None) -> str:
    """cryptsetup with `{0}`, `{1}`… in args replaced by /dev/fd paths of the secrets."""
    with _secret_fds(list(secrets)) as fds:
        argv = [cryptsetup_path()] + [a.format(*(f"/dev/fd/{fd}" for fd in fds)) for a in args]
        if on_line is None:
            proc = subprocess.run(argv, pass_fds=fds, capture_output=True, text=True, check=False)
            stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
        else:
            # cryptsetup writes its progress (--progress-json) to stderr, among its messages.
            p = subprocess.Popen(argv, pass_fds=fds, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            assert p.stderr is not None
            messages = []
            for line in p.stderr:
                if line.startswith("{"):
                    on_line(line)
                else:
                    messages.append(line)
            stderr, code, stdout = "".join(messages), p.wait(), ""
    if code != 0:
        last = (stderr.strip().splitlines() or [f"exit status {code}"])[-1]
        raise LuksError(f"{what}: cryptsetup: {last}")
    return stdout


def is_luks(path: Path) -> bool:
    return subprocess.run([cryptsetup_path(), "isLuks", str(path)], capture_output=True, check=False).returncode == 0


def metadata(path: Path) -> dict[str, Any]:
    """The LUKS2 header's JSON area (keyslots, tokens, segments), as cryptsetup reads it."""
    doc: dict[str, Any] = json.loads(run(["luksDump", "--dump-json-metadata", str(path)],
                                         what=f"read the header of {path}"))
    return doc


def luks_uuid(path: Path) -> str:
    return run(["luksUUID", str(path)], what=f"read the UUID of {path}").strip()


def format_volume(path: Path, passphrase: bytes, *, sector_size: int, label: str) -> None:
    run(["luksFormat", "-q", "--type", "luks2", "--cipher", CIPHER, "--key-size", str(KEY_BITS),
         "--sector-size", str(sector_size), *SEALED_KDF, "--key-slot", "0", "--label", label,
         "--key-file", "{0}", str(path)], secrets=[passphrase], what=f"format {path}")


def free_slot(meta: dict[str, Any]) -> int:
    used = {int(k) for k in meta.get("keyslots", {})}
    return next(i for i in range(32) if i not in used)


def slot_of(path: Path, passphrase: bytes) -> int:
    """Which keyslot this passphrase opens."""
    text = run(["open", "--test-passphrase", "-v", "--key-file", "{0}", str(path)], secrets=[passphrase],
               what=f"check the passphrase of {path}")
    m = re.search(r"Key slot (\d+) unlocked", text)
    if m is None:
        raise LuksError(f"check the passphrase of {path}: cryptsetup did not name the keyslot")
    return int(m.group(1))


def add_keyslot(path: Path, existing: bytes, new: bytes, *, sealed: bool) -> int:
    """A new keyslot for `new`; sealed passphrases use the fast KDF, a person's the
    default (Argon2id, memory-hard)."""
    slot = free_slot(metadata(path))
    kdf = list(SEALED_KDF) if sealed else []
    run(["luksAddKey", "-q", *kdf, "--key-file", "{0}", "--new-key-slot", str(slot), str(path), "{1}"],
        secrets=[existing, new], what=f"add a keyslot to {path}")
    return slot


def kill_slot(path: Path, slot: int, remaining: bytes) -> None:
    run(["luksKillSlot", "-q", "--key-file", "{0}", str(path), str(slot)], secrets=[remaining],
        what=f"remove keyslot {slot} of {path}")


def token(path: Path) -> tuple[int, dict[str, Any]] | None:
    """The Strongroom token of the header (id and JSON), if any."""
    for tid, t in metadata(path).get("tokens", {}).items():
        if t.get("type") == TOKEN_TYPE:
            return int(tid), dict(t)
    return None


def write_token(path: Path, doc: dict[str, Any], *, token_id: int = 0) -> None:
    """Write (or replace) the token; cryptsetup checks the keyslots it names exist."""
    run(["token", "import", "--token-replace", "--token-id", str(token_id), "--json-file", "{0}", str(path)],
        secrets=[json.dumps(doc, separators=(",", ":")).encode()], what=f"write the token of {path}")


def reencrypt(path: Path, passphrase: bytes, slot: int | None, *, progress: Callable[[int, int], None]) -> None:
    """LUKS2 re-encryption under a new volume key, offline (the volume closed), keeping
    only `slot`: resumable after a crash or kill (cryptsetup keeps its checkpoint in the
    header; `slot` None resumes it), progress in bytes."""

    def line(text: str) -> None:
        try:
            doc = json.loads(text)
        except ValueError:
            return
        if isinstance(doc, dict) and "device_bytes" in doc and "device_size" in doc:
            progress(int(doc["device_bytes"]), int(doc["device_size"]))

    progress_args = ["--progress-json", "--progress-frequency", "1"]
    if slot is None:  # resuming: the header holds the rest (keyslots, segments, checkpoint)
        args = ["reencrypt", "-q", "--resume-only", "--force-offline-reencrypt", *progress_args, "--key-file",
                "{0}", str(path)]
    else:
        args = ["reencrypt", "-q", "--force-offline-reencrypt", *progress_args, *SEALED_KDF, "--key-slot",
                str(slot), "--key-file", "{0}", str(path)]
    run(args, secrets=[passphrase], what=f"re-encrypt {path}", on_line=line)


def reencryption_pending(meta: dict[str, Any]) -> bool:
    """An interrupted re-encryption leaves a `reencrypt` keyslot and requirement."""
    return any(k.get("type") == "reencrypt" for k in meta.get("keyslots", {}).values())


def dm_open(path: Path, passphrase: bytes, name: str) -> Path:
    run(["open", "--type", "luks2", "--key-file", "{0}", str(path), name], secrets=[passphrase],
        what=f"open {path} with dm-crypt")
    return Path("/dev/mapper") / name


def dm_close(name: str) -> None:
    run(["close", name], what=f"close /dev/mapper/{name}")
