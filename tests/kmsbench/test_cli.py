"""kms-bench as users run it: bad input refused before any work (exit code, the fix to
apply, nothing created), paths it did not create left alone, Ctrl-C leaving nothing
behind, and one real --quick run of the engine suite end to end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kmsbench.errors import Exit
from kmsbench.workspace import MARKER, mounts_under

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts with allow_other and drop_caches need root")


def kms_bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kmsbench", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_keyserver_that_is_down_is_reported_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = kms_bench("--suites", "keyserver", "--keyserver", f"http://127.0.0.1:{_closed_port()}", "--token", "t",
                     "--out", str(out), timeout=60)
    assert done.returncode == Exit.SERVICE
    assert "does not answer" in done.stderr and "keyserver serve" in done.stderr
    assert not out.exists()


def test_a_refused_token_is_reported_before_any_work(base_url: str, ca_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = kms_bench("--suites", "keyserver", "--keyserver", base_url, "--cacert", str(ca_file), "--token",
                     "srk_not-a-token", "--out", str(out), timeout=60)
    assert done.returncode == Exit.SERVICE
    assert "refused the token" in done.stderr and "valid" in done.stderr
    assert not out.exists()


def test_a_server_whose_ca_is_not_trusted_is_refused_with_advice(base_url: str, tmp_path: Path) -> None:
    # The key server's certificate comes from its own CA: without --cacert, nothing is sent to it.
    done = kms_bench("--suites", "keyserver", "--keyserver", base_url, "--token", "srk_t", "--out",
                     str(tmp_path / "out"), timeout=60)
    assert done.returncode == Exit.SERVICE
    assert "CERTIFICATE_VERIFY_FAILED" in done.stderr and "--cacert" in done.stderr


def test_too_little_disk_for_the_chosen_size_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    free_mib = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize >> 20
    done = kms_bench("--suites", "engine,copy", "--copy-sizes", str(free_mib * 2), "--out", str(out), timeout=60)
    assert done.returncode == Exit.DISK, done.stderr
    assert "the copy suite needs" in done.stderr and "--workdir" in done.stderr
    assert not out.exists()


def test_unknown_suite_is_a_usage_error() -> None:
    done = kms_bench("--suites", "engine,nope", timeout=60)
    assert done.returncode == Exit.USAGE and "unknown suite(s) nope" in done.stderr


def test_it_refuses_paths_it_did_not_create(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    precious = tmp_path / "mine" / "precious.txt"
    precious.write_text("keep me")
    done = kms_bench("--suites", "engine", "--quick", "--out", str(tmp_path / "out"), "--workdir",
                     str(tmp_path / "mine"), timeout=60)
    assert done.returncode == Exit.PATHS
    assert "not made by kms-bench" in done.stderr
    assert precious.read_text() == "keep me" and not (tmp_path / "out").exists()


def test_missing_fuse_privileges_are_reported(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kmsbench", "--suites", "copy", "--quick", "--out", str(out)]
    if os.geteuid() == 0:
        # A user namespace of its own makes it an unprivileged user (euid 65534) that can
        # still read this checkout: the check is about who runs it, not a flag.
        if subprocess.run(["unshare", "--user", "true"], capture_output=True, check=False).returncode != 0:
            pytest.skip("user namespaces are not available here to run as an unprivileged user")
        cmd = ["unshare", "--user", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == Exit.PRIVILEGES, done.stderr
    assert "need root" in done.stderr and "--suites engine,keyserver" in done.stderr
    assert not out.exists()


def test_quick_engine_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = kms_bench("--suites", "engine", "--quick", "--runs", "1", "--out", str(out))
    assert done.returncode == Exit.OK, done.stderr
    results = json.loads((out / "results.json").read_text())
    engine = results["suites"]["engine"]
    assert set(results["suites"]) == {"engine"} and "error" not in engine
    for chunk in ("4096", "65536"):
        figures = engine["raw"]["chunks"][chunk]
        for name in ("format_encrypt", "raw_encrypt", "format_decrypt", "raw_decrypt"):
            assert len(figures[name]) == 1 and figures[name][0] > 0
    assert results["machine"]["cpu"]["model"]
    text = (out / "report.md").read_text()
    assert "| test | raw EVP AES-GCM | format v1 (libsrcf) | change |" in text and "## Machine" in text
    assert (out / "charts" / "engine.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "report.html").exists()
    assert not (out / "work").exists() and not (out / MARKER).exists()


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for_mount(under: Path, proc: subprocess.Popen[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not mounts_under(under):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no guard point was mounted"
        time.sleep(0.1)


def _default_sigint() -> None:
    # A shell's background job ignores SIGINT, and the ignoring is inherited: give the
    # child the default disposition a terminal's Ctrl-C meets, whoever started pytest.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@root_only
def test_ctrl_c_unmounts_and_removes_everything_it_created(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # Its temporary directories in one of this test's own: /tmp is shared with the other
    # workers' runs, whose scratch directories come and go meanwhile.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "kmsbench", "--suites", "copy", "--quick", "--copy-sizes", "256",
                             "--runs", "20", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint, env={**os.environ, "TMPDIR": str(scratch)})
    try:
        _wait_for_mount(out, proc)
        time.sleep(1.0)  # inside a measurement, not just after the mount
        children = _descendants(proc.pid)
        assert children  # the guard point's server (and gocryptfs's daemon is not a child: it daemonises)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == Exit.INTERRUPTED, err
    assert "interrupted" in err
    assert mounts_under(tmp_path) == []
    assert not out.exists()
    assert list(scratch.iterdir()) == []
    # The guard point's server process ended with its mount.
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in children if _alive(p)]


def test_exit_codes_are_the_documented_ones() -> None:
    assert {e.name: int(e) for e in Exit} == {"OK": 0, "SUITE_FAILED": 1, "USAGE": 2, "PRIVILEGES": 3, "SERVICE": 4,
                                              "DISK": 5, "PATHS": 6, "INTERRUPTED": 130}
    doc = (Path(__file__).parents[2] / "docs" / "benchmarks.md").read_text()
    for e in Exit:
        assert f"| {int(e)} |" in doc, e.name
