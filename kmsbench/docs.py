"""Writing a run into docs/benchmarks.md: the kms-bench section (headline, tables,
charts under docs/benchmarks/) and, from the same run, each benchmark module's own
marked section, so that one run regenerates every figure of the document."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

from kmsbench import report
from kmsbench.sections import write_section


def _kmip_median(raw: dict[str, Any], connections: list[int]) -> dict[str, Any]:
    runs = raw["runs"]
    merged = {**runs[-1], "servers": {}}
    for server in ("strongroom", "pykmip"):
        merged["servers"][server] = {
            op: {str(n): round(statistics.median(float(r["servers"][server][op][str(n)]) for r in runs), 1)
                 for n in connections} for op in ("get", "create")}
    return merged


def module_sections(results: dict[str, Any]) -> dict[str, str]:
    """{marker name: Markdown} rendered by each module's own renderer."""
    suites = {k: v for k, v in results["suites"].items() if "raw" in v}
    out: dict[str, str] = {}
    if "engine" in suites:
        from kmsbench.engine import render

        out["engine-bench"] = render(suites["engine"]["raw"])
    if "copy" in suites:
        from kmsbench.guardpoint import render as render_copy

        raw = suites["copy"]["raw"]
        out["guardpoint-copy-bench"] = "\n\n".join(
            render_copy(by, size_mib=int(size), runs=len(by["plain"])) for size, by in raw.items())
    if "concurrent" in suites:
        from kmsbench.guardpoint import render_concurrent

        s = suites["concurrent"]
        out["guardpoint-concurrent-bench"] = render_concurrent(
            s["raw"], threads=s["params"]["threads"], files=s["params"]["files_per_thread"],
            runs=len(s["raw"]["plain"]))
    if "oltp" in suites:
        from kmsbench.guardpoint_oltp import render_oltp

        s = suites["oltp"]
        out["guardpoint-oltp-bench"] = render_oltp(
            s["raw"], scale=s["params"]["scale"], seconds=s["params"]["seconds"], clients=s["params"]["clients"],
            runs=len(next(iter(s["raw"].values()))["plain"]))
    if "keyserver" in suites and "hsm_1_thread" in suites["keyserver"]["raw"]:
        from kmsbench.keyserver_load import render as render_keyserver

        out["keyserver-bench"] = render_keyserver(suites["keyserver"]["raw"])
    if "kmip" in suites:
        from kmsbench.kmip_load import render as render_kmip

        conns = [int(c) for c in suites["kmip"]["params"]["connections"]]
        out["kmip-bench"] = render_kmip(_kmip_median(suites["kmip"]["raw"], conns), conns)
    return out


def update(doc: Path, results: dict[str, Any], charts: dict[str, Path]) -> None:
    """Rewrite the marked sections of `doc`; the charts are copied to
    <doc dir>/benchmarks/kms-bench/ and linked relative to the document."""
    target = doc.parent / "benchmarks" / "kms-bench"
    target.mkdir(parents=True, exist_ok=True)
    rel: dict[str, str] = {}
    for name, path in charts.items():
        shutil.copyfile(path, target / path.name)
        rel[name] = f"benchmarks/kms-bench/{path.name}"
    # The suites with a module section of their own get their tables there (with the
    # module's extra columns and the prose about them); the others are written out here.
    sections = module_sections(results)
    covered = {"engine": "engine-bench", "copy": "guardpoint-copy-bench", "concurrent": "guardpoint-concurrent-bench",
               "oltp": "guardpoint-oltp-bench", "keyserver": "keyserver-bench", "kmip": "kmip-bench"}
    detail = {suite for suite in results["suites"] if covered.get(suite) not in sections}
    body = report.markdown(results, rel, heading_level=2, detail=detail).split("\n", 2)[2]  # the doc has a heading
    write_section(doc, body.strip(), name="kms-bench", heading="## kms-bench: the whole run")
    from kmsbench.engine import HEADING as ENGINE_HEADING
    from kmsbench.guardpoint import SECTIONS

    headings = {"engine-bench": ENGINE_HEADING, **{name: heading for name, heading in SECTIONS.values()}}
    for name, text in sections.items():
        write_section(doc, text, name=name, heading=headings.get(name, ""))


def update_readme(readme: Path, results: dict[str, Any]) -> None:
    """The README's headline table (its marked section), from the same run."""
    ts = report.tables(results)
    header, rows = report.headline_rows(ts)
    m = results["machine"]
    lines = [f"{report.run_line(results)} Machine: {m['cpu']['model']}, {m['cpu']['cores']} cores, "
             f"{m['memory_gib']} GiB, {m['disk']['fstype']} on {m['disk']['device']}.", "",
             *report.md_table(header, rows)]
    write_section(readme, "\n".join(lines), name="kms-bench-headline")
