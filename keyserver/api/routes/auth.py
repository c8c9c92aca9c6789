from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, Field

from keyserver.api.deps import CSRF_COOKIE, SESSION_COOKIE, Ctx, ServicesDep, client_ip
from keyserver.api.schemas import LoginRequest, LoginResponse, Me, PasswordChange, TotpCode, TotpEnrollment
from keyserver.core.approvals import ACTIONS
from keyserver.core.errors import CoreError, NotFound
from keyserver.core.identity import LoginResult
from keyserver.core.permissions import KEY_OPERATIONS, Permission, permissions_for
from keyserver.core.principal import Principal
from keyserver.logs import request_id_var
from keyserver.oidc import OidcClient
from keyserver.services import Services

router = APIRouter(prefix="/auth", tags=["auth"])


def me_of(p: Principal) -> Me:
    return Me(username=p.name, actor_type=p.actor_type, role=p.role,
              permissions=sorted(x.value for x in p.permissions),
              must_change_password=p.must_change_password)


@router.post("/login", operation_id="login", response_model=LoginResponse)
def login(body: LoginRequest, request: Request, response: Response, services: ServicesDep) -> LoginResponse:
    result = services.identity.login(body.username, body.password, source_ip=client_ip(request),
                                     request_id=request_id_var.get(), totp_code=body.totp_code)
    return _session(result, response, services)


def _session(result: LoginResult, response: Response, services: Services) -> LoginResponse:
    secure = services.settings.secure_cookies
    max_age = services.settings.session_ttl_minutes * 60
    response.set_cookie(SESSION_COOKIE, result.session_token, max_age=max_age, httponly=True,
                        secure=secure, samesite="strict", path="/")
    # Readable by the console's script, which echoes it in X-CSRF-Token.
    response.set_cookie(CSRF_COOKIE, result.csrf_token, max_age=max_age, httponly=False,
                        secure=secure, samesite="strict", path="/")
    return LoginResponse(user=me_of(result.principal), csrf_token=result.csrf_token,
                         expires_at=result.expires_at)


@router.post("/logout", operation_id="logout", status_code=204)
def logout(ctx: Ctx, request: Request, response: Response, services: ServicesDep) -> Response:
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        services.identity.logout(ctx, cookie)
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return response


@router.get("/me", operation_id="getMe", response_model=Me)
def me(ctx: Ctx, services: ServicesDep) -> Me:
    return me_of(ctx.principal).model_copy(update={"second_factor": services.identity.has_second_factor(ctx)})


@router.post("/password", operation_id="changePassword", response_model=LoginResponse)
def change_password(body: PasswordChange, ctx: Ctx, response: Response, services: ServicesDep) -> LoginResponse:
    """Every session of the user ends; the caller continues in a new one (new session
    and CSRF cookies, the new CSRF token in the body)."""
    result = services.identity.change_password(ctx, current=body.current_password, new=body.new_password)
    return _session(result, response, services)


@router.post("/totp", operation_id="enrollTotp", response_model=TotpEnrollment, status_code=201)
def enroll_totp(ctx: Ctx, services: ServicesDep) -> TotpEnrollment:
    """Set up a second factor (RFC 6238): scan the URI, then confirm with a code."""
    secret, uri = services.identity.enroll_totp(ctx)
    return TotpEnrollment(secret=secret, otpauth_uri=uri)


@router.post("/totp/confirm", operation_id="confirmTotp", status_code=204)
def confirm_totp(body: TotpCode, ctx: Ctx, services: ServicesDep) -> Response:
    """From now on, sign-in needs the authenticator's code (`totp_code`)."""
    services.identity.confirm_totp(ctx, body.code)
    return Response(status_code=204)


class CanAnswer(BaseModel):
    permission: str
    allowed: bool = Field(description="whether a request needing it would be let through now")
    reason: str = Field(description="why, in words: the role or token scope, a KMIP setting, fail-closed "
                                    "audit, a held action or the key's export policy")


