"""Benchmark commands rewrite only their own marked section of docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from kmsbench.keyserver_load import parse_wrk
from kmsbench.sections import write_section


def test_sections_are_replaced_in_place_and_prose_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "b.md"
    p.write_text("# Benchmarks\n\nhand-written prose\n")
    write_section(p, "first", name="kmip-bench")
    write_section(p, "A", name="keyserver-bench")
    write_section(p, "second", name="kmip-bench")
    text = p.read_text()
    assert "hand-written prose" in text and "first" not in text
    assert text.index("second") < text.index("A")  # replaced where it stood
    assert text.count("<!-- kmip-bench:start -->") == 1


def test_wrk_output_is_parsed() -> None:
    out = """Running 10s test @ http://127.0.0.1:8811/x
  Latency Distribution
     50%    1.93ms
     75%    3.10ms
     90%   12.00ms
     99%  233.40ms
  14541 requests in 10.01s, 7.27MB read
  Non-2xx or 3xx responses: 3
  Socket errors: connect 0, read 1, write 0, timeout 2
Requests/sec:   1452.69
"""
    assert parse_wrk(out) == (1452.69, 1.93, 233.4, 14541, 6)
