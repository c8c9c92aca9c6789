"""Writing a benchmark's marked section into a Markdown file (docs/benchmarks.md, the
README's headline), for every benchmark command of this package."""

from __future__ import annotations

import re
from pathlib import Path


def write_section(path: Path, report: str, *, name: str, heading: str = "") -> None:
    """Replace the `<!-- NAME:start -->` ... `<!-- NAME:end -->` block (appended, after
    `heading`, when absent), leaving the prose around it as people wrote it."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{report}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + (heading + "\n\n" if heading else "") + block + "\n"
    path.write_text(text)
