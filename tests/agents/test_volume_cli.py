"""`kms-agent volume …` end to end on real parts: the key server's agent port (mutual
TLS), stock cryptsetup, the native userspace data plane (`strongroom-volume` on FUSE),
loop devices, ext4 and e2fsck. This machine has no device-mapper, so volumes open in
userspace here; the same volumes open with `cryptsetup open` wherever dm-crypt exists
(the format checks below are cryptsetup's own)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from agents.cli import Exit
from agents.config import AgentConfig
from agents.daemon import AgentDaemon
from agents.guardpoint.shield import mounts_at
from agents.keyclient.client import ServerClient, ServerKeyring
from agents.keyclient.identity import HostIdentity
from agents.keyclient.spool import EventSpool
from agents.volume import luks
from agents.volume.manager import DAEMON, VolumeManager
from keyserver.services import Services
from tests.agents.test_agent_port import enroll_host, group_key
from tests.agents.test_cli import kms_agent, write_config
from tests.conftest import unique

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="loop devices and mounts need root"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse (FUSE kernel module)"),
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="needs loop devices (/dev/loop-control)"),
    pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="needs cryptsetup (Debian: cryptsetup-bin)"),
]


class Agent:
    """One enrolled host driven through its `kms-agent` command."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                 base_url: str, agent_url: str, admin: httpx.Client) -> None:
        if not DAEMON.exists():
            pytest.fail(f"{DAEMON} is not built: scripts/test builds it (native_need)")
        host = enroll_host(tmp_path, base_url, agent_url, admin, name="vol")
        self.group, self.state = host.group, host.identity.state_dir
        self.run_dir = tmp_path / "run"
        self.config = write_config(tmp_path / "agent.toml", agent_url, self.state, tmp_path / "ca.pem",
                                   run_dir=f'"{self.run_dir}"')
        self.agent_url, self.tmp = agent_url, tmp_path
        self._mp, self._capsys = monkeypatch, capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        return kms_agent(self._mp, self._capsys, self.config, "volume", *args)

    def ok(self, *args: str) -> str:
        code, out, err = self(*args)
        assert code == Exit.OK, (args, out, err)
        return " ".join(out.split())

    def passphrase(self, image: Path) -> bytes:
        """The sealed keyslot's passphrase, unsealed as the agent does (to check the
        volume with stock cryptsetup, independently of the agent)."""
        _, tok = luks.token(image) or (0, {})
        with ServerClient.for_host(self.agent_url, HostIdentity.load_or_create(self.state)) as c:
            return c.unseal_volume(tok["volume_id"], base64.b64decode(tok["blob"])).passphrase

    def formatted(self, name: str, image: Path, key: str, *create: str) -> None:
        """A new volume with an empty ext4 on it, closed."""
        self.ok("create", name, str(image), "--key", key, "--yes", *create)
        self.ok("open", name, "--userspace")
        assert _sh("mkfs.ext4", "-q", self.opened(name)["device"]).returncode == 0
        self.ok("close", name)

    def opened(self, name: str) -> dict[str, Any]:
        return dict(json.loads((self.run_dir / "volumes" / f"{name}.json").read_text()))


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], base_url: str,
          agent_url: str, admin: httpx.Client) -> Any:
    a = Agent(tmp_path, monkeypatch, capsys, base_url, agent_url, admin)
    yield a
    # Whatever a failed test left open: close it, so no mount or loop device outlives it.
    for state in (a.run_dir / "volumes").glob("*.json"):
        a("close", state.stem)


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def _key_file(tmp: Path, secret: bytes) -> Path:
    f = tmp / f"k-{time.monotonic_ns()}"
    f.write_bytes(secret)
    f.chmod(0o600)
    return f


