"""Engine benchmark of the file format (docs/benchmarks.md, "File format engine").

In memory, one thread: sealing and opening chunks exactly as the format does (fresh
nonce, associated data, output in place) against raw `cryptography` AESGCM on the same
chunk size (one `AESGCM.encrypt`/`decrypt` call per chunk, fixed nonce, no associated
data: the primitive with nothing of the format around it), and against
`openssl speed -evp aes-256-gcm` (the CPU's practical limit), all in one run:
`python -m agents.cryptfile.bench [--output docs/benchmarks.md]`.
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

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agents.benchreport import write_section
from agents.cryptfile.chunks import CHUNK_OVERHEAD, ChunkCipher

TOTAL = 64 << 20  # bytes processed per measurement


def _rate(fn: Callable[[], None], total: int) -> float:
    start = time.perf_counter()
    fn()
    return total / (time.perf_counter() - start) / 1e6


def measure(chunk: int) -> dict[str, float]:
    count = TOTAL // chunk
    plain = os.urandom(chunk)
    key, file_id = os.urandom(32), os.urandom(16)
    cipher = ChunkCipher(key, file_id)
    raw = AESGCM(key)
    nonce = os.urandom(12)
    run = 256  # chunks per sealed run, as a 1 MiB write of the mount would be at 4 KiB
    plain_run = os.urandom(chunk * run)
    out = bytearray((chunk + CHUNK_OVERHEAD) * run)
    view = memoryview(out)
    sealed = [cipher.seal(i, plain, last=False) for i in range(16)]
    raw_sealed = raw.encrypt(nonce, plain, None)

    def ours_encrypt() -> None:
        for r in range(count // run):
            cipher.seal_run(r * run, plain_run, chunk, view, final_index=None)

    def raw_encrypt() -> None:
        for _ in range(count):
            raw.encrypt(nonce, plain, None)

    def ours_decrypt() -> None:
        for i in range(count):
            cipher.open(i % 16, sealed[i % 16], last=False)

    def raw_decrypt() -> None:
        for _ in range(count):
            raw.decrypt(nonce, raw_sealed, None)

    return {"format_encrypt": _rate(ours_encrypt, TOTAL), "raw_encrypt": _rate(raw_encrypt, TOTAL),
            "format_decrypt": _rate(ours_decrypt, TOTAL), "raw_decrypt": _rate(raw_decrypt, TOTAL)}


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
        for chunk in chunks:
            figures = by_chunk.setdefault(str(chunk), {})
            for name, value in measure(chunk).items():
                figures.setdefault(name, []).append(value)
            for op in ("encrypt", "decrypt"):
                ssl = openssl(chunk, decrypt=op == "decrypt", seconds=openssl_seconds)
                if ssl is not None:
                    figures.setdefault(f"openssl_{op}", []).append(ssl)
            if step is not None:
                step(f"{chunk // 1024} KiB")
    return {"cpu": cpu_model(), "total_mib": TOTAL >> 20, "repeats": repeats, "chunks": by_chunk}


def render(results: dict[str, Any]) -> str:
    lines = [
        f"{results['cpu']}, one thread, {results['total_mib']} MiB per measurement, median of "
        f"{results['repeats']} (min-max), MB/s.",
        "",
        "| chunk | operation | format v1 | raw AESGCM | format / raw | openssl speed | format / openssl |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for chunk, runs in results["chunks"].items():
        for op in ("encrypt", "decrypt"):
            ours, raw = runs[f"format_{op}"], runs[f"raw_{op}"]
            ssl_runs = runs.get(f"openssl_{op}")
            ssl = statistics.median(ssl_runs) if ssl_runs else None
            med = statistics.median(ours)
            ratio = med / statistics.median(raw)
            ssl_txt = f"{ssl:.0f}" if ssl else "n/a"
            ssl_ratio = f"{med / ssl:.0%}" if ssl else "n/a"
            lines.append(f"| {int(chunk) // 1024} KiB | {op} | {med:.0f} ({min(ours):.0f}-{max(ours):.0f}) "
                         f"| {statistics.median(raw):.0f} ({min(raw):.0f}-{max(raw):.0f}) | {ratio:.0%} "
                         f"| {ssl_txt} | {ssl_ratio} |")
    return "\n".join(lines)


def run(*, repeats: int = 5, chunks: tuple[int, ...] = (4096, 65536)) -> str:
    return render(measure_all(repeats=repeats, chunks=chunks))


SECTION = "engine-bench"
HEADING = ("## File format engine\n\nCommand: `python -m agents.cryptfile.bench --output docs/benchmarks.md`. "
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
