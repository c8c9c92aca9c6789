"""Access rules of a guard point: decided per caller (user, groups, executable), enforced
with EACCES, learned without denying, and recorded as events."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.cryptfile import KeyVersion
from agents.guardpoint.policy import AccessPolicy, Caller, Effect, Mode, Rule
from tests.serve import eventually

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None
                                or os.geteuid() != 0, reason="needs /dev/fuse, fusermount3 and root")
HEAD = shutil.which("head") or "/usr/bin/head"
CAT = shutil.which("cat") or "/usr/bin/cat"


def test_first_matching_rule_wins() -> None:
    root = Caller(0, 0, 1, "root", frozenset({"root"}), "/usr/bin/cat")
    app = Caller(1000, 1000, 2, "app", frozenset({"app", "dba"}), "/usr/lib/postgresql/15/bin/postgres")
    policy = AccessPolicy(rules=(
        Rule(Effect.DENY, executables=frozenset({"/usr/bin/cat"}), audit=True),
        Rule(Effect.PERMIT, groups=frozenset({"dba"})),
        Rule(Effect.PERMIT, users=frozenset({"root"}), access="read"),
    ))
    assert policy.decide(root, "read") == policy.decide(root, "read")
    assert not policy.decide(root, "read").allowed and policy.decide(root, "read").rule == 0
    assert policy.decide(app, "write").allowed and policy.decide(app, "write").rule == 1
    other_root = Caller(0, 0, 3, "root", frozenset({"root"}), "/usr/bin/python3")
    assert policy.decide(other_root, "read").allowed
    assert not policy.decide(other_root, "write").allowed  # default deny
    learn = AccessPolicy(mode=Mode.LEARN, rules=policy.rules)
    d = learn.decide(root, "read")
    assert d.allowed and not d.would_allow and d.audit


def _serve(backing: str, mnt: str, key: KeyVersion, policy: AccessPolicy, spool: str) -> None:
    from agents.guardpoint.dataplane import serve
    from agents.keyclient.spool import EventSpool

    events = EventSpool(Path(spool))
    serve(backing, mnt, [key], key, allow_other=True, policy=policy, on_event=events.append)


@pytest.fixture
def mounted(request: pytest.FixtureRequest) -> Iterator[tuple[Path, Path]]:
    import tempfile

    policy: AccessPolicy = request.param
    # Other users must be able to reach the mount point: pytest's own tmp dirs are 0700.
    base = Path(tempfile.mkdtemp(prefix="gp-policy-", dir="/tmp"))
    os.chmod(base, 0o755)  # noqa: S103
    backing, mnt, spool = base / "b", base / "m", base / "spool"
    backing.mkdir()
    mnt.mkdir()
    key = KeyVersion(uuid.uuid4(), 1, os.urandom(32))
    proc = multiprocessing.get_context("spawn").Process(target=_serve,
                                                         args=(str(backing), str(mnt), key, policy, str(spool)))
    proc.start()
    deadline = time.monotonic() + 20
    while not os.path.ismount(mnt):
        assert proc.is_alive() and time.monotonic() < deadline
        time.sleep(0.05)
    try:
        yield mnt, spool
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        shutil.rmtree(base, ignore_errors=True)


def events(spool: Path) -> list[dict[str, object]]:
    return [json.loads(line) for p in sorted(spool.glob("*.jsonl")) for line in p.read_text().splitlines()]


POLICY = AccessPolicy(rules=(
    Rule(Effect.DENY, executables=frozenset({os.path.realpath(HEAD)}), audit=True),
    Rule(Effect.PERMIT, uids=frozenset({0})),
))


@pytest.mark.parametrize("mounted", [POLICY], indirect=True)
def test_enforce_denies_by_user_and_program(mounted: tuple[Path, Path]) -> None:
    mnt, spool = mounted
    (mnt / "secret").write_bytes(b"top secret\n")
    os.chmod(mnt / "secret", 0o644)  # the kernel would let anyone read: the policy must not
    assert subprocess.run([CAT, str(mnt / "secret")], capture_output=True).stdout == b"top secret\n"
    r = subprocess.run([HEAD, str(mnt / "secret")], capture_output=True, text=True)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    r = subprocess.run(["runuser", "-u", "nobody", "--", CAT, str(mnt / "secret")], capture_output=True, text=True)
    assert r.returncode != 0 and "Permission denied" in r.stderr and r.stdout == ""
    expected = {("root", os.path.realpath(HEAD)), ("nobody", os.path.realpath(CAT))}

    def denied() -> list[dict[str, object]]:
        return [e for e in events(spool) if e["event"] == "access.denied"]

    # events reach the spool from the data plane through the control channel, a moment later
    eventually(lambda: {(e["user"], e["exe"]) for e in denied()} >= expected, "the denials' events")
    assert all(e["path"] == "/secret" and e["mode"] == "enforce" for e in denied())


@pytest.mark.parametrize("mounted", [AccessPolicy(mode=Mode.LEARN, rules=POLICY.rules)], indirect=True)
def test_learn_mode_allows_and_records_what_it_would_deny(mounted: tuple[Path, Path]) -> None:
    mnt, spool = mounted
    (mnt / "f").write_bytes(b"data\n")
    os.chmod(mnt / "f", 0o644)
    assert subprocess.run([HEAD, str(mnt / "f")], capture_output=True).stdout == b"data\n"
    r = subprocess.run(["runuser", "-u", "nobody", "--", CAT, str(mnt / "f")], capture_output=True)
    assert r.returncode == 0 and r.stdout == b"data\n"

    def would() -> list[dict[str, object]]:
        return [e for e in events(spool) if e["event"] == "access.would_deny"]

    eventually(lambda: {e["user"] for e in would()} >= {"root", "nobody"}, "the would-deny events")
    assert {e["user"] for e in would()} == {"root", "nobody"} and all(e["mode"] == "learn" for e in would())
