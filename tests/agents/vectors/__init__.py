"""One loader for every known-answer file in this folder (`[name]` blocks of `Key = hex`)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


def load(name: str) -> list[dict[str, bytes | str]]:
    cases: list[dict[str, bytes | str]] = []
    for line in (HERE / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            cases.append({"name": line.strip("[]")})
            continue
        field, _, value = line.partition("=")
        cases[-1][field.strip()] = bytes.fromhex(value.strip())
    return cases
