"""OpenID Connect sign-in for the console: the authorization code flow with PKCE against
the organisation's identity provider, the ID token checked here, roles from a claim.

The key server is a confidential client (client_secret_basic). The state, nonce and PKCE
verifier of a sign-in travel in a short-lived HttpOnly cookie, so that any replica can
finish a sign-in another began; the callback's `state` must equal the cookie's. The ID
token must be signed by a key of the provider's JWKS (RS256/ES256/PS256), issued by the
configured issuer to this client, unexpired, and carry the nonce. Its role claim is
mapped to one of our roles (STRONGROOM_OIDC_ROLE_MAP); no mapping, no sign-in.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt

from keyserver.core.errors import Forbidden, ServiceUnavailable, Unauthenticated
from keyserver.core.identity import FULL_NAME_MAX, USERNAME_MAX
from keyserver.core.permissions import Role

ALGORITHMS = ["RS256", "ES256", "PS256"]
DISCOVERY_TTL = 300.0
LEEWAY_SECONDS = 60
PREFIX = "oidc:"  # accounts the provider signs in; ':' is not allowed in local usernames


@dataclass(frozen=True, slots=True)
class OidcConfig:
    issuer: str
    client_id: str
    client_secret: str
    redirect_uri: str
    role_claim: str = "groups"
    role_map: dict[str, str] | None = None  # claim value → role
    scopes: str = "openid profile groups"
    ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class Begun:
    url: str  # where to send the browser
    cookie: str  # state.nonce.verifier, for the callback


@dataclass(frozen=True, slots=True)
class Identity:
    username: str
    full_name: str
    role: str
    subject: str
    claims: dict[str, Any]


class OidcClient:
    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=config.ca_file) if config.ca_file
                                         else True)
        self._http = httpx.Client(verify=verify, timeout=10.0)
        self._lock = threading.Lock()
        self._discovered: tuple[dict[str, Any], float] | None = None
        self._jwks: tuple[jwt.PyJWKSet, float] | None = None

    def _metadata(self) -> dict[str, Any]:
        with self._lock:
            if self._discovered and time.monotonic() - self._discovered[1] < DISCOVERY_TTL:
                return self._discovered[0]
        try:
            r = self._http.get(self.config.issuer.rstrip("/") + "/.well-known/openid-configuration")
            r.raise_for_status()
            meta: dict[str, Any] = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ServiceUnavailable(f"the identity provider {self.config.issuer} cannot be reached ({exc}); "
                                     "sign in with a password, or try again", code="oidc_unavailable") from exc
        if meta.get("issuer") != self.config.issuer:
            raise ServiceUnavailable(f"the identity provider says it is {meta.get('issuer')!r}, not "
                                     f"{self.config.issuer!r}: check STRONGROOM_OIDC_ISSUER", code="oidc_unavailable")
        with self._lock:
            self._discovered = (meta, time.monotonic())
        return meta

    def _keys(self, *, refresh: bool = False) -> jwt.PyJWKSet:
        with self._lock:
            if self._jwks and not refresh and time.monotonic() - self._jwks[1] < DISCOVERY_TTL:
                return self._jwks[0]
        try:
            r = self._http.get(self._metadata()["jwks_uri"])
            r.raise_for_status()
            keys = jwt.PyJWKSet.from_dict(r.json())
        except (httpx.HTTPError, ValueError, KeyError, jwt.PyJWKSetError) as exc:
            raise ServiceUnavailable(f"the identity provider's keys cannot be read ({exc})",
                                     code="oidc_unavailable") from exc
        with self._lock:
            self._jwks = (keys, time.monotonic())
        return keys

    def begin(self) -> Begun:
        """The provider's authorization URL and the cookie that must come back with it."""
        state, nonce = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        verifier = secrets.token_urlsafe(48)  # RFC 7636: 43-128 characters
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = urlencode({"response_type": "code", "client_id": self.config.client_id,
                           "redirect_uri": self.config.redirect_uri, "scope": self.config.scopes, "state": state,
                           "nonce": nonce, "code_challenge": challenge, "code_challenge_method": "S256"})
        return Begun(url=f"{self._metadata()['authorization_endpoint']}?{query}", cookie=f"{state}.{nonce}.{verifier}")

    def finish(self, *, code: str, state: str, cookie: str | None) -> Identity:
        """Exchange the code and check the ID token; the signed-in person's identity."""
        parts = (cookie or "").split(".")
        if len(parts) != 3 or not secrets.compare_digest(parts[0], state):
            raise Unauthenticated("this sign-in was not started here or has expired; start again",
                                  code="oidc_state")
        _, nonce, verifier = parts
        try:
            r = self._http.post(self._metadata()["token_endpoint"], auth=(self.config.client_id,
                                                                          self.config.client_secret),
                                data={"grant_type": "authorization_code", "code": code,
                                      "redirect_uri": self.config.redirect_uri, "code_verifier": verifier})
        except httpx.HTTPError as exc:
            raise ServiceUnavailable(f"the identity provider cannot be reached ({exc})",
                                     code="oidc_unavailable") from exc
        if r.status_code != 200:
            raise Unauthenticated(f"the identity provider refused the code ({r.status_code}: "
                                  f"{r.text[:200]}); start again", code="oidc_refused")
        token = r.json().get("id_token")
        if not isinstance(token, str):
            raise Unauthenticated("the identity provider sent no ID token", code="oidc_refused")
        claims = self._verify(token, nonce)
        return self._identity(claims)

    def _verify(self, token: str, nonce: str) -> dict[str, Any]:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            keys = self._keys()
            if kid not in {k.key_id for k in keys.keys}:
                keys = self._keys(refresh=True)  # the provider rotated its keys
            key = next((k for k in keys.keys if k.key_id == kid), None)
            if key is None:
                raise jwt.InvalidTokenError("signed by a key the provider does not publish")
            claims: dict[str, Any] = jwt.decode(token, key=key, algorithms=ALGORITHMS, audience=self.config.client_id,
                                                issuer=self.config.issuer, leeway=LEEWAY_SECONDS,
                                                options={"require": ["exp", "iat", "sub", "aud", "iss"]})
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"the ID token is not valid ({exc}); start again", code="oidc_token") from exc
        if not secrets.compare_digest(str(claims.get("nonce", "")), nonce):
            raise Unauthenticated("the ID token is not for this sign-in (nonce); start again", code="oidc_token")
        return claims

    def _identity(self, claims: dict[str, Any]) -> Identity:
        raw = claims.get(self.config.role_claim, [])
        values = [raw] if isinstance(raw, str) else [str(v) for v in raw] if isinstance(raw, list) else []
        mapped = {(self.config.role_map or {}).get(v) for v in values} - {None}
        # The most powerful role a person's groups give, in the order roles are listed.
        role = next((r.value for r in Role if r.value in mapped), None)
        claim = next(c for c in ("preferred_username", "email", "sub") if claims.get(c) or c == "sub")
        username = str(claims[claim]).strip().lower()
        if role is None:
            raise Forbidden(f"'{username}' signed in at the identity provider, but none of their "
                            f"'{self.config.role_claim}' ({', '.join(values) or 'none'}) maps to a role here: ask "
                            "an administrator to add it to STRONGROOM_OIDC_ROLE_MAP", code="oidc_no_role")
        # Refused, never cut: two people whose names share a prefix would become one account.
        if len(f"{PREFIX}{username}") > USERNAME_MAX:
            raise Forbidden(f"the identity provider's '{claim}' for this person has {len(username)} characters; a "
                            f"name here is at most {USERNAME_MAX - len(PREFIX)} (as {PREFIX}<name>): ask the "
                            f"provider's administrator for a shorter '{claim}'", code="oidc_username_too_long")
        full_name = str(claims.get("name", ""))
        if len(full_name) > FULL_NAME_MAX:
            raise Forbidden(f"the identity provider's 'name' for '{username}' has {len(full_name)} characters; a full "
                            f"name here is at most {FULL_NAME_MAX}: ask the provider's administrator to shorten it",
                            code="oidc_name_too_long")
        return Identity(username=f"{PREFIX}{username}", full_name=full_name, role=role,
                        subject=str(claims["sub"]), claims={k: claims[k] for k in ("sub", "iss") if k in claims})

    def close(self) -> None:
        self._http.close()
