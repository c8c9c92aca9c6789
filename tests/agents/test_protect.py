"""Initial protection of a live directory and its reverse, interrupted and resumed."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from agents.cryptfile import EncryptedFile, KeyVersion, StaticKeyring, read_header
from agents.guardpoint.protect import plan, protect, unprotect


def make_tree(root: Path) -> dict[str, bytes]:
    files = {"a.txt": b"alpha" * 1000, "sub/b.bin": os.urandom(70_000), "sub/deeper/c": b"",
             "SRCF-looking": b"SRCF but just text that happens to start with the magic"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    os.symlink("a.txt", root / "link")
    return files


def test_protect_then_unprotect(tmp_path: Path) -> None:
    files = make_tree(tmp_path)
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    seen: list[int] = []
    done = protect(tmp_path, key, progress=seen.append)
    assert len(done.files) == 4 and sum(seen) == sum(len(v) for v in files.values())
    for rel, data in files.items():
        assert read_header(str(tmp_path / rel)).key_id == key.key_id
        with EncryptedFile.open(str(tmp_path / rel), StaticKeyring([key])) as f:
            assert f.read(0, f.size) == data
    assert os.readlink(tmp_path / "link") == "a.txt"
    again = protect(tmp_path, key)
    assert again.files == [] and again.skipped == 4
    unprotect(tmp_path, key.key_id, StaticKeyring([key]))
    for rel, data in files.items():
        assert (tmp_path / rel).read_bytes() == data


def test_interrupted_protection_resumes(tmp_path: Path) -> None:
    files = make_tree(tmp_path)
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    calls = [0]

    def stop_after_two(n: int) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        protect(tmp_path, key, progress=stop_after_two)
    remaining = plan(tmp_path, key.key_id, protect=True)
    assert 0 < len(remaining.files) < 4
    protect(tmp_path, key)
    assert plan(tmp_path, key.key_id, protect=True).files == []
    assert not [p for p in tmp_path.rglob(".srtmp-*")]
    for rel, data in files.items():
        with EncryptedFile.open(str(tmp_path / rel), StaticKeyring([key])) as f:
            assert f.read(0, f.size) == data
