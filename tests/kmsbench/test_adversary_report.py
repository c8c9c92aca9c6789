"""`kms-bench adversary`: the command is reachable from kms-bench, and its report is one
table with a row per attack, written into its own marked section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kmsbench.adversary import ATTACKS, HEADING, SECTION, render
from kmsbench.sections import write_section


def result(attack: str, peak: float) -> dict[str, object]:
    return {"attack": attack, "rss_before_mib": 140.0, "rss_peak_mib": peak, "rss_after_mib": 141.0,
            "http_p50_ms": 2.0, "http_p99_ms": 9.5, "http_errors": 0, "kmip_p50_ms": 5.0, "kmip_p99_ms": 12.0,
            "kmip_errors": 0, "http_n": 300, "kmip_n": 50}


def test_the_report_has_a_row_per_attack_and_the_note(tmp_path: Path) -> None:
    report = {"machine": {"cpu": "CPU", "cores": 2, "memory_gib": 24, "python": "3.11"}, "when": "2026-11-26",
              "results": [result("none", 140), result("chunked-rest", 152)], "note": "the machine was busy"}
    text = render(report)
    assert "| none | 140 MiB | 140 MiB (+0) |" in text
    assert "| chunked-rest | 140 MiB | 152 MiB (+12) |" in text and "the machine was busy" in text
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nprose\n")
    write_section(doc, text, name=SECTION, heading=HEADING)
    write_section(doc, text, name=SECTION, heading=HEADING)
    written = doc.read_text()
    assert written.count(HEADING) == 1 and written.count(f"<!-- {SECTION}:start -->") == 1 and "prose" in written


def test_every_attack_of_issue_25_is_there_and_the_command_runs() -> None:
    assert {"none", "chunked-rest", "chunked-agent", "endless-headers", "slow-headers", "pre-tls"} <= set(ATTACKS)
    assert any(a.startswith("kmip-pre-tls") for a in ATTACKS) and any(a.startswith("kmip-idle") for a in ATTACKS)
    done = subprocess.run([sys.executable, "-m", "kmsbench", "adversary", "--help"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "kms-bench adversary" in done.stdout and "--attack" in done.stdout
