"""`kms-bench audit` end to end at a small size: a real scratch database and token, a
chain built, verified in full and incrementally, and the report's table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_audit_bench_builds_verifies_and_reports_a_chain(tmp_path: Path) -> None:
    out, doc = tmp_path / "audit.json", tmp_path / "benchmarks.md"
    r = subprocess.run([sys.executable, "-m", "kmsbench", "audit", "--records", "2000", "--json", str(out),
                        "--output", str(doc)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["verified_records"] >= 2000 and result["verify_incremental_records"] >= 1000
    assert result["checkpoints"] >= 2 and result["chain_rate"] > 0 and result["datakey_ms_median"] > 0
    # The console's reads were made over HTTP against that chain, from its hourly counts.
    reads = result["console_reads"]
    assert set(reads) >= {"activity, 24 hours by hour", "activity, 30 days by day", "audit log, denied only"}
    assert all(0 < v["p50_ms"] <= v["p95_ms"] for v in reads.values())
    assert result["rollup_rows"] > 0
    text = doc.read_text()
    assert "<!-- audit-bench:start -->" in text and "`verify-audit --full` of the whole chain" in text
    assert "| activity, 30 days by day |" in text