@router.get("/can", operation_id="checkPermission", response_model=CanAnswer)
def can(ctx: Ctx, services: ServicesDep, permission: Annotated[Permission, Query()],
        key: Annotated[str | None, Query(max_length=200, description="a key (name or id): its own policy "
                                                                     "counts too (export)")] = None) -> CanAnswer:
    """What can this credential do? Asked by the caller about itself (nothing is done,
    nothing is recorded): useful before giving a token to a program."""
    p = ctx.principal
    if permission not in p.permissions:
        role_has = p.role is not None and permission in permissions_for(p.role)
        via = "token scopes" if p.actor_type == "token" and role_has else "role"
        return CanAnswer(permission=permission.value, allowed=False,
                         reason=f"'{p.name}' ({p.role}) does not have it: its {via} do not grant it")
    if permission in KEY_OPERATIONS and (refusal := services.sinks.refusal()) is not None:
        return CanAnswer(permission=permission.value, allowed=False, reason=refusal)
    held = [a for a, needed in ACTIONS.items() if needed == permission and a in services.approvals.required]
    if held:
        return CanAnswer(permission=permission.value, allowed=True,
                         reason=f"granted, but {', '.join(held)} wait for approval by other people "
                                f"({', '.join(str(services.approvals.required[a]) for a in held)} needed)")
    if key is not None and permission is Permission.KEYS_EXPORT:
        k = services.keys.get(ctx, key)
        if not k.exportable:
            return CanAnswer(permission=permission.value, allowed=False,
                             reason=f"key '{k.name}' is not exportable in plaintext (its policy); wrapped it is")
    return CanAnswer(permission=permission.value, allowed=True, reason=f"granted to '{p.name}' ({p.role})")


OIDC_COOKIE = "strongroom_oidc"
OIDC_PATH = "/api/v1/auth/oidc"


class AuthMethods(BaseModel):
    password: bool = True
    oidc: bool = Field(description="single sign-on through the organisation's identity provider is configured")


@router.get("/methods", operation_id="authMethods", response_model=AuthMethods)
def methods(services: ServicesDep) -> AuthMethods:
    """How one may sign in here (the console shows a single sign-on button when it can)."""
    return AuthMethods(oidc=services.oidc is not None)


def _oidc(services: Services) -> OidcClient:
    if services.oidc is None:
        raise NotFound("single sign-on is not configured here (STRONGROOM_OIDC_ISSUER, _CLIENT_ID, "
                       "_CLIENT_SECRET); sign in with a password", code="oidc_not_configured")
    return services.oidc


@router.get("/oidc/login", operation_id="oidcLogin", status_code=302, response_class=RedirectResponse)
def oidc_login(services: ServicesDep) -> RedirectResponse:
    """Off to the identity provider; it sends the browser back to /oidc/callback."""
    begun = _oidc(services).begin()
    response = RedirectResponse(begun.url, status_code=302)
    # SameSite=Lax: the provider's redirect back is a top-level GET from another site.
    response.set_cookie(OIDC_COOKIE, begun.cookie, max_age=600, httponly=True, secure=services.settings.secure_cookies,
                        samesite="lax", path=OIDC_PATH)
    return response


@router.get("/oidc/callback", operation_id="oidcCallback", status_code=302, response_class=RedirectResponse)
def oidc_callback(request: Request, services: ServicesDep,
                  code: Annotated[str, Query(max_length=2048)], state: Annotated[str, Query(max_length=256)]
                  ) -> RedirectResponse:
    """The provider's answer: a session here, then the console. A browser arrives here,
    so a refusal goes back to the console's sign-in page, which shows it."""
    client = _oidc(services)
    try:
        identity = client.finish(code=code, state=state, cookie=request.cookies.get(OIDC_COOKIE))
        result = services.identity.external_login(
            username=identity.username, full_name=identity.full_name, role=identity.role,
            issuer=client.config.issuer, subject=identity.subject, source_ip=client_ip(request),
            request_id=request_id_var.get())
    except CoreError as exc:
        failed = RedirectResponse("/#/sign-in?" + urlencode({"sso_error": exc.message, "code": exc.code}),
                                  status_code=302)
        failed.delete_cookie(OIDC_COOKIE, path=OIDC_PATH)
        return failed
    response = RedirectResponse("/", status_code=302)
    _session(result, response, services)
    response.delete_cookie(OIDC_COOKIE, path=OIDC_PATH)
    return response
