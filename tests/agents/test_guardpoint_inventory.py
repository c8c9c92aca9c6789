"""What a guard point counts per key version for a retirement (decision 0024), on real
files in the format: one walk reads each file's header once (a file with several names
is one file), re-wraps what is under another version than the Active one, and never lets
a file it cannot read drop out of the count."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from agents.cryptfile import KeyVersion, StaticKeyring, encrypt_file, read_header, rewrap_in_place
from agents.cryptfile.transform import TMP_PREFIX
from agents.daemon import retiring_versions
from agents.guardpoint.inventory import MAX_REPORTED, UNREADABLE, Walk, walk

KEY = uuid.uuid4()
V1, V2 = KeyVersion(KEY, 1, os.urandom(32)), KeyVersion(KEY, 2, os.urandom(32))


def _file(backing: Path, rel: str, key: KeyVersion, data: bytes = b"payload") -> Path:
    path = backing / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    plain = backing.parent / f"plain-{uuid.uuid4().hex}"
    plain.write_bytes(data)
    encrypt_file(plain, path, key)
    plain.unlink()
    return path


def test_a_walk_counts_each_file_once_per_header_version(tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    for i in range(3):
        _file(backing, f"a{i}", V1)
    _file(backing, "sub/deeper/b", V2)
    linked = _file(backing, "sub/linked", V1)
    os.link(linked, backing / "other-name")  # one file, two names: counted once
    os.symlink(linked, backing / "a-symlink")  # not a file of its own
    (backing / f"{TMP_PREFIX}interrupted").write_bytes(b"half written")  # an interrupted operation's leftover
    (backing / "not-ours").write_bytes(b"x" * 200)  # no header of the format
    (backing / "empty").write_bytes(b"")
    _file(backing, "foreign", KeyVersion(uuid.uuid4(), 1, os.urandom(32)))  # another key's: unservable here

    done = walk(str(backing), KEY)
    assert done.versions == {1: 4, 2: 1}
    assert sorted(done.unreadable) == ["empty", "foreign", "not-ours"]
    assert done.rewrapped == 0 and done.scanned_at.endswith("+00:00")
    assert done.report() == {"1": 4, "2": 1, UNREADABLE: 3}


def test_a_walk_rewraps_to_the_active_version_and_counts_what_it_left(tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    files = [_file(backing, f"f{i}", V1, f"data {i}".encode()) for i in range(5)]
    os.link(files[0], backing / "second-name")
    keyring = StaticKeyring([V1, V2])
    done = walk(str(backing), KEY, active=2, rewrap=lambda real: rewrap_in_place(real, keyring, V2))
    assert done.versions == {2: 5} and done.rewrapped == 5
    assert {read_header(str(f)).key_version for f in files} == {2}

    # Version 1's key unavailable (destroyed, the server away): the files it protects stay
    # counted under it, not dropped and not counted as moved.
    _file(backing, "late", V1)
    without_v1 = StaticKeyring([V2])
    done = walk(str(backing), KEY, active=2, rewrap=lambda real: rewrap_in_place(real, without_v1, V2))
    assert done.versions == {1: 1, 2: 5} and done.rewrapped == 0


def test_the_report_keeps_what_a_retirement_waits_on_past_the_limit() -> None:
    counted = Walk()
    for v in range(1, 101):
        counted.versions[v] = v
    counted.unreadable = ["x"]
    report = counted.report(retiring=[90])
    assert len(report) == MAX_REPORTED
    assert report[UNREADABLE] == 1 and report["90"] == 90 and report["1"] == 1
    assert "100" not in report  # the newest go first: the Active version can never be retired
    assert list(Walk().report()) == []


def test_retiring_versions_only_from_a_server_that_lists_them() -> None:
    key = str(uuid.uuid4())
    old_server = [{"key_id": key, "name": "k", "active_version": 2}]
    assert retiring_versions(old_server) is None
    assert retiring_versions([]) is None
    new_server = [{"key_id": key, "name": "k", "active_version": 3, "retiring_versions": [1, 2]},
                  {"key_id": "other", "name": "o", "active_version": 1, "retiring_versions": []}]
    assert retiring_versions(new_server) == {key: [1, 2], "other": []}



def test_a_directory_it_cannot_list_fails_the_walk_rather_than_counting_nothing(tmp_path: Path) -> None:
    """Files passed by would look moved off their version: the walk fails instead (the
    guard point keeps its last count and logs why)."""
    with pytest.raises(FileNotFoundError):
        walk(str(tmp_path / "unmounted-backing"), KEY)
