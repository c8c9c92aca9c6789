"""A throwaway openCryptoki soft token, in namespaces of its own, for the second-token tests.

openCryptoki 3.8 has its paths compiled in: the slot configuration
(/etc/opencryptoki/opencryptoki.conf), the token store (/var/lib/opencryptoki/<tokname>),
the slot daemon's socket and pid file (/run/pkcsslotd.*), its lock directory
(/run/lock/opencryptoki) and System V shared memory. None of them can be pointed at a
temporary directory by an environment variable, and the client library talks to a
`pkcsslotd` that must be running as root. So instead of touching the machine's own
openCryptoki state, the command runs in new mount, IPC and PID namespaces (`unshare`,
root only) where those paths are bind mounts of a fresh temporary directory:

    python -m tests.hsm.opencryptoki_sandbox -- pytest -q tests/hsm/second_token_suite.py

Inside, `pkcsslotd` is started, slot 0 is an openCryptoki soft token
(`libpkcs11_sw.so`) whose store is empty, the token is initialised with `pkcsconf` (label
`strongroom-ock`, the vendor default SO PIN, then a random SO PIN of 8 characters — the
soft token's maximum), and the command runs with `STRONGROOM_TEST_OCK_*` describing it.
The user PIN is left for the key server to set (`C_InitPIN` in `hsm.pkcs11.open_backend`).
When the command ends, the namespace's first process exits and the kernel kills every
process left in the PID namespace, `pkcsslotd` included: nothing survives a run, and the
temporary directory is removed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

MODULE: Final = "/usr/lib/x86_64-linux-gnu/opencryptoki/libopencryptoki.so.0"
SLOTD: Final = "/usr/sbin/pkcsslotd"
PKCSCONF: Final = "/usr/sbin/pkcsconf"
LABEL: Final = "strongroom-ock"
# openCryptoki's documented factory SO PIN (pkcsconf(1)); replaced before anything runs.
VENDOR_SO_PIN: Final = "87654321"
GROUP: Final = "pkcs11"

_CONF = """version opencryptoki-3.1

slot 0
{
stdll = libpkcs11_sw.so
tokname = swtok
}
"""


def missing() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if os.geteuid() != 0:
        return "openCryptoki's pkcsslotd and the namespaces need root"
    for path in (MODULE, SLOTD, PKCSCONF):
        if not Path(path).exists():
            return f"{path} is missing: apt-get install opencryptoki (scripts/bootstrap.sh)"
    if shutil.which("unshare") is None:
        return "unshare(1) is missing (util-linux)"
    return None


def run(command: list[str], *, env: dict[str, str] | None = None, timeout: float = 1800) -> int:
    """Run `command` next to a fresh openCryptoki soft token; its exit status."""
    reason = missing()
    if reason is not None:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory(prefix="strongroom-ock-") as state:
        inner = [sys.executable, "-m", "tests.hsm.opencryptoki_sandbox", "--inner", state, "--", *command]
        # --kill-child: if this process dies, the namespace's first process is killed,
        # and with it (PID namespace) pkcsslotd and anything else left inside.
        unshare = ["unshare", "--mount", "--ipc", "--pid", "--fork", "--kill-child",
                   "--propagation", "private", *inner]
        return subprocess.run(unshare, env=env, timeout=timeout, check=False).returncode


def _random_pin() -> str:
    while True:
        pin = secrets.token_hex(4)  # 8 characters: the soft token accepts 4..8
        if pin != VENDOR_SO_PIN and not pin.isdigit():
            return pin


def _sh(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(list(args), input=stdin, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")
    return done.stdout


def _inner(state: Path, command: list[str]) -> int:
    etc, store, run = state / "etc", state / "lib", state / "run"
    etc.mkdir()
    (etc / "opencryptoki.conf").write_text(_CONF)
    (store / "swtok" / "TOK_OBJ").mkdir(parents=True)
    run.mkdir()
    for path in (store, store / "swtok", store / "swtok" / "TOK_OBJ"):
        shutil.chown(path, group=GROUP)
        path.chmod(0o770)
    _sh("mount", "--bind", str(etc), "/etc/opencryptoki")
    _sh("mount", "--bind", str(store), "/var/lib/opencryptoki")
    # The daemon's socket and pid file live directly in /run: a private tmpfs there.
    _sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
    lock = Path("/run/lock/opencryptoki")
    lock.mkdir(parents=True)
    shutil.chown(lock, group=GROUP)
    lock.chmod(0o770)
    _sh(SLOTD)
    for _ in range(100):  # it daemonises; wait for its socket
        if Path("/run/pkcsslotd.socket").exists():
            break
        time.sleep(0.05)
    else:
        raise RuntimeError("pkcsslotd did not create /run/pkcsslotd.socket")

    so_pin = _random_pin()
    _sh(PKCSCONF, "-I", "-c", "0", "-S", VENDOR_SO_PIN, stdin=f"{LABEL}\n")
    _sh(PKCSCONF, "-P", "-c", "0", "-S", VENDOR_SO_PIN, "-n", so_pin)
    user_pin = _random_pin()
    while user_pin == so_pin:
        user_pin = _random_pin()
    env = dict(os.environ)
    env.update({
        "STRONGROOM_TEST_OCK_MODULE": MODULE,
        "STRONGROOM_TEST_OCK_LABEL": LABEL,
        "STRONGROOM_TEST_OCK_SO_PIN": so_pin,
        "STRONGROOM_TEST_OCK_USER_PIN": user_pin,
    })
    return subprocess.run(command, env=env, check=False).returncode


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "--inner" and argv[2] == "--":
        return _inner(Path(argv[1]), argv[3:])
    if argv and argv[0] == "--":
        return run(argv[1:])
    print("usage: python -m tests.hsm.opencryptoki_sandbox -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
