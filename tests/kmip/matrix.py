"""The per-client interop matrix of docs/kmip.md, produced by tests/kmip/test_appliances.py.

Each appliance test records its steps as it runs them (`Run.step`), and at its end checks
that its row in docs/kmip.md, between the markers, is the row it produced: a change to a
sequence without regenerating the table fails that test. `scripts/kmip_matrix.py` runs
the tests with STRONGROOM_KMIP_MATRIX set to a JSON file (each run appends its outcome,
failed steps included) and rewrites the table from it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "kmip.md"
START, END = "<!-- interop-matrix:start -->", "<!-- interop-matrix:end -->"
HEADER = ("| client (test) | KMIP | sequence, as the test sends it | TLS | outcome |\n"
          "|---|---|---|---|---|")
ENV = "STRONGROOM_KMIP_MATRIX"


@dataclass
class Run:
    client: str
    test: str
    version: str
    steps: list[str] = field(default_factory=list)
    tls: str = "new session per connection"
    failed_at: str | None = None

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        """One step: recorded when it passed; a failure is recorded (and re-raised)."""
        try:
            yield
        except BaseException:
            self.failed_at = text
            _save(self)
            raise
        self.steps.append(text)

    def row(self) -> str:
        outcome = f"**fails** at: {self.failed_at}" if self.failed_at else f"passes ({len(self.steps)} steps)"
        steps = " → ".join(self.steps).replace("|", "\\|")  # a Markdown cell
        return (f"| {self.client} (`{self.test}`) | {self.version} | {steps} | {self.tls} "
                f"| {outcome} |")

    def finish(self) -> None:
        """Record the passed run, then check docs/kmip.md holds exactly this row for it."""
        _save(self)
        rows = committed_rows()
        mine = [r for r in rows if f"(`{self.test}`)" in r]
        assert mine == [self.row()], (
            f"docs/kmip.md's interop matrix row for {self.test} is not what the test produced; "
            f"run .venv/bin/python scripts/kmip_matrix.py\n  committed: {mine}\n  produced:  {self.row()}")


def _save(run: Run) -> None:
    out = os.environ.get(ENV)
    if not out:
        return
    path = Path(out)
    runs = json.loads(path.read_text()) if path.exists() else []
    runs = [r for r in runs if r["test"] != run.test] + [asdict(run)]
    path.write_text(json.dumps(runs, indent=1))


def block(text: str) -> str:
    match = re.search(re.escape(START) + r"\n(.*?)" + re.escape(END), text, re.S)
    assert match, f"docs/kmip.md lacks the markers {START} … {END}"
    return match.group(1)


def committed_rows() -> list[str]:
    return [line for line in block(DOCS.read_text()).splitlines() if line.startswith("| ") and "(`" in line]


def render(runs: list[dict[str, object]], order: list[str]) -> str:
    by_test = {str(r["test"]): r for r in runs}
    rows = [Run(**by_test[t]).row() for t in order if t in by_test]  # type: ignore[arg-type]
    return HEADER + "\n" + "\n".join(rows) + "\n"


def replace(text: str, table: str) -> str:
    return text.replace(START + "\n" + block(text) + END, START + "\n" + table + END)
