"""Many threads on one backend: no crash, no mixed-up keys, no leaked session objects.

Without CKF_OS_LOCKING_OK, SoftHSM2 runs without locks and two threads in C_UnwrapKey
corrupt each other (GeneralError on valid blobs, or a segfault). These tests drive
every cross-thread path at once: cache hits, misses, evictions under lease, unwraps
and re-wraps, on 8 threads.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pkcs11 import Attribute

from hsm import testing
from hsm.backend import RSA_OAEP_SHA1, WrappedKey
from hsm.pkcs11 import Pkcs11Backend, open_backend
from tests.hsm.conformance import oaep_padding

THREADS = 8
SHA1_OAEP = oaep_padding(RSA_OAEP_SHA1)


def _hammer(
    backend: Pkcs11Backend, *, iterations: int, keys: list[WrappedKey], expected: dict[bytes, bytes]
) -> int:
    kek = keys[0].wrapping_key_id
    recipient = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = recipient.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    barrier = threading.Barrier(THREADS)
    failures: list[BaseException] = []
    counts = [0] * THREADS

    def worker(index: int) -> None:
        rng = random.Random(index)
        barrier.wait()
        ops = 0
        for i in range(iterations):
            key = rng.choice(keys)
            material = expected[key.ciphertext]
            aad = f"{index}:{i}".encode()
            payload = rng.randbytes(rng.randrange(0, 600))
            sealed = backend.encrypt_with(key, payload, aad=aad)
            # Sealed under the right key, not a neighbour's handle.
            assert AESGCM(material).decrypt(sealed[:12], sealed[12:], aad) == payload
            assert backend.decrypt_with(key, sealed, aad=aad) == payload
            ops += 2
            if i % 4 == 0:
                assert backend.unwrap_key(key) == material
                ops += 1
            if i % 16 == 0:
                fresh = backend.generate_wrapped_key(kek_id=kek)
                value = backend.unwrap_key(fresh)
                delivered = backend.rewrap_for_public_key(fresh, public_key_der=der)
                assert recipient.decrypt(delivered.ciphertext, SHA1_OAEP) == value
                assert backend.unwrap_key(backend.rewrap_under_kek(fresh, kek_id=kek)) == value
                ops += 5
            if i % 32 == 0:
                backend.forget(key)
                ops += 1
        counts[index] = ops

    def guarded(index: int) -> Callable[[], None]:
        def run() -> None:
            try:
                worker(index)
            except BaseException as exc:  # collected and re-raised in the main thread
                failures.append(exc)
                barrier.abort()

        return run

    threads = [threading.Thread(target=guarded(i)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    if failures:
        raise failures[0]
    return sum(counts)


def _keys(backend: Pkcs11Backend, count: int) -> tuple[list[WrappedKey], dict[bytes, bytes]]:
    kek = backend.create_kek(f"threads-{uuid.uuid4().hex[:8]}").kek_id
    keys = [backend.generate_wrapped_key(kek_id=kek) for _ in range(count)]
    return keys, {key.ciphertext: backend.unwrap_key(key) for key in keys}


def _session_objects(backend: Pkcs11Backend) -> int:
    with backend._borrow() as session:
        return len(list(session.get_objects({Attribute.TOKEN: False})))


def test_eight_threads_on_the_shared_backend(hsm_backend: Pkcs11Backend) -> None:
    keys, expected = _keys(hsm_backend, 12)
    operations = _hammer(hsm_backend, iterations=250, keys=keys, expected=expected)
    assert operations > 4000


def test_eight_threads_with_a_tiny_cache(hsm_token_base: Path, hsm_backend: Pkcs11Backend) -> None:
    # A second backend on the same token in the same process (shared login), with a
    # cache so small that nearly every operation evicts a handle another thread holds.
    config = testing.make_test_config(hsm_token_base, handle_cache_size=3)
    backend = open_backend(config, create_token=False)
    before = _session_objects(hsm_backend)
    try:
        keys, expected = _keys(backend, 10)
        operations = _hammer(backend, iterations=80, keys=keys, expected=expected)
        assert operations > 1500
        assert len(backend._cache) <= 3
    finally:
        backend.close()
    # Every evicted, forgotten or cached handle of that backend was destroyed, and
    # closing it did not log out the shared backend.
    assert _session_objects(hsm_backend) == before
    hsm_backend.check()
