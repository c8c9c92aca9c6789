"""How many of a guard point's files each key version protects (decision 0024): the
count a key version's retirement waits on.

One walk of the backing directory reads every file's header; a file under another
version than the Active one is re-wrapped to it on the way (`rewrap`), so each walk
also finishes what an interrupted rotation left. A file with several names is one
file: it is counted (and re-wrapped) once. A file whose header cannot be read, or that
names another key, is counted as `unreadable`: the data plane cannot serve it either,
and it must not vanish from the count.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agents.cryptfile import FormatError, read_header
from agents.cryptfile.transform import TMP_PREFIX
from agents.errors import AgentError

log = logging.getLogger("strongroom.agent.guardpoints")

UNREADABLE = "unreadable"  # the report's count key for files whose header names no version of this key
MAX_REPORTED = 64  # entries the server takes in a report's `versions`


@dataclass
class Walk:
    """One walk's result: files per header version, and when it finished."""

    versions: Counter[int] = field(default_factory=Counter)
    unreadable: list[str] = field(default_factory=list)
    rewrapped: int = 0
    scanned_at: str = ""

    def report(self, retiring: Iterable[int] = ()) -> dict[str, int]:
        """`versions` as the heartbeat carries it: string keys, at most MAX_REPORTED.
        Past the limit (files left under more than 63 old versions) the entries a
        retirement waits on go first — unreadable files, retiring versions, then the
        oldest — so what is cut is never what could make a version look unused."""
        wanted = set(retiring)
        order = sorted(self.versions, key=lambda v: (v not in wanted, v))
        out: dict[str, int] = {UNREADABLE: len(self.unreadable)} if self.unreadable else {}
        for v in order[:MAX_REPORTED - len(out)]:
            out[str(v)] = self.versions[v]
        if len(order) > MAX_REPORTED - (1 if self.unreadable else 0):
            log.warning("files under %d key versions: only %d reported", len(order), MAX_REPORTED)
        return out


def _raise(exc: OSError) -> None:
    raise exc


def stored_files(backing: str, *, strict: bool = False) -> Iterator[str]:
    """Regular files under the backing directory, temporary files of an interrupted
    whole-file operation excepted. `strict`: a directory that cannot be listed raises
    (OSError) instead of being passed by."""
    for dirpath, _, names in os.walk(backing, onerror=_raise if strict else None):
        for name in names:
            real = os.path.join(dirpath, name)
            if not name.startswith(TMP_PREFIX) and not os.path.islink(real) and os.path.isfile(real):
                yield real


def walk(backing: str, key_id: uuid.UUID, *, active: int | None = None,
         rewrap: Callable[[str], bool] | None = None) -> Walk:
    """Count the files under `backing` per header version of key `key_id`; with `rewrap`
    (True when it re-wrapped the file to version `active`), move each file under another
    version first."""
    result = Walk()
    seen: set[tuple[int, int]] = set()
    # Strict: a directory passed by would make its files look gone, and a version unused.
    for real in stored_files(backing, strict=True):
        try:
            st = os.stat(real, follow_symlinks=False)
            if st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            header = read_header(real)
        except FileNotFoundError:
            continue  # removed while we walked: nothing left to count
        except (FormatError, OSError) as exc:
            result.unreadable.append(os.path.relpath(real, backing))
            log.debug("%s: %s", real, exc)
            continue
        if header.key_id != key_id:
            result.unreadable.append(os.path.relpath(real, backing))
            continue
        version = header.key_version
        if rewrap is not None and active is not None and version != active:
            try:
                if rewrap(real):
                    result.rewrapped += 1
                    version = active
            except (AgentError, OSError, ValueError) as exc:  # a version's key gone, the server away: next walk
                log.warning("rewrap of %s skipped: %s", real, exc)
        result.versions[version] += 1
    result.scanned_at = datetime.now(UTC).isoformat()
    if result.unreadable:
        log.warning("%s: %d unreadable file(s) (no header of this key), first: %s", backing,
                    len(result.unreadable), ", ".join(result.unreadable[:5]))
    return result
