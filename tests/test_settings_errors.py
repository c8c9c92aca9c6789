"""A bad STRONGROOM_* value is said in one line per setting (the variable, what is
wrong, the form expected) and exits 2: never pydantic's dump."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from keyserver.settings import Settings, SettingsInvalid
from tests.kmip.test_serve import KEYSERVER


def test_each_bad_setting_is_one_line_with_its_expected_form() -> None:
    with pytest.raises(SettingsInvalid) as bad:
        Settings(kmip_client_cert_days="abc", port="99999", environment="prod",
                 audit_checkpoint_seconds="-1")
    assert sorted(bad.value.problems) == [
        "STRONGROOM_AUDIT_CHECKPOINT_SECONDS='-1': too small (it must be above 0); expected a number above 0",
        "STRONGROOM_ENVIRONMENT='prod': not one of the allowed values; expected one of local, production",
        "STRONGROOM_KMIP_CLIENT_CERT_DAYS='abc': not a whole number; expected a whole number from 1 to 3650",
        "STRONGROOM_PORT='99999': too large (it must be at most 65535); expected a whole number from 1 to 65535",
    ]


def test_a_secret_is_not_repeated_and_bad_json_is_named() -> None:
    with pytest.raises(SettingsInvalid) as bad:
        Settings(hsm_user_pin=["1234"])
    (line,) = bad.value.problems
    assert line.startswith("STRONGROOM_HSM_USER_PIN: ") and "1234" not in line


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("STRONGROOM_KMIP_CLIENT_CERT_DAYS", "ten",
     "STRONGROOM_KMIP_CLIENT_CERT_DAYS='ten': not a whole number; expected a whole number from 1 to 3650"),
    ("STRONGROOM_APPROVALS", "{key.destroy: 2",
     'STRONGROOM_APPROVALS: not valid JSON; expected a JSON object, e.g. {"name": value}'),
])
def test_the_command_says_it_in_one_line_and_exits_2(tmp_path: Path, variable: str, value: str, said: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRONGROOM_", "SOFTHSM2_CONF"))}
    env.update({"STRONGROOM_DATA_DIR": str(tmp_path / "data"), variable: value, "COLUMNS": "200"})
    for command in (["kmip-client", "list"], ["serve"]):
        r = subprocess.run([KEYSERVER, *command], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert r.stderr.strip() == said, command
        assert "pydantic" not in r.stderr and "validation error" not in r.stderr
    assert not (tmp_path / "data").exists()  # nothing was made on the way to the refusal
