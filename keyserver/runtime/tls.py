"""TLS for the keyserver's listeners (REST/console, KMIP, the agent port, the XKS port):
certificates from the internal CA unless the operator supplies the REST port's own, TLS
1.2/1.3, forward-secret AEAD suites only, client certificates checked against the
internal CA (the XKS port: against the operator's bundle of AWS KMS's CAs)."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit

from keyserver.core.ca import CertificateAuthority, load_into_context
from keyserver.settings import Settings

# ECDHE key exchange only (forward secrecy), AEAD ciphers only, for TLS 1.2.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def server_context(ca: CertificateAuthority, names: list[str], *, client_cert: ssl.VerifyMode,
                   common_name: str) -> ssl.SSLContext:
    """A server context with a fresh key certified by the internal CA for `names`.
    `client_cert` is CERT_REQUIRED (KMIP) or CERT_OPTIONAL (the agent port, where the
    installer and enrollment come before a host has a certificate); a certificate that
    is presented is always verified against the CA."""
    ctx = _server_base()
    ctx.verify_mode = client_cert
    ctx.load_verify_locations(cadata=ca.certificate_pem().decode())
    cert_pem, key = ca.issue_server(names, common_name=common_name)
    load_into_context(ctx, cert_pem, key)
    return ctx


def _server_base() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


def rest_tls_context(settings: Settings, ca: CertificateAuthority) -> ssl.SSLContext | None:
    """The REST/console port's context: the operator's certificate files, else a
    certificate from the internal CA; None only when plain HTTP was asked for."""
    if settings.insecure_http:
        return None
    if settings.tls_cert_file is not None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(TLS12_CIPHERS)
        ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
        ctx.load_cert_chain(str(settings.tls_cert_file), str(settings.tls_key_file))
        return ctx
    return server_context(ca, _rest_names(settings), client_cert=ssl.CERT_NONE, common_name="Strongroom key server")


def _rest_names(settings: Settings) -> list[str]:
    names = list(settings.server_names)
    if settings.host not in ("0.0.0.0", "::", ""):  # noqa: S104 - compared, not bound
        names.append(settings.host)
    if settings.public_url:
        public_host = urlsplit(settings.public_url).hostname
        if public_host:
            names.append(public_host)
    return names


def xks_tls_context(settings: Settings, ca: CertificateAuthority) -> ssl.SSLContext:
    """The XKS port's context. Its certificate is the REST port's (the operator's files:
    AWS KMS accepts only a public CA's; else one from the internal CA, for tests and
    trials), never plain HTTP. It asks every client for a certificate but does not
    demand one (a key store without a required subject keeps working on SigV4 alone);
    one that is presented must chain to `xks_client_ca_file` and nothing else — not the
    internal CA, so no certificate Strongroom issues passes for AWS KMS's."""
    assert settings.xks_client_ca_file is not None  # settings refuse an XKS port without it
    ctx = _server_base()
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.load_verify_locations(cafile=str(settings.xks_client_ca_file))
    if settings.tls_cert_file is not None:
        ctx.load_cert_chain(str(settings.tls_cert_file), str(settings.tls_key_file))
        return ctx
    names = _rest_names(settings)
    if settings.xks_host not in ("0.0.0.0", "::", ""):  # noqa: S104 - compared, not bound
        names.append(settings.xks_host)
    cert_pem, key = ca.issue_server(names, common_name="Strongroom XKS proxy")
    load_into_context(ctx, cert_pem, key)
    return ctx


def uvicorn_tls(context: ssl.SSLContext | None) -> dict[str, Any]:
    """uvicorn.Config keyword arguments that serve `context` (nothing for plain HTTP)."""
    if context is None:
        return {}
    return {"ssl_context_factory": lambda _config, _default: context}
