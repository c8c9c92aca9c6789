"""The report from a fixed results.json (recorded from real --quick runs on the
reference machine): tables in the seeds' shape, change computed from the medians of
the raw repetitions, PNG charts, HTML, and the rewrite of docs/benchmarks.md."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kmsbench import report
from kmsbench.docs import update

DATA = Path(__file__).parent / "data" / "results.json"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def results() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DATA.read_text())
    return loaded


def test_change_is_the_ratio_of_medians_of_the_raw_repetitions(results: dict[str, Any]) -> None:
    tables = {t.suite: t for t in report.tables(results)}
    assert list(tables) == ["engine", "copy", "concurrent", "oltp", "keyserver", "kmip", "rotation"]
    copy = results["suites"]["copy"]["raw"]["256"]
    write = tables["copy"].rows[0]
    assert write.label == "write 256 MiB"
    plain = statistics.median(r[0] for r in copy["plain"])
    protected = statistics.median(r[0] for r in copy["guard point"])
    assert write.change == pytest.approx(protected / plain - 1)
    assert write.vs_peer == pytest.approx(protected / statistics.median(r[0] for r in copy["gocryptfs"]))
    tpcb = tables["oltp"].rows[0]
    raw = results["suites"]["oltp"]["raw"]["TPC-B-like"]
    assert tpcb.change == pytest.approx(statistics.median(raw["guard point"]) / statistics.median(raw["plain"]) - 1)


def test_markdown_has_the_seeds_shape_and_the_machine(results: dict[str, Any]) -> None:
    text = report.markdown(results, {"copy": "charts/copy.png"})
    assert "| test | plain directory | guard point | change | gocryptfs | guard point / gocryptfs |" in text
    assert "| test | plain directory | guard point | change |" in text  # concurrent, oltp
    assert "| CPU flags | AES yes" in text
    assert "| Benchmark directory |" in text
    rows = report.table_rows(report.copy_table(results["suites"]["copy"]))[1]
    write = rows[0]
    assert write[0] == "write 256 MiB" and write[3].endswith("%") and write[3][0] in "+-"
    assert "(" in write[1] and "-" in write[1]  # median (min-max)
    assert "![copy](charts/copy.png)" in text
    assert "Reader errors over the whole suite: **0**" in text
    headline = report.headline_rows(report.tables(results))[1]
    assert {r[0] for r in headline} >= {"copy: write 256 MiB", "oltp: pgbench select-only",
                                        "rotation: reader during re-key"}


def test_report_files_and_charts_are_written(results: dict[str, Any], tmp_path: Path) -> None:
    files = report.write(results, tmp_path)
    charts = sorted(p.name for p in (tmp_path / "charts").iterdir())
    assert charts == sorted(f"{s}.png" for s in [*results["suites"], "headline"])
    for png in (tmp_path / "charts").iterdir():
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000
    html = files["report.html"].read_text()
    assert html.count("<table>") >= 8 and "<img src='charts/engine.png'" in html
    assert "<strong>0</strong>" in html


def test_a_failed_suite_is_reported_not_hidden(results: dict[str, Any]) -> None:
    results["suites"]["oltp"] = {"error": "initdb failed: disk full", "seconds": 3.0}
    text = report.markdown(results, {})
    assert "## Suites that failed" in text and "initdb failed: disk full" in text
    assert "OLTP: pgbench" not in text


def test_docs_sections_are_rewritten_and_prose_kept(results: dict[str, Any], tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nhand-written prose\n\n<!-- engine-bench:start -->\nold\n<!-- engine-bench:end -->\n"
                   "\nReading it: more prose\n")
    files = report.write(results, tmp_path / "out")
    update(doc, results, {k: v for k, v in files.items() if v.suffix == ".png"})
    text = doc.read_text()
    assert "hand-written prose" in text and "Reading it: more prose" in text and "\nold\n" not in text
    for name in ("kms-bench", "engine-bench", "guardpoint-copy-bench", "guardpoint-concurrent-bench",
                 "guardpoint-oltp-bench", "keyserver-bench", "kmip-bench"):
        assert text.count(f"<!-- {name}:start -->") == 1, name
    assert "![copy](benchmarks/kms-bench/copy.png)" in text
    assert (tmp_path / "benchmarks" / "kms-bench" / "headline.png").read_bytes()[:8] == PNG


def test_the_command_rebuilds_a_report_from_results(tmp_path: Path) -> None:
    out = tmp_path / "again"
    done = subprocess.run([sys.executable, "-m", "kmsbench", "--from-results", str(DATA), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert (out / "report.md").read_text().startswith("# kms-bench report")
    assert (out / "charts" / "headline.png").exists()


def test_readme_headline_is_rewritten_in_place(results: dict[str, Any], tmp_path: Path) -> None:
    from kmsbench.docs import update_readme

    readme = tmp_path / "README.md"
    readme.write_text("# P\n\n## Benchmarks\n\n<!-- kms-bench-headline:start -->\nold\n"
                      "<!-- kms-bench-headline:end -->\n\n## Status\n")
    update_readme(readme, results)
    text = readme.read_text()
    assert "old" not in text and text.index("| copy: write 256 MiB |") < text.index("## Status")
    assert "| figure | unit | baseline | baseline value | protected / ours | change |" in text


def test_a_suite_rerun_on_its_own_is_merged_and_said_so(results: dict[str, Any]) -> None:
    from kmsbench.cli import merge

    first = {**results, "started": "T1", "suites": {**results["suites"], "kmip": {"error": "no slots"}}}
    again = {**results, "started": "T2", "suites": {"kmip": results["suites"]["kmip"]}}
    merged = merge([first, again])
    assert "error" not in merged["suites"]["kmip"] and merged["suites"]["copy"]["run_started"] == "T1"
    assert "re-run on its own: kmip (T2)" in report.run_line(merged)
