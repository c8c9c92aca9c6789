"""Engine benchmark of the file format (docs/benchmarks.md, "File format engine").

In memory, one thread: the compiled engine (libsrcf, what the guard points' data plane
and the CLI run) sealing and opening 1 MiB runs of chunks exactly as the format does
(fresh nonce, associated data, the "last" flag), against the bare primitive in the same
C process (EVP AES-256-GCM, one call per chunk, nothing of the format around it:
agents/dataplane/bench/bench_srcf.c); `openssl speed -evp aes-256-gcm` and the Python
reference (`cryptfile.chunks`, whose `cryptography` wheel bundles its own, newer
OpenSSL) beside them. All in one run:
`python -m kmsbench.engine [--output docs/benchmarks.md]` (`kms-bench --suites engine` runs
the same measurement inside a whole report).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.cryptfile.chunks import CHUNK_OVERHEAD, ChunkCipher
from kmsbench.sections import write_section

TOTAL = 64 << 20  # bytes processed per measurement


def _rate(fn: Callable[[], None], total: int) -> float:
    start = time.perf_counter()
    fn()
    return total / (time.perf_counter() - start) / 1e6


def measure(chunk: int) -> dict[str, float]:
    """MB/s of the Python reference (python_*)."""
    count = TOTAL // chunk
    run = max(1, (1 << 20) // chunk)  # chunks per run: one 1 MiB request of the data plane
    plain_run = os.urandom(chunk * run)
    out = bytearray((chunk + CHUNK_OVERHEAD) * run)
    key_bytes, file_id = os.urandom(32), os.urandom(16)
    figures: dict[str, float] = {}
    cipher = ChunkCipher(key_bytes, file_id)
    view = memoryview(out)
    sealed = [cipher.seal(i, plain_run[:chunk], last=False) for i in range(16)]

    def python_encrypt() -> None:
        for r in range(count // run):
            cipher.seal_run(r * run, plain_run, chunk, view, final_index=None)

    def python_decrypt() -> None:
        for i in range(count):
            cipher.open(i % 16, sealed[i % 16], last=False)

    figures["python_encrypt"] = _rate(python_encrypt, TOTAL)
    figures["python_decrypt"] = _rate(python_decrypt, TOTAL)
    return figures


DATAPLANE = Path(__file__).resolve().parent.parent / "agents" / "dataplane"
_ROW = re.compile(r"^\|\s*(\d+) KiB \| (encrypt|decrypt) \| ([\d.]+) \([^)]*\) \| ([\d.]+) ", re.M)


def compiled(total_mib: int) -> dict[str, dict[str, float]] | None:
    """One measurement of the compiled engine against raw EVP AES-256-GCM, both in the
    same C process (agents/dataplane/bench/bench_srcf.c: 1 MiB runs of chunks vs one
    EVP call per chunk with a fixed IV and no associated data); None without a C
    toolchain. {chunk: {format_encrypt, raw_encrypt, format_decrypt, raw_decrypt}}."""
    program = DATAPLANE / "build" / "bench_srcf"
    if subprocess.run(["make", "-s", "-C", str(DATAPLANE), "build/bench_srcf"], capture_output=True,
                      check=False).returncode != 0 or not program.exists():
        return None
    out = subprocess.run([str(program), "--total", str(total_mib), "--repeats", "1"], capture_output=True,
                         text=True, check=False).stdout
    by_chunk: dict[str, dict[str, float]] = {}
    for kib, op, ours, raw in _ROW.findall(out):
        figures = by_chunk.setdefault(str(int(kib) * 1024), {})
        figures[f"format_{op}"], figures[f"raw_{op}"] = float(ours), float(raw)
    return by_chunk or None


def openssl(chunk: int, *, decrypt: bool, seconds: int = 2) -> float | None:
    """MB/s of `openssl speed -evp aes-256-gcm` at this buffer size, None without openssl."""
    if shutil.which("openssl") is None:
        return None
    args = ["openssl", "speed", "-evp", "aes-256-gcm", "-bytes", str(chunk), "-seconds", str(seconds)]
    if decrypt:
        args.insert(2, "-decrypt")
    out = subprocess.run(args, capture_output=True, text=True, check=False).stdout
    m = re.search(r"AES-256-GCM\s+([\d.]+)k", out)
    return float(m.group(1)) * 1000 / 1e6 if m else None


def cpu_model() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, AttributeError):
        cpu = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text()).group(1)  # type: ignore[union-attr]
    return cpu


def measure_all(*, repeats: int = 5, chunks: tuple[int, ...] = (4096, 65536), openssl_seconds: int = 2,
                step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every repetition's MB/s, by chunk size: format_/raw_/openssl_ + encrypt/decrypt.
    `openssl speed` runs inside each repetition, so all three see the same noise."""
    by_chunk: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeats):
        native = compiled(TOTAL >> 20) or {}
        for chunk in chunks:
            figures = by_chunk.setdefault(str(chunk), {})
            for name, value in {**measure(chunk), **native.get(str(chunk), {})}.items():
                figures.setdefault(name, []).append(value)
            for op in ("encrypt", "decrypt"):
                ssl = openssl(chunk, decrypt=op == "decrypt", seconds=openssl_seconds)
                if ssl is not None:
                    figures.setdefault(f"openssl_{op}", []).append(ssl)
            if step is not None:
                step(f"{chunk // 1024} KiB")
    return {"cpu": cpu_model(), "total_mib": TOTAL >> 20, "repeats": repeats, "chunks": by_chunk}


def render(results: dict[str, Any]) -> str:
    def cell(xs: list[float] | None) -> str:
        return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})" if xs else "n/a"

    lines = [
        f"{results['cpu']}, one thread, {results['total_mib']} MiB per measurement, median of "
        f"{results['repeats']} (min-max), MB/s. Format v1 = the compiled engine (libsrcf) sealing and opening "
        "1 MiB runs; raw = one EVP AES-256-GCM call per chunk in the same C process (Debian's OpenSSL 3.0).",
        "",
        "| chunk | operation | format v1 (libsrcf) | raw EVP AES-256-GCM | format / raw | openssl speed "
        "| Python reference |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for chunk, runs in results["chunks"].items():
        for op in ("encrypt", "decrypt"):
            ours, raw = runs.get(f"format_{op}"), runs.get(f"raw_{op}")
            ratio = f"{statistics.median(ours) / statistics.median(raw):.0%}" if ours and raw else "n/a"
            lines.append(f"| {int(chunk) // 1024} KiB | {op} | {cell(ours)} | {cell(raw)} | {ratio} "
                         f"| {cell(runs.get(f'openssl_{op}'))} | {cell(runs.get(f'python_{op}'))} |")
    return "\n".join(lines)


def run(*, repeats: int = 5, chunks: tuple[int, ...] = (4096, 65536)) -> str:
    return render(measure_all(repeats=repeats, chunks=chunks))


SECTION = "engine-bench"
HEADING = ("## File format engine\n\nCommand: `python -m kmsbench.engine --output docs/benchmarks.md`. "
           "Target (issue 4): format >= 80 % of raw AESGCM at the same chunk size.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, help="Markdown file whose engine section is rewritten")
    args = parser.parse_args()
    report = run(repeats=args.repeats)
    print(report)
    if args.output:
        write_section(args.output, report, name=SECTION, heading=HEADING)


if __name__ == "__main__":
    main()
