"""`kms-bench keyserver --scaling`: the targets are judged from the run's own figures."""

from __future__ import annotations

from typing import Any

from kmsbench.keyserver_load import render_scaling, verdicts


def _load(rps: float, p99: float, *, think: int = 0, errors: int = 0) -> dict[str, Any]:
    return {"clients": 200, "think_ms": think, "rps": [rps * 0.9, rps, rps * 1.1], "p50_ms": [5.0] * 3,
            "p99_ms": [p99] * 3, "errors": [errors, 0, 0], "requests": [1000] * 3}


def _run(pg_rps: float, pg_p99: float, emb_rps: float, *, errors: int = 0) -> dict[str, Any]:
    return {"machine": {"cpu": "test", "cores": 2, "memory_gib": 1, "kernel": "k", "python": "3"},
            "when": "now", "duration_s": 10, "repeats": 3, "rows": [
                {"label": "PostgreSQL, 2 workers", "workers": 2, "store": "postgresql",
                 "http": [_load(pg_rps, 300), _load(900, pg_p99, think=190, errors=errors)]},
                {"label": "embedded SQLite, 1 worker", "workers": 1, "store": "sqlite",
                 "http": [_load(emb_rps, 300), _load(700, 150, think=190)]}]}


def test_targets_met() -> None:
    lines = verdicts(_run(1500, 80, 900))
    assert lines[0].startswith("* **≥ 1,000 data keys/s") and "met —" in lines[0]
    assert "met —" in lines[1] and "1.67x" in lines[1]


def test_each_target_can_be_missed() -> None:
    assert "missed" in verdicts(_run(900, 80, 800))[0]  # throughput
    assert "missed" in verdicts(_run(1500, 120, 800))[0]  # p99 under the virtual users
    assert "missed" in verdicts(_run(1500, 80, 800, errors=1))[0]  # errors
    assert "missed" in verdicts(_run(1500, 80, 700))[1]  # embedded more than 2x slower


def test_the_report_has_a_row_per_configuration_and_links_the_chart() -> None:
    text = render_scaling(_run(1500, 80, 900), "benchmarks/keyserver-scaling.png")
    assert "| PostgreSQL, 2 workers | 1,500 (1350-1650) |" in text
    assert "| embedded SQLite, 1 worker |" in text
    assert text.rstrip().endswith("(benchmarks/keyserver-scaling.png)")
