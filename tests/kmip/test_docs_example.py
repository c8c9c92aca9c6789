"""The worked PyKMIP example in docs/kmip.md runs, as written, against a real listener
(only the host/port and certificate paths are pointed at the test's)."""

from __future__ import annotations

import re
from collections.abc import Callable

from keyserver.kmip.listener import KmipListener
from tests.conftest import REPO
from tests.kmip.conftest import ClientFiles

DOC = REPO / "docs" / "kmip.md"


def example_blocks() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("## A PyKMIP client"):]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_documented_example_runs(kmip_files: Callable[[str], ClientFiles],
                                     kmip_listener: KmipListener) -> None:
    files = kmip_files("key-officer")
    code = "\n".join(example_blocks())
    host_line = 'HOST, PORT = "localhost", 5696'
    paths_line = 'CERT, KEY, CA = "backup01/cert.pem", "backup01/key.pem", "backup01/ca.pem"'
    assert host_line in code and paths_line in code, "the example's set-up lines changed: update this test"
    code = code.replace(host_line, f'HOST, PORT = "localhost", {kmip_listener.port}')
    code = code.replace(paths_line, f"CERT, KEY, CA = {str(files.cert)!r}, {str(files.key)!r}, {str(files.ca)!r}")
    namespace: dict[str, object] = {"__name__": "kmip_example"}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    assert namespace["aes_key"] == namespace["key"].value  # type: ignore[attr-defined]
    assert len(namespace["private_der"]) > 1500  # type: ignore[arg-type]
