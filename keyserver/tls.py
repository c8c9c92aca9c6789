"""TLS for the keyserver's own listeners (KMIP, the agent port): certificates from the
internal CA, TLS 1.2/1.3, forward-secret AEAD suites only, client certificates checked
against the internal CA."""

from __future__ import annotations

import ssl

from keyserver.core.ca import CertificateAuthority, load_into_context

# ECDHE key exchange only (forward secrecy), AEAD ciphers only, for TLS 1.2.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def server_context(ca: CertificateAuthority, names: list[str], *, client_cert: ssl.VerifyMode,
                   common_name: str) -> ssl.SSLContext:
    """A server context with a fresh key certified by the internal CA for `names`.
    `client_cert` is CERT_REQUIRED (KMIP) or CERT_OPTIONAL (the agent port, where the
    installer and enrollment come before a host has a certificate); a certificate that
    is presented is always verified against the CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.verify_mode = client_cert
    ctx.load_verify_locations(cadata=ca.certificate_pem().decode())
    cert_pem, key = ca.issue_server(names, common_name=common_name)
    load_into_context(ctx, cert_pem, key)
    return ctx