def test_create_open_mkfs_mount_close_reopen(agent: Agent, admin: httpx.Client, tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    image = tmp_path / "pgdata.img"
    out = agent.ok("create", "pgdata", str(image), "--key", key["name"], "--size", "96M", "--yes")
    assert "volume pgdata" in out and f"{key['name']} v1" in out
    # A standard LUKS2 volume, as stock cryptsetup reads it.
    meta = luks.metadata(image)
    segment = meta["segments"]["0"]
    assert segment["encryption"] == "aes-xts-plain64" and segment["sector_size"] == 4096
    assert [k["key_size"] for k in meta["keyslots"].values()] == [64]
    (_, tok), = [(i, t) for i, t in meta["tokens"].items() if t["type"] == "strongroom"]
    assert tok["key"] == key["name"] and tok["key_version"] == 1 and tok["keyslots"] == ["0"]
    passphrase = agent.passphrase(image)
    assert _sh("cryptsetup", "open", "--test-passphrase", "--key-file", str(_key_file(tmp_path, passphrase)),
               str(image)).returncode == 0

    out = agent.ok("open", "pgdata", "--userspace")
    device = agent.opened("pgdata")["device"]
    assert "open (userspace)" in out and device.startswith("/dev/loop")
    assert _sh("mkfs.ext4", "-q", "-L", "pgdata", device).returncode == 0
    agent.ok("close", "pgdata")
    assert _sh("losetup", "-j", str(tmp_path / "run" / "volumes" / "pgdata" / "volume")).stdout == ""

    mnt = tmp_path / "mnt"
    agent.ok("open", "pgdata", "--userspace", "--mount", str(mnt))
    payload = os.urandom(3 << 20)
    (mnt / "table.dat").write_bytes(payload)
    (mnt / "notes.txt").write_text("written through the volume\n")
    os.sync()
    status = json.loads(agent.ok("status", "--json"))
    (row,) = [v for v in status if v["name"] == "pgdata"]
    assert row["state"] == "open" and row["opened_by"] == "userspace" and row["local"]["alive"]
    agent.ok("close", "pgdata")
    assert not os.path.ismount(mnt)
    # At rest: neither the file system nor the data is in the image.
    raw = image.read_bytes()
    assert b"written through the volume" not in raw and payload[:4096] not in raw

    # Independently of the data plane: cryptsetup's volume key and OpenSSL's XTS (through
    # `cryptography`) find ext4's superblock in the first encryption sector.
    vk = tmp_path / "vk.bin"
    assert _sh("cryptsetup", "luksDump", "-q", "--dump-volume-key", "--volume-key-file", str(vk), "--key-file",
               str(_key_file(tmp_path, passphrase)), str(image)).returncode == 0
    offset = int(segment["offset"])
    decryptor = Cipher(algorithms.AES(vk.read_bytes()), modes.XTS((0).to_bytes(16, "little"))).decryptor()
    first = decryptor.update(raw[offset:offset + 4096]) + decryptor.finalize()
    assert first[1024 + 56:1024 + 58] == b"\x53\xef"  # s_magic

    agent.ok("open", "pgdata", "--userspace", "--mount", str(mnt))
    assert (mnt / "table.dat").read_bytes() == payload
    assert (mnt / "notes.txt").read_text() == "written through the volume\n"
    agent.ok("close", "pgdata")
    code, _, err = agent("close", "nothing-here")
    assert code == Exit.USAGE and "no volume 'nothing-here'" in err


def test_revoked_or_shredded_volumes_do_not_open(agent: Agent, admin: httpx.Client, tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    image = tmp_path / "gone.img"
    agent.ok("create", "gone", str(image), "--key", key["name"], "--size", "40M", "--yes")
    (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(image)]
    assert admin.post(f"/api/v1/volumes/{vol['id']}/revoke").status_code == 200
    code, _, err = agent("open", "gone", "--userspace")
    assert code == Exit.KEY and "revoked" in err and "volume_revoked" in err
    assert not (agent.run_dir / "volumes" / "gone.json").exists()

    # A revoked host opens nothing: the server refuses its certificate.
    kept = tmp_path / "kept.img"
    agent.ok("create", "kept", str(kept), "--key", key["name"], "--size", "40M", "--yes")
    host_id = next(v["host_id"] for v in admin.get("/api/v1/volumes").json() if v["path"] == str(kept))
    assert admin.post(f"/api/v1/hosts/{host_id}/revoke").status_code == 200
    code, _, err = agent("open", "kept", "--userspace")
    assert code == Exit.NOT_ENROLLED and "refuses this host" in err and "re-enroll" in err


def test_a_destroyed_key_shreds_its_volumes(agent: Agent, admin: httpx.Client, tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    shredded = tmp_path / "shredded.img"
    agent.ok("create", "shredded", str(shredded), "--key", key["name"], "--size", "40M", "--yes")
    assert admin.post(f"/api/v1/keys/{key['name']}/revoke", json={"reason": "superseded"}).status_code == 200
    # The volume still uses the key: destroying it is crypto-shredding, asked for by name.
    assert admin.post(f"/api/v1/keys/{key['name']}/destroy", json={}).json()["code"] == "version_in_use"
    assert admin.post(f"/api/v1/keys/{key['name']}/destroy", json={"shred": True}).status_code == 200
    code, _, err = agent("open", "shredded", "--userspace")
    assert code == Exit.KEY and "destroyed" in err
    # Formatting over a volume is refused: nothing is lost by a slip.
    code, _, err = agent("create", "again", str(shredded), "--key", key["name"], "--yes")
    assert code == Exit.FILE and "already a LUKS volume" in err


def test_rotate_recovery_and_rekey_keep_the_data(agent: Agent, admin: httpx.Client, tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    image = tmp_path / "rot.img"
    agent.ok("create", "rot", str(image), "--key", key["name"], "--size", "48M", "--sector-size", "512", "--yes")
    agent.ok("open", "rot", "--userspace")
    device = agent.opened("rot")["device"]
    assert _sh("mkfs.ext4", "-q", device).returncode == 0
    mnt = tmp_path / "m"
    mnt.mkdir()
    assert _sh("mount", device, str(mnt)).returncode == 0
    payload = os.urandom(1 << 20)
    (mnt / "data").write_bytes(payload)
    assert _sh("umount", str(mnt)).returncode == 0
    agent.ok("close", "rot")

    # Rotation: a new keyslot under the key's new version, the old one gone, data untouched.
    before = image.read_bytes()[16 << 20:]
    assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
    assert "v2" in agent.ok("rotate", "rot")
    meta = luks.metadata(image)
    (tok,) = [t for t in meta["tokens"].values() if t["type"] == "strongroom"]
    assert tok["key_version"] == 2 and list(meta["keyslots"]) == tok["keyslots"]
    assert image.read_bytes()[16 << 20:] == before

    # Recovery: once, shown once, opens the volume with stock cryptsetup alone.
    out = agent.ok("recovery", "rot")
    words = next(w for w in out.split() if w.count("-") == 8)
    assert _sh("cryptsetup", "open", "--test-passphrase", "--key-file",
               str(_key_file(tmp_path, words.encode())), str(image)).returncode == 0
    code, _, err = agent("recovery", "rot")
    assert code == Exit.USAGE and "already has a recovery passphrase" in err

    # A re-key asked for in the console shows on the host, in the table and on stderr.
    (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(image)]
    assert admin.post(f"/api/v1/volumes/{vol['id']}/rekey").status_code == 202
    (row,) = [v for v in json.loads(agent.ok("status", "--json")) if v["name"] == "rot"]
    assert row["rekey_asked"] == 1 and row["rekey_here"] is None
    code, out, err = agent("status")
    assert code == Exit.OK and "(#1)" in out  # the re-key column: "asked for (#1)", wrapped to the terminal
    assert "a re-key was asked for on the key server; run `kms-agent volume rekey rot`" in " ".join(err.split())

    # Re-key: the data re-encrypted under a new volume key; the recovery keyslot goes.
    old_uuid = luks.luks_uuid(image)
    out = agent.ok("rekey", "rot")
    assert "re-encrypted" in out and luks.luks_uuid(image) == old_uuid
    assert _sh("cryptsetup", "open", "--test-passphrase", "--key-file",
               str(_key_file(tmp_path, words.encode())), str(image)).returncode != 0
    assert image.read_bytes()[16 << 20:(17 << 20)] != before[:1 << 20]
    (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(image)]
    assert vol["rekey"]["finished"] and not vol["has_recovery"]
    (row,) = [v for v in json.loads(agent.ok("status", "--json")) if v["name"] == "rot"]
    assert row["rekey_asked"] is None and row["rekey_here"] is None
    agent.ok("open", "rot", "--userspace", "--mount", str(mnt))
    assert (mnt / "data").read_bytes() == payload
    agent.ok("close", "rot")


def test_a_killed_data_plane_leaves_a_file_system_that_checks_clean(agent: Agent, admin: httpx.Client,
                                                                    tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    image = tmp_path / "crash.img"
    agent.formatted("crash", image, key["name"], "--size", "64M")
    mnt = tmp_path / "m"
    agent.ok("open", "crash", "--userspace", "--mount", str(mnt))
    (mnt / "kept").write_bytes(b"k" * 100_000)
    os.sync()
    writer = subprocess.Popen(["dd", "if=/dev/urandom", f"of={mnt / 'big'}", "bs=64k", "count=400",
                               "oflag=direct"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    os.kill(agent.opened("crash")["pid"], signal.SIGKILL)
    writer.wait(timeout=60)
    # The mount is dead; close cleans up everything it left, then the volume opens again.
    agent.ok("close", "crash")
    assert _debris(agent, "crash", mnt) == []
    agent.ok("open", "crash", "--userspace")
    device = agent.opened("crash")["device"]
    fix = _sh("e2fsck", "-fp", device)  # replays the journal, as a boot would
    assert fix.returncode in (0, 1), fix.stdout + fix.stderr
    check = _sh("e2fsck", "-fn", device)
    assert check.returncode == 0, check.stdout + check.stderr
    agent.ok("close", "crash")
    agent.ok("open", "crash", "--userspace", "--mount", str(mnt))
    assert (mnt / "kept").read_bytes() == b"k" * 100_000
    agent.ok("close", "crash")


def _debris(agent: Agent, name: str, mnt: Path) -> list[str]:
    """What an instance of volume `name` left on this host: mounts at `mnt`, loop devices
    over its served file, its FUSE mount."""
    fuse_dir = agent.run_dir / "volumes" / name
    left = [f"mount at {mnt}: {m.source}" for m in mounts_at(str(mnt))]
    listed = json.loads(_sh("losetup", "--list", "--json", "--output", "NAME,BACK-FILE").stdout or "{}")
    left += [f"loop {d['name']}" for d in listed.get("loopdevices", [])
             if (d.get("back-file") or "").startswith(str(fuse_dir))]
    left += [f"FUSE mount at {fuse_dir}" for _ in mounts_at(str(fuse_dir))]
    return left


def test_reopening_after_the_data_plane_died_clears_the_dead_instance(agent: Agent, admin: httpx.Client,
                                                                        tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    agent.formatted("dead", tmp_path / "dead.img", key["name"], "--size", "40M")
    mnt = tmp_path / "m"
    agent.ok("open", "dead", "--userspace", "--mount", str(mnt))
    (mnt / "kept").write_bytes(b"k" * 10_000)
    os.sync()
    first = agent.opened("dead")
    os.kill(first["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{first['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # No close in between: the open finds the dead instance and clears it first.
    agent.ok("open", "dead", "--userspace", "--mount", str(mnt))
    again = agent.opened("dead")
    stack = mounts_at(str(mnt))
    assert [m.source for m in stack] == [again["device"]], "mounted over the dead instance"
    assert _debris(agent, "dead", mnt) == [f"mount at {mnt}: {again['device']}", f"loop {again['device']}",
                                            f"FUSE mount at {agent.run_dir / 'volumes' / 'dead'}"]
    assert (mnt / "kept").read_bytes() == b"k" * 10_000
    agent.ok("close", "dead")
    assert _debris(agent, "dead", mnt) == []
    assert not (agent.run_dir / "volumes" / "dead").exists() and not os.path.ismount(mnt)


def test_boot_opens_the_tab_and_fails_closed(agent: Agent, admin: httpx.Client, tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    for name in ("boot-a", "boot-b"):
        agent.ok("create", name, str(tmp_path / f"{name}.img"), "--key", key["name"], "--size", "40M", "--yes")
    tab = tmp_path / "volumes.tab"
    # boot-b has no file system yet: its mount fails, and nofail lets the boot go on.
    tab.write_text("# name  mountpoint  options\nboot-a  -  userspace\n"
                   f"boot-b  {tmp_path / 'b'}  userspace,nofail   # shared scratch\n")
    code, out, err = agent("open-all", "--tab", str(tab))
    assert code == Exit.OK, (out, err)
    assert "boot-a: open (userspace)" in " ".join(out.split()) and "boot-b" in err and "nofail" in err
    assert agent.opened("boot-a")["device"].startswith("/dev/loop")
    assert not (agent.run_dir / "volumes" / "boot-b.json").exists()
    # Again: what is open stays open, nothing is opened twice.
    assert agent("open-all", "--tab", str(tab))[0] == Exit.OK
    out = agent.ok("close-all")
    assert "boot-a: closed" in out and not (agent.run_dir / "volumes" / "boot-a.json").exists()

    tab.write_text("boot-a - userspace,fast\n")
    code, _, err = agent("open-all", "--tab", str(tab))
    assert code == Exit.USAGE and f"{tab}:1" in err

    # The server unreachable: nothing opens (fail closed), and the refusal waits in the
    # spool to be audited when the server answers again.
    tab.write_text("boot-a - userspace\n")
    offline = write_config(tmp_path / "offline.toml", "https://127.0.0.1:9", agent.state, tmp_path / "ca.pem",
                           run_dir=f'"{agent.run_dir}"')

    def offline_agent(*args: str) -> tuple[int, str, str]:
        return kms_agent(agent._mp, agent._capsys, offline, "volume", *args)

    code, _, err = offline_agent("open-all", "--tab", str(tab), "--wait", "1")
    assert code == Exit.UNREACHABLE and "unreachable" in err and "no offline grace" in err
    assert not (agent.run_dir / "volumes" / "boot-a.json").exists()
    spooled = "".join(p.read_text() for p in (agent.state / "spool").rglob("*") if p.is_file())
    assert "volume.open_failed" in spooled and "server_unreachable" in spooled

    # With an offline grace set on the server, the passphrase of the last unseal (wrapped
    # under the host's key) opens the volume through an outage, until the grace ends.
    (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(tmp_path / "boot-a.img")]
    r = admin.put(f"/api/v1/volumes/{vol['id']}/policy", json={"grace_seconds": 3600})
    assert r.status_code == 200 and r.json()["grace_seconds"] == 3600
    assert admin.put(f"/api/v1/volumes/{vol['id']}/policy", json={"grace_seconds": 8 * 86400}).status_code == 422
    agent.ok("open", "boot-a", "--userspace")
    agent.ok("close", "boot-a")
    kept = agent.state / "volume-grace" / f"{vol['id']}.json"
    assert kept.stat().st_mode & 0o077 == 0
    code, out, err = offline_agent("open-all", "--tab", str(tab), "--wait", "1")
    assert code == Exit.OK and "boot-a: open (userspace)" in " ".join(out.split()), err
    assert offline_agent("close-all")[0] == Exit.OK
    spooled = "".join(p.read_text() for p in (agent.state / "spool").rglob("*") if p.is_file())
    assert "volume.open_offline" in spooled
    # Back to fail closed: the next unseal deletes what was kept.
    assert admin.put(f"/api/v1/volumes/{vol['id']}/policy", json={"grace_seconds": 0}).status_code == 200
    agent.ok("open", "boot-a", "--userspace")
    agent.ok("close", "boot-a")
    assert not kept.exists()
    assert offline_agent("open-all", "--tab", str(tab), "--wait", "1")[0] == Exit.UNREACHABLE


def _fsx(path: Path, ops: int, seed: int, *, max_size: int = 4 << 20) -> bytearray:
    """fsx's idea in a few lines (xfstests' fsx is not packaged for Debian): random
    writes at any offset and length, truncations up and down, reads compared against a
    model of the file, fsyncs; returns the model."""
    import random

    rng = random.Random(seed)
    model = bytearray()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(ops):
            op = rng.random()
            if op < 0.45:
                off, n = rng.randrange(max_size), rng.randrange(1, 70_000)
                n = min(n, max_size - off)
                data = rng.randbytes(n)
                assert os.pwrite(fd, data, off) == n
                if off > len(model):
                    model.extend(b"\0" * (off - len(model)))
                model[off:off + n] = data
            elif op < 0.55:
                size = rng.randrange(max_size)
                os.ftruncate(fd, size)
                del model[size:]
                model.extend(b"\0" * (size - len(model)))
            elif op < 0.6:
                os.fsync(fd)
            else:
                off, n = rng.randrange(max_size), rng.randrange(1, 70_000)
                got = os.pread(fd, n, off)
                assert got == bytes(model[off:off + n]), f"op {i}: read {n} at {off} differs"
        assert os.fstat(fd).st_size == len(model)
    finally:
        os.close(fd)
    return model


def test_fsx_on_a_file_system_on_an_opened_volume(agent: Agent, admin: httpx.Client, tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    image = tmp_path / "fsx.img"
    agent.formatted("fsx", image, key["name"], "--size", "64M", "--sector-size", "512")
    mnt = tmp_path / "m"
    agent.ok("open", "fsx", "--userspace", "--mount", str(mnt))
    models = {seed: _fsx(mnt / f"fsx-{seed}", 1500, seed) for seed in (1, 2)}
    # Through the page cache, then cold from the volume, then after closing and reopening.
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    for seed, model in models.items():
        assert (mnt / f"fsx-{seed}").read_bytes() == bytes(model)
    agent.ok("close", "fsx")
    agent.ok("open", "fsx", "--userspace", "--mount", str(mnt))
    for seed, model in models.items():
        assert (mnt / f"fsx-{seed}").read_bytes() == bytes(model)
    agent.ok("close", "fsx")
    agent.ok("open", "fsx", "--userspace")
    device = agent.opened("fsx")["device"]
    check = _sh("e2fsck", "-fn", device)
    assert check.returncode == 0, check.stdout + check.stderr
    agent.ok("close", "fsx")


@pytest.mark.skipif(not luks.dm_crypt_available(),
                    reason="the kernel has no device-mapper here (not in /proc/misc): the dm-crypt path is "
                           "cryptsetup's own; the userspace path is checked against cryptsetup's encryption above")
def test_the_same_volume_opens_with_dm_crypt_and_in_userspace(agent: Agent, admin: httpx.Client,
                                                              tmp_path: Path) -> None:
    key = group_key(admin, agent.group)
    image = tmp_path / "both.img"
    agent.ok("create", "both", str(image), "--key", key["name"], "--size", "64M", "--yes")
    # cryptsetup attaches an image file to a loop device of its own for dm-crypt.
    agent.ok("open", "both", "--dm-crypt")
    device = agent.opened("both")["device"]
    assert device == "/dev/mapper/strongroom-both"
    assert _sh("mkfs.ext4", "-q", device).returncode == 0
    mnt = tmp_path / "m"
    mnt.mkdir()
    assert _sh("mount", device, str(mnt)).returncode == 0
    (mnt / "written-by-dm-crypt").write_text("kernel\n")
    assert _sh("umount", str(mnt)).returncode == 0
    agent.ok("close", "both")
    agent.ok("open", "both", "--userspace", "--mount", str(mnt))
    assert (mnt / "written-by-dm-crypt").read_text() == "kernel\n"
    agent.ok("close", "both")


def test_a_rekey_killed_half_way_resumes(agent: Agent, admin: httpx.Client, services: Services,
                                        tmp_path: Path) -> None:
    """kill -9 of the agent during a re-key: the volume refuses to open half re-encrypted,
    says how to finish, and `rekey` resumes from cryptsetup's checkpoint in the header."""
    key = group_key(admin, agent.group)
    image = tmp_path / "half.img"
    agent.ok("create", "half", str(image), "--key", key["name"], "--size", "400M", "--yes")
    agent.ok("open", "half", "--userspace")
    device = agent.opened("half")["device"]
    payload = os.urandom(8 << 20)
    with open(device, "r+b") as f:  # raw data across the volume: every part of it is re-encrypted
        for at in range(0, 380 << 20, 40 << 20):
            f.seek(at)
            f.write(payload)
        os.fsync(f.fileno())
    agent.ok("close", "half")
    kms = shutil.which("kms-agent") or str(Path(sys.executable).parent / "kms-agent")
    proc = subprocess.Popen([kms, "--config", str(agent.config), "volume", "rekey", "half"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not luks.reencryption_pending(luks.metadata(image)):
            assert proc.poll() is None and time.monotonic() < deadline, "the re-key ended before it could be killed"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the agent and its cryptsetup
    finally:
        proc.wait(30)
    assert luks.reencryption_pending(luks.metadata(image))
    (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(image)]
    assert vol["state"] == "rekeying" and not vol["rekey"]["finished"]  # as the killed run left it
    # The host's next contact — the daemon's heartbeat here — tells the server the truth:
    # closed, the re-key stopped where it stood.
    config = AgentConfig.load(agent.config)
    with ServerClient.for_host(agent.agent_url, HostIdentity.load_or_create(agent.state)) as c:
        AgentDaemon(c, ServerKeyring(c, ttl_seconds=60, max_entries=8), EventSpool(config.spool_dir),
                    volumes=VolumeManager(c, config)).beat()
    (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(image)]
    assert vol["state"] == "closed" and not vol["rekey"]["finished"] and vol["rekey_applied"] == 0
    (row,) = [v for v in json.loads(agent.ok("status", "--json")) if v["name"] == "half"]
    assert row["rekey_here"] == "interrupted" and row["state"] == "closed"
    services.audit.flush()
    audited = admin.get("/api/v1/audit/events", params={"object_id": vol["id"], "limit": 20}).json()["items"]
    assert any("re-key interrupted" in str(e["details"].get("detail", "")) for e in audited)
    code, _, err = agent("status")
    assert "a re-key was interrupted here; `kms-agent volume rekey half` resumes it" in " ".join(err.split())
    code, _, err = agent("open", "half", "--userspace")
    assert code == Exit.USAGE and "interrupted" in err and "kms-agent volume rekey half" in err
    assert "re-encrypted" in agent.ok("rekey", "half")
    assert not luks.reencryption_pending(luks.metadata(image))
    (vol,) = [v for v in admin.get("/api/v1/volumes").json() if v["path"] == str(image)]
    assert vol["state"] == "closed" and vol["rekey"]["finished"] and vol["rekey_applied"] == 1
    agent.ok("open", "half", "--userspace")
    with open(agent.opened("half")["device"], "rb") as f:
        for at in range(0, 380 << 20, 40 << 20):
            f.seek(at)
            assert f.read(len(payload)) == payload, f"data at {at} changed"
    agent.ok("close", "half")


def test_a_refused_create_leaves_no_image_and_status_works_offline(agent: Agent, admin: httpx.Client,
                                                                    tmp_path: Path) -> None:
    # A key not tagged for this host's group: the server refuses, and the image file the
    # command made for the volume goes with the refusal.
    other = admin.post("/api/v1/keys", json={"name": unique("notmine")}).json()
    image = tmp_path / "refused.img"
    code, _, err = agent("create", "refused", str(image), "--key", other["name"], "--size", "40M", "--yes")
    assert code == Exit.KEY and "may not use key" in err
    assert not image.exists()

    key = group_key(admin, agent.group)
    agent.ok("create", "seen", str(tmp_path / "seen.img"), "--key", key["name"], "--size", "40M", "--yes")
    agent.ok("status")
    # The server away: the list as last seen here, said so, and what is open here.
    offline = write_config(tmp_path / "offline.toml", "https://127.0.0.1:9", agent.state, tmp_path / "ca.pem",
                           run_dir=f'"{agent.run_dir}"')
    code, out, err = kms_agent(agent._mp, agent._capsys, offline, "volume", "status", "--json")
    assert code == Exit.OK and "unreachable" in err and "as last seen" in err
    (row,) = [v for v in json.loads(out) if v["name"] == "seen"]
    assert row["state"] == "closed" and row["as_of"].startswith("last seen") and row["local"] is None
    assert row["revoked_here"] is None and row["grace_kept"] is False  # it would fail closed
    assert kms_agent(agent._mp, agent._capsys, offline, "volume", "status")[0] == Exit.OK
    # Open here, and the server gone since: what is open here is shown, as is.
    agent.ok("open", "seen", "--userspace")
    code, out, err = kms_agent(agent._mp, agent._capsys, offline, "volume", "status", "--json")
    assert code == Exit.OK and "unreachable" in err
    (row,) = [v for v in json.loads(out) if v["name"] == "seen"]
    assert row["as_of"].startswith("last seen") and row["local"]["alive"]
    assert row["local"]["device"].startswith("/dev/loop")
    assert row["rekey_asked"] is None and row["rekey_here"] is None
    code, out, _ = kms_agent(agent._mp, agent._capsys, offline, "volume", "status")
    assert code == Exit.OK and "seen" in out  # the table (its cells wrap to the terminal)
    agent.ok("close", "seen")
