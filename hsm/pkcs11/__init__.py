"""`HsmBackend` for any PKCS#11 module (SoftHSM2 by default).

Layers, bottom up: `hsm.cryptoki` (raw calls python-pkcs11 lacks), `hsm.module` (one
initialised module and one login per token, process-wide), `hsm.sessions` (a pool of
plain sessions), `hsm.handles` (cached unwrapped data keys), `hsm.capabilities` (token
quirks). This package is the policy on top: which templates and mechanisms each
operation uses, what a failure means, and when to re-open sessions and retry — one
module per concern, listed in hsm/README.md.
"""

from hsm.pkcs11.backend import Pkcs11Backend
from hsm.pkcs11.bootstrap import open_backend
from hsm.pkcs11.common import session_rsa_pair

__all__ = ["Pkcs11Backend", "open_backend", "session_rsa_pair"]
