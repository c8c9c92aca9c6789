"""A separate process for the multi-process tests: `python -m tests.hsm.worker`.

SoftHSM2 serves one token directory per process, so tests about other directories
(bootstrap of an empty one) and about several processes on one directory run here.
The job arrives as JSON on stdin (so no PIN appears in a command line); the answer is
JSON on stdout. Errors come back as {"error": class name, "message": ...}.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from hsm.backend import WrappedKey
from hsm.errors import HsmError
from hsm.pkcs11 import open_backend
from hsm.testing import make_test_config


def _wrapped(item: dict[str, str]) -> WrappedKey:
    return WrappedKey(item["kek"], item["mechanism"], bytes.fromhex(item["ciphertext"]))


def _encoded(wrapped: WrappedKey) -> dict[str, str]:
    return {
        "kek": wrapped.wrapping_key_id,
        "mechanism": wrapped.mechanism,
        "ciphertext": wrapped.ciphertext.hex(),
    }


def run(job: dict[str, Any]) -> dict[str, Any]:
    config = make_test_config(Path(job["base"]), token_label=job.get("label", "strongroom-test"))
    if "user_pin" in job:
        config = dataclasses.replace(config, user_pin=job["user_pin"])
    backend = open_backend(config, create_token=job.get("create_token", True))
    try:
        result: dict[str, Any] = {"capabilities": backend.capabilities.rsa_wrap_mechanism}
        for kek_id in job.get("create_keks", []):
            backend.create_kek(kek_id)
        result["keks"] = [info.kek_id for info in backend.list_keks()]
        if "generate_under" in job:
            result["generated"] = _encoded(backend.generate_wrapped_key(kek_id=job["generate_under"]))
        # Data-key work on blobs from the parent: prove the same key in both processes.
        sealed = []
        for round_ in range(job.get("rounds", 0)):
            for item in job.get("blobs", []):
                wrapped = _wrapped(item)
                aad = f"{job.get('name', 'worker')}:{round_}".encode()
                blob = backend.encrypt_with(wrapped, b"from another process", aad=aad)
                assert backend.decrypt_with(wrapped, blob, aad=aad) == b"from another process"
                if round_ % 10 == 0:
                    backend.forget(wrapped)  # force fresh unwraps now and then
                    sealed.append({"blob": blob.hex(), "aad": aad.hex(), **item})
        result["sealed"] = sealed
        result["unwrapped"] = [
            backend.unwrap_key(_wrapped(item)).hex() for item in job.get("blobs", [])
        ]
        return result
    finally:
        backend.close()


def main() -> int:
    job = json.load(sys.stdin)
    try:
        result = run(job)
    except HsmError as exc:
        result = {"error": type(exc).__name__, "message": str(exc)}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
