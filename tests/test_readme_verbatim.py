"""The README's "Rotate a key from a script", run exactly as written: its marked shell
blocks (`<!-- verbatim: NAME -->` right before the fence), in the README's order, in one
`bash -euo pipefail`, against a fresh `keyserver serve` as `./scripts/start` runs it (the
embedded default). The README addresses https://127.0.0.1:8800 and ./data/ca.pem, so the
server listens there, with its data directory in the script's working directory; the
only environment the script gets beyond this process's own is what the README tells the
reader to export."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve import Server

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = ("rotate", "audit-verify")  # in the README's order
PORT = 8800  # the README's address
MARKED = re.compile(r"<!-- verbatim: ([a-z0-9-]+) -->\n```sh\n(.*?)\n```\n", re.DOTALL)


def readme_blocks(text: str) -> dict[str, str]:
    """Every marked block, by name, in the order it appears."""
    return {name: body for name, body in MARKED.findall(text)}


def test_the_marked_blocks_are_there_and_found_exactly() -> None:
    blocks = readme_blocks(README.read_text())
    assert list(blocks) == list(BLOCKS), "README.md's `<!-- verbatim: NAME -->` blocks moved, vanished or multiplied"
    assert README.read_text().count("<!-- verbatim:") == len(BLOCKS), "a marker without a ```sh block right after it"
    # The reader supplies these two values in a line of their own just above the blocks.
    assert re.search(r"^export ONE_TIME='[^']*'\s+NEW_PASSWORD='[^']*'$", README.read_text(), re.MULTILINE)
    assert readme_blocks("<!-- verbatim: x -->\n```sh\necho 1\n```\n") == {"x": "echo 1"}
    assert readme_blocks("<!-- verbatim: x -->\n\n```sh\necho 1\n```\n") == {}, "the fence right after"


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[tuple[Path, Server]]:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", PORT))
        except OSError as exc:
            pytest.fail(f"127.0.0.1:{PORT}, the README's address, is taken ({exc}): stop what listens there")
    server = Server(tmp_path / "data", STRONGROOM_PORT=str(PORT))  # the setting wins over Server's free port
    server.port, server.url = PORT, f"https://127.0.0.1:{PORT}"
    with server:
        yield tmp_path, server


@pytest.mark.slow
def test_rotate_a_key_from_a_script_as_the_readme_says(workdir: tuple[Path, Server]) -> None:
    cwd, server = workdir
    assert server.env["STRONGROOM_PORT"] == str(PORT) and (cwd / "data" / "ca.pem").exists()
    # What the first start hands over when its output is not a terminal (as here).
    username, one_time = (server.data / "first-run-admin-password").read_text().split()
    assert username == "admin"
    new_password = f"my own passphrase {secrets.token_urlsafe(12)}"
    script = "\n".join(readme_blocks(README.read_text())[name] for name in BLOCKS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRONGROOM_", "CURL_"))}
    env.update(ONE_TIME=one_time, NEW_PASSWORD=new_password)  # the README's `export` line
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"

    # What the reader sees: one JSON answer per line, the rotation's and the verification's last.
    answers = [json.loads(line) for line in run.stdout.splitlines()]
    assert [a.get("name") for a in answers[2:4]] == ["payments-db", "payments-db"], run.stdout
    assert answers[2]["current_version"] == 1 and answers[3]["current_version"] == 2
    assert answers[-1]["ok"] is True and answers[-1]["first_broken_seq"] is None, answers[-1]

    # And what the server holds: the password is the reader's own, the key at version 2,
    # rotated by the token, whose scopes are the README's.
    with httpx.Client(base_url=server.url, verify=server.tls(), timeout=30) as web:
        r = web.post("/api/v1/auth/login", json={"username": "admin", "password": new_password})
        assert r.status_code == 200 and not r.json()["user"]["must_change_password"], r.text
        assert web.get("/api/v1/keys/payments-db").json()["current_version"] == 2
        tokens = web.get("/api/v1/tokens").json()
        bot = [t for t in tokens if t["name"] == "rotation-bot"]
        assert len(bot) == 1 and sorted(bot[0]["scopes"]) == ["keys:read", "keys:rotate"], tokens
        web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
        events = web.get("/api/v1/audit/events", params={"action": "key.rotate", "limit": 10}).json()["items"]
        assert [(e["actor_type"], e["outcome"]) for e in events] == [("token", "allowed")], events
