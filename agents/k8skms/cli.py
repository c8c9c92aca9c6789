"""`kms-plugin`: serve the Kubernetes KMS v2 API on a unix socket, with a managed key in
Strongroom (docs/integrations.md "Kubernetes: KMS v2 plugin").

  kms-plugin --socket /var/run/strongroom/kms.sock --server https://keys.example:8443 \\
             --key k8s-secrets --token-file /etc/strongroom/kms-plugin.token --ca-file /etc/strongroom/ca.pem

The token may also come from STRONGROOM_KMS_TOKEN. SIGHUP re-reads --token-file (a
replaced token, without a restart). Exit status: 0 on SIGTERM/SIGINT, 2 for bad usage or
an unreadable token."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
import threading
from pathlib import Path

from agents.k8skms.backend import KeyServer
from agents.k8skms.service import KeyManagementService, serve


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kms-plugin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", required=True, type=Path, help="unix socket kube-apiserver connects to (made 0600)")
    p.add_argument("--server", required=True, help="the key server's REST URL, e.g. https://keys.example:8443")
    p.add_argument("--key", required=True, help="the managed key (name or UUID) that protects the DEK seeds")
    p.add_argument("--token-file", type=Path, help="file holding the plugin's API token (srk_...)")
    p.add_argument("--ca-file", type=Path, help="CA certificate the key server's TLS certificate is checked against")
    p.add_argument("--grace", type=float, default=60.0,
                   help="seconds Status still answers ok after the key server last answered (default 60)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per key server call at most (default 5)")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    log = logging.getLogger("strongroom.k8skms")
    try:
        token = _token(args.token_file)
    except (OSError, ValueError) as e:
        print(f"kms-plugin: {e}", file=sys.stderr)
        return 2
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(args.ca_file)) if args.ca_file else True
    backend = KeyServer(args.server, token, args.key, verify=verify, timeout=args.timeout)
    server = serve(KeyManagementService(backend, grace=args.grace), args.socket)
    log.info("serving KMS v2 on unix://%s for key %s", args.socket, args.key)
    wake, received = threading.Event(), set[int]()

    def on_signal(signum: int, _frame: object) -> None:
        received.add(signum)
        wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    while not received & {signal.SIGTERM, signal.SIGINT}:
        wake.wait()
        wake.clear()
        if signal.SIGHUP in received:
            received.discard(signal.SIGHUP)
            try:
                backend.set_token(_token(args.token_file))
                log.info("SIGHUP: the API token was read again")
            except (OSError, ValueError) as e:
                log.error("SIGHUP: the token was not replaced: %s", e)
    server.stop(grace=5).wait()
    backend.close()
    args.socket.unlink(missing_ok=True)
    return 0


def _token(path: Path | None) -> str:
    try:
        token = path.read_text().strip() if path else os.environ.get("STRONGROOM_KMS_TOKEN", "")
    except OSError as e:
        raise OSError(f"cannot read the token: {e}") from None
    if not token:
        raise ValueError("no API token (--token-file or STRONGROOM_KMS_TOKEN)")
    return token


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
