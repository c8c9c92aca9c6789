"""How fast is the token at the one expensive thing it does for us: RSA-OAEP unwrap.

`measure_unwrap_ceiling` is what the benchmark command reports as the HSM ceiling:
C_UnwrapKey of an AES-256 key under an RSA-2048 key plus C_DestroyObject of the
result (hsm/probes.py), on `threads` pooled sessions at once, nothing else.

    python -m kmsbench.hsm_ceiling --token-dir /tmp/bench-tokens --seconds 3 --threads 1 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from pathlib import Path

from hsm.backend import HsmBackend
from hsm.probes import unwrap_probe


def measure_unwrap_ceiling(backend: HsmBackend, *, seconds: float, threads: int) -> float:
    """Raw RSA-2048 OAEP unwrap + destroy operations per second inside the token."""
    if threads < 1 or seconds <= 0:
        raise ValueError("threads must be >= 1 and seconds > 0")
    with unwrap_probe(backend) as probe:
        counts = [0] * threads
        failures: list[BaseException] = []
        window = [0.0, 0.0]  # start, deadline

        def start_clock() -> None:
            # Runs once, before any party is released: every worker sees the deadline.
            window[0] = time.monotonic()
            window[1] = window[0] + seconds

        barrier = threading.Barrier(threads + 1, action=start_clock)

        def worker(index: int) -> None:
            try:
                with probe.session() as unwrap_once:
                    # More threads than pooled sessions would wait here for ever.
                    barrier.wait(timeout=60)
                    done = 0
                    while time.monotonic() < window[1]:
                        unwrap_once()
                        done += 1
                    counts[index] = done
            except BaseException as exc:
                failures.append(exc)
                barrier.abort()

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for thread in pool:
            thread.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=60)
        for thread in pool:
            thread.join()
        elapsed = time.monotonic() - window[0]
    if failures:
        raise failures[0]
    return sum(counts) / elapsed


def measure_encrypt_with(backend: HsmBackend, *, seconds: float, threads: int) -> float:
    """encrypt_with operations per second on one cached data-key handle (64-byte input).

    Creates a KEK named `bench-...` (a token object): point it at a benchmark token.
    """
    kek_id = f"bench-{os.getpid()}-{time.monotonic_ns()}"
    kek = backend.create_kek(kek_id).kek_id
    wrapped = backend.generate_wrapped_key(kek_id=kek)
    backend.encrypt_with(wrapped, b"warm", aad=b"")  # unwrap once: the handle is cached
    counts = [0] * threads
    deadline = time.monotonic() + seconds

    def worker(index: int) -> None:
        done = 0
        while time.monotonic() < deadline:
            backend.encrypt_with(wrapped, b"\x00" * 64, aad=b"bench")
            done += 1
        counts[index] = done

    started = time.monotonic()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(counts) / (time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    from hsm.config import HsmConfig
    from hsm.pkcs11 import open_backend

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token-dir", type=Path, required=True, help="SoftHSM2 token directory")
    parser.add_argument("--module", default="/usr/lib/softhsm/libsofthsm2.so")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    config = HsmConfig(
        module_path=args.module,
        token_label="strongroom-bench",  # noqa: S106 - a label, not a secret
        user_pin=os.environ.get("STRONGROOM_BENCH_USER_PIN", "bench-user-pin-0"),
        so_pin=os.environ.get("STRONGROOM_BENCH_SO_PIN", "bench-so-pin-0"),
        softhsm_token_dir=args.token_dir,
    )
    backend = open_backend(config)
    try:
        for threads in args.threads:
            unwrap = measure_unwrap_ceiling(backend, seconds=args.seconds, threads=threads)
            encrypt = measure_encrypt_with(backend, seconds=args.seconds, threads=threads)
            print(
                f"threads={threads}  rsa2048 unwrap+destroy {unwrap:8.0f}/s   "
                f"encrypt_with (cached handle, 64 B) {encrypt:8.0f}/s"
            )
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
