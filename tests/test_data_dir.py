"""The data directory from outside, with the real `keyserver` command (issue 25):

* a command that must not create anything (`verify-audit`, the KMIP client and KEK
  commands) refuses a directory that does not exist or holds no key server, and leaves
  it as it was — it used to make a new empty server and say "audit chain intact";
* every file the server makes is its user's only (0600, directories 0700), whatever the
  umask it was started with — the SQLite database used to be 0644;
* the HSM PINs can live outside the data directory: in the environment or in a systemd
  credential ($CREDENTIALS_DIRECTORY), with no PIN file written."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import own_store
from tests.serve import KEYSERVER, Server, free_port, server_env

pytestmark = [pytest.mark.store, pytest.mark.slow]


def run(env: dict[str, str], *args: str, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KEYSERVER, *args], env=env, capture_output=True, text=True, timeout=300, check=False,
                          preexec_fn=lambda: os.umask(umask))


def said(r: subprocess.CompletedProcess[str]) -> str:
    return " ".join((r.stdout + r.stderr).split())


def env_for(data: Path, url: str | None, **extra: str) -> dict[str, str]:
    return server_env(data, free_port(), **({"STRONGROOM_DATABASE_URL": url} if url else {}), **extra)


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.parametrize("command", [["verify-audit"], ["verify-audit", "--full"], ["kmip-client", "list"],
                                     ["rotate-kek"], ["retire-kek", "kek-1"]])
def test_commands_refuse_a_data_dir_without_a_key_server_and_create_nothing(tmp_path: Path,
                                                                           command: list[str]) -> None:
    missing = tmp_path / "nowhere"
    r = run(env_for(missing, None), *command)
    assert r.returncode == 1, said(r)
    assert f"the data directory {missing} does not exist" in said(r) and "STRONGROOM_DATA_DIR" in said(r)
    assert "intact" not in said(r) and not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(env_for(empty, None), *command)
    assert r.returncode == 1 and "holds no key server database" in said(r), said(r)
    assert tree(empty) == set()


def test_verify_audit_refuses_a_postgresql_database_without_a_key_server(tmp_path: Path) -> None:
    with own_store() as url:
        if url is None:
            pytest.skip("the embedded store has no database apart from its data directory (the test above)")
        data = tmp_path / "data"
        data.mkdir()
        env = env_for(data, url, STRONGROOM_HSM_USER_PIN="a-long-user-pin-6f1e2d",
                      STRONGROOM_HSM_SO_PIN="a-long-so-pin-9c8b7a")
        (data / "tokens").mkdir()
        r = run(env, "verify-audit")
        assert r.returncode == 1 and "holds no key server" in said(r), said(r)
        assert tree(data) == {"tokens"}


def _modes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in [root, *root.rglob("*")]}


def test_every_file_of_a_fresh_data_dir_is_private_whatever_the_umask(tmp_path: Path) -> None:
    with own_store() as url:
        data = tmp_path / "data"
        env = env_for(data, url)
        r = run(env, "init", umask=0o002)
        assert r.returncode == 0, said(r)
        # The database's -wal and -shm exist while the server has it open: look while it serves
        # (started with this test's umask, 022 or whatever it is).
        with Server(data, **({"STRONGROOM_DATABASE_URL": url} if url else {})) as server:
            assert server.client().get("/readyz").status_code == 200
            modes = _modes(data)
        assert modes["."] == "0o700"
        if url is None:
            assert {"strongroom.db", "strongroom.db-wal", "strongroom.db-shm", "hsm-pins.json"} <= set(modes)
        modes.pop("ca.pem")  # the CA's certificate is public on purpose (curl --cacert)
        loose = {name: mode for name, mode in modes.items()
                 if mode != ("0o700" if (data / name).is_dir() else "0o600")}
        assert not loose, loose
    # A database an older version left 0644 is narrowed at the next start.
    if url is None:
        (data / "strongroom.db").chmod(0o644)
        assert run(env, "verify-audit").returncode == 0
        assert _modes(data)["strongroom.db"] == "0o600"


def test_the_hsm_pins_from_the_environment_or_a_systemd_credential_and_no_pin_file(tmp_path: Path) -> None:
    with own_store() as url:
        data = tmp_path / "data"
        pins = {"STRONGROOM_HSM_USER_PIN": "user-pin-from-env-4711", "STRONGROOM_HSM_SO_PIN": "so-pin-from-env-0815"}
        r = run(env_for(data, url, **pins), "init")
        assert r.returncode == 0, said(r)
        assert not (data / "hsm-pins.json").exists()
        r = run(env_for(data, url, **pins), "verify-audit", "--full")
        assert r.returncode == 0 and "intact" in said(r), said(r)
        # A systemd credential: LoadCredential=hsm-user-pin:/etc/… puts it in $CREDENTIALS_DIRECTORY.
        creds = tmp_path / "credentials"
        creds.mkdir(mode=0o700)
        (creds / "hsm-user-pin").write_text(pins["STRONGROOM_HSM_USER_PIN"] + "\n")
        (creds / "hsm-so-pin").write_text(pins["STRONGROOM_HSM_SO_PIN"])
        r = run(env_for(data, url, CREDENTIALS_DIRECTORY=str(creds)), "verify-audit", "--full")
        assert r.returncode == 0 and "intact" in said(r), said(r)
        assert not (data / "hsm-pins.json").exists()
        # Neither: refused, and no PIN file is made up beside the token.
        r = run(env_for(data, url), "verify-audit")
        assert r.returncode == 1 and "holds no HSM PINs" in said(r), said(r)
        assert not (data / "hsm-pins.json").exists()
        # The credential is what opens the token: a wrong one does not.
        (creds / "hsm-user-pin").write_text("not-the-pin")
        r = run(env_for(data, url, CREDENTIALS_DIRECTORY=str(creds)), "verify-audit")
        assert r.returncode == 4, said(r)
