"""The module under stress: the main sequence under AddressSanitizer and UBSan, the TTLV
response decoder fuzzed (a fixed number of runs over the committed corpus), a key server
that goes away mid-session, and a wrong PIN."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pkcs11
import pytest
from pkcs11 import Mechanism
from pkcs11 import exceptions as ckr

from keyserver.kmip.server import build_listener
from keyserver.services import Services
from tests import parallel
from tests.pkcs11.conftest import BUILD, MODULE_DIR, P11, ROOT, make, run
from tests.pkcs11.sequence import gcm_roundtrip, secret_key

FUZZ_RUNS = 100_000
SANITIZER_REPORT = re.compile(r"ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer|SUMMARY: \w+Sanitizer")


def asan_runtime(library: Path) -> str:
    """The ASan runtime the instrumented module links (gcc's libasan or clang's), which
    must come first in a process (python) that is not instrumented itself."""
    ldd = subprocess.run(["ldd", str(library)], capture_output=True, text=True, check=True).stdout
    found = re.search(r"(\S*lib(?:asan|clang_rt\.asan[-\w]*)\.so[.\d]*) => (\S+)", ldd)
    assert found, f"{library} links no ASan runtime:\n{ldd}"
    return found.group(2)


def test_the_main_sequence_under_asan_and_ubsan(p11: P11, conf_for: Callable[..., Path],
                                                 make_key: Callable[..., str]) -> None:
    """python is not instrumented: the runtime is preloaded, and leak detection is off
    because the interpreter's own allocations at exit would be reported (the module's
    memory errors — overflows, use after free, undefined behaviour — still stop it)."""
    make("asan")
    library = BUILD / "libstrongroom-pkcs11-asan.so"
    env = p11.env(conf_for(p11.user), LD_PRELOAD=asan_runtime(library),
                  ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86",
                  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87", PYTHONPATH=str(ROOT))
    done = run([str(ROOT / ".venv" / "bin" / "python"), "-m", "tests.pkcs11.sequence", str(library),
                p11.user.label, make_key("asan-aes"), make_key("asan-mac", algorithm="HMAC-SHA256")],
               env=env, timeout=180, check=False)
    assert not SANITIZER_REPORT.search(done.stderr), done.stderr
    assert done.returncode == 0 and done.stdout.strip().endswith("sequence ok"), done.stdout + done.stderr


def corpus() -> Path:
    found = sorted(p for p in MODULE_DIR.rglob("*") if p.is_dir() and p.name == "corpus" and any(p.iterdir()))
    assert found, "pkcs11module commits a fuzz corpus (a directory named corpus)"
    return found[0]


def test_the_ttlv_decoder_survives_the_fuzzer(tmp_path: Path) -> None:
    make("fuzz")
    fuzzer = BUILD / "fuzz_ttlv"
    work = tmp_path / "corpus"
    shutil.copytree(corpus(), work)  # libFuzzer adds what it finds to its first directory
    seeds = len(list(work.iterdir()))
    done = subprocess.run([str(fuzzer), f"-runs={FUZZ_RUNS}", "-seed=1", "-max_len=4096",
                           f"-artifact_prefix={tmp_path}/", str(work)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Done {FUZZ_RUNS} runs" in done.stderr
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("leak-*"))
    assert seeds > 0


def test_make_check_runs_the_decoder_over_the_corpus_under_asan() -> None:
    """The module's own C test (fuzz/check_ttlv.c): the seeds read as the module expects,
    truncations are refused, byte changes and length extremes decode or are refused
    without a sanitizer report."""
    done = parallel.make(MODULE_DIR, "check", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert not SANITIZER_REPORT.search(done.stderr), done.stderr[-4000:]
    assert "check_ttlv: 7 seeds, truncations, byte changes and length extremes: ok" in done.stdout


def test_a_server_gone_mid_session_is_a_device_error(lib: Any, p11: P11, services: Services,
                                                     make_key: Callable[..., str]) -> None:
    """The `outage` identity's listener is stopped while a session holds a key: the next
    operation fails with CKR_DEVICE_ERROR, the process lives, the other tokens (another
    listener) keep working, and once the server listens again the token works again."""
    name = make_key("outage-aes")
    token = lib.get_token(token_label=p11.outage.label)
    port = p11.outage_listener.port
    with token.open() as s:
        key = secret_key(s, name)
        gcm_roundtrip(key)
        p11.outage_listener.stop()
        with pytest.raises(ckr.DeviceError):
            key.encrypt(b"x", mechanism=Mechanism.AES_GCM, mechanism_param=pkcs11.GCMParams(os.urandom(12)))
        with pytest.raises(ckr.DeviceError):
            list(s.get_objects({pkcs11.Attribute.LABEL: name}))
    with lib.get_token(token_label=p11.user.label).open() as s:
        gcm_roundtrip(secret_key(s, name))
    back = build_listener(services, port=port)  # the key server is back, on the same port
    back.start()
    try:
        with token.open() as s:
            gcm_roundtrip(secret_key(s, name))
    finally:
        back.stop()


def test_a_wrong_pin_is_pin_incorrect(lib: Any, p11: P11, make_key: Callable[..., str]) -> None:
    name = make_key("pin-aes")
    token = lib.get_token(token_label=p11.locked.label)
    with pytest.raises(ckr.PinIncorrect):
        token.open(user_pin="not the passphrase")
    with pytest.raises(ckr.PinIncorrect):
        token.open(user_pin="")
    with token.open(user_pin=p11.locked.pin) as s:  # the right one still opens it
        gcm_roundtrip(secret_key(s, name))


def test_tools_see_the_wrong_pin_too(p11: P11, conf_for: Callable[..., Path]) -> None:
    env = p11.env(conf_for(p11.locked))
    done = run(["pkcs11-tool", "--module", str(p11.module), "--login", "--pin", "wrong", "-O"], env=env, check=False)
    assert done.returncode != 0 and "CKR_PIN_INCORRECT" in done.stdout + done.stderr
    listed = run(["pkcs11-tool", "--module", str(p11.module), "--login", "--pin", str(p11.locked.pin), "-O"], env=env)
    assert "Secret Key Object" in listed.stdout  # logged in, the identity's keys are there
