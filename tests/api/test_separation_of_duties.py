"""The two-person rule against one administrator who wants it done alone (issue 25).

Each test is an attack that worked: the administrator asks for a destroy, then makes
themselves a second vote — a token for a colleague's account, a new account, a reset
of a colleague's password, a program's identity — and approves with it. Each vote is
now refused with its own code and audited, and the ways of making one are themselves
held (visible to the other administrators on the Approvals page). A colleague whose
account predates the request still approves, in the console or over REST, and a
Destroy a KMIP client asked for runs once approved."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from hsm import HsmBackend
from keyserver.core.approvals import ApprovalPending
from keyserver.core.errors import Forbidden
from keyserver.core.keys import KeySpec
from keyserver.core.kmip_clients import principal_for
from keyserver.core.principal import RequestContext, system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent, KmipClient
from tests.api.sessions import session
from tests.api.test_health_and_faults import serve
from tests.conftest import own_services, unique

PASSWORD = "a long enough passphrase 1"
NEW_PASSWORD = "another long passphrase 2"


@pytest.fixture
def held(services: Services, hsm_backend: HsmBackend, tmp_path: Path) -> Iterator[Services]:
    # Only the destroy is named: holding who-may-approve follows from the rule being on.
    with own_services(tmp_path / "data", hsm_backend, approvals={"key.destroy": 1}) as svc:
        yield svc


def _person(svc: Services, role: str = "admin", *, name: str | None = None) -> RequestContext:
    name = name or unique(role.replace("-", ""))
    svc.identity.create_user(system_context("tests"), username=name, role=role, password=PASSWORD)
    return _sign_in(svc, name, PASSWORD)


def _sign_in(svc: Services, name: str, password: str) -> RequestContext:
    return RequestContext(svc.identity.login(name, password, source_ip=None, request_id=None).principal)


def _destroy_request(svc: Services, requester: RequestContext) -> tuple[uuid.UUID, uuid.UUID]:
    key = svc.keys.create(requester, KeySpec(name=unique("victim"), activate=False))
    with pytest.raises(ApprovalPending) as e:
        svc.keys.destroy(requester, str(key.id))
    return key.id, e.value.request.id


def _refused(svc: Services, approver: RequestContext, request_id: uuid.UUID, code: str) -> None:
    with pytest.raises(Forbidden) as e:
        svc.approvals.approve(approver, request_id)
    assert e.value.code == code, e.value.message
    svc.audit.flush()
    with svc.db() as s:
        details = s.execute(select(AuditEvent.details).where(
            AuditEvent.action == "approval.approve", AuditEvent.object_id == str(request_id),
            AuditEvent.actor == approver.principal.name, AuditEvent.outcome == "denied")
            .order_by(AuditEvent.seq)).scalars().all()  # in chain order: [-1] is this refusal
    assert {"reason": code}.items() <= details[-1].items()


def _intact(svc: Services, who: RequestContext, key_id: uuid.UUID) -> None:
    assert svc.keys.get(who, str(key_id)).versions[0].state != "destroyed"


def test_a_token_for_a_colleagues_account_is_held_seen_by_them_and_never_approves(held: Services) -> None:
    ann, ben = _person(held), _person(held)
    key_id, rid = _destroy_request(held, ann)
    with serve(held) as url, session(url, ann.principal.name, PASSWORD) as a, \
            session(url, ben.principal.name, PASSWORD) as b:
        body = {"name": "ci", "user_id": str(ben.principal.user_id), "expires_in_days": 1}
        r = a.post("/api/v1/tokens", json=body)
        assert r.status_code == 202 and r.json()["code"] == "approval_required", r.text
        mint = r.json()["approval"]
        assert (mint["action"], mint["target"]) == ("token.create", ben.principal.name)
        # Ben is told: the mint waits on his Approvals page.
        pending: Any = b.get("/api/v1/approvals", params={"state": "pending"}).json()
        assert {mint["id"], str(rid)} <= {x["id"] for x in pending}
        # Even approved (say Ben needs the token for a job), it is a program's credential.
        assert b.post(f"/api/v1/approvals/{mint['id']}/approve").json()["executed"] is True
        r = a.post("/api/v1/tokens", json=body)  # asking again takes the grant: once
        assert r.status_code == 201, r.text
        secret = r.json()["secret"]
        assert a.post("/api/v1/tokens", json=body).status_code == 202  # used up
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}) as as_ben:
            r = as_ben.post(f"/api/v1/approvals/{rid}/approve")
        assert r.status_code == 403 and r.json()["code"] == "approver_not_a_person", r.text
    _intact(held, ann, key_id)
    _refused(held, RequestContext(held.identity.authenticate_token(secret)), rid, "approver_not_a_person")


def test_an_administrator_made_after_the_request_or_by_the_requester_cannot_approve(held: Services) -> None:
    ann, ben = _person(held), _person(held)
    key_id, rid = _destroy_request(held, ann)
    name = unique("sock")
    with pytest.raises(ApprovalPending) as e:
        held.identity.create_user(ann, username=name, role="admin")
    creation = e.value.request
    assert (creation.action, creation.target) == ("user.create", name)
    assert held.approvals.approve(ben, creation.id).executed  # Ben agrees to a new colleague…
    _, otp = held.identity.create_user(ann, username=name, role="admin")  # …whose first password Ann has
    assert otp is not None
    sock = _sign_in(held, name, otp)
    _refused(held, sock, rid, "approver_password_pending")
    held.identity.change_password(sock, current=otp, new=NEW_PASSWORD)
    _refused(held, _sign_in(held, name, NEW_PASSWORD), rid, "approver_too_new")
    _intact(held, ann, key_id)
    # Made before the next request, by Ann, it still is Ann's second vote.
    key2, rid2 = _destroy_request(held, ann)
    _refused(held, _sign_in(held, name, NEW_PASSWORD), rid2, "approver_not_independent")
    # Made after the request by someone else (the CLI): too new all the same.
    late = _person(held, "key-officer")
    _refused(held, late, rid2, "approver_too_new")
    _intact(held, ann, key2)
    # Accounts of roles that cannot approve are not held.
    held.identity.create_user(ann, username=unique("ops"), role="operator")


def test_resetting_a_colleagues_password_is_held_and_does_not_make_them_ones_vote(held: Services) -> None:
    ann, ben, cas = _person(held), _person(held), _person(held)
    key_id, rid = _destroy_request(held, ann)
    assert ben.principal.user_id is not None
    with pytest.raises(ApprovalPending) as e:
        held.identity.reset_password(ann, ben.principal.user_id)
    assert (e.value.request.action, e.value.request.target) == ("user.password", ben.principal.name)
    _refused(held, ann, e.value.request.id, "own_request")
    assert held.approvals.approve(cas, e.value.request.id).executed
    otp = held.identity.reset_password(ann, ben.principal.user_id)
    as_ben = _sign_in(held, ben.principal.name, otp)
    _refused(held, as_ben, rid, "approver_password_pending")
    held.identity.change_password(as_ben, current=otp, new=NEW_PASSWORD)
    _refused(held, _sign_in(held, ben.principal.name, NEW_PASSWORD), rid, "approver_not_independent")
    _intact(held, ann, key_id)
    # Removing a colleague's second factor is held the same way.
    with pytest.raises(ApprovalPending) as t:
        held.identity.reset_totp(ann, cas.principal.user_id)  # type: ignore[arg-type]
    assert t.value.request.action == "user.totp"
    # And Cas, untouched by Ann, is the second person the rule asks for.
    assert held.approvals.approve(cas, rid).executed
    assert held.keys.get(ann, str(key_id)).versions[0].state == "destroyed"
    # Once Cas agrees to Ann removing Cas's factor, Ann has touched Cas's credentials.
    assert held.approvals.approve(cas, t.value.request.id).executed
    _, rid2 = _destroy_request(held, ann)
    _refused(held, _sign_in(held, cas.principal.name, PASSWORD), rid2, "approver_not_independent")


def test_programs_never_approve(held: Services, tmp_path: Path) -> None:
    from tests.kmip.conftest import issue_client

    ann = _person(held)
    key_id, rid = _destroy_request(held, ann)
    files = issue_client(held, tmp_path, "kmip-client")
    with held.db() as s:
        client = s.execute(select(KmipClient).where(KmipClient.name == files.name)).scalar_one()
    _refused(held, RequestContext(principal_for(client)), rid, "approver_not_a_person")
    # A password account with the programs' role (it holds keys:destroy) neither.
    _refused(held, _person(held, "kmip-client"), rid, "approver_not_a_person")
    ann_token = held.identity.create_token(ann, name="own", scopes=None, expires_in_days=1).secret
    _refused(held, RequestContext(held.identity.authenticate_token(ann_token)), rid, "own_request")
    _intact(held, ann, key_id)


def test_the_administrator_who_made_a_kmip_client_cannot_approve_its_requests(held: Services,
                                                                               tmp_path: Path) -> None:
    ann, ben = _person(held), _person(held)
    issued = held.kmip_clients.create(ann, name=unique("app"), role="kmip-client")
    key = held.keys.create(RequestContext(principal_for(issued.client)), KeySpec(name=unique("k"), activate=False))
    with pytest.raises(ApprovalPending) as e:
        held.keys.destroy(RequestContext(principal_for(issued.client)), str(key.id))
    _refused(held, ann, e.value.request.id, "approver_not_independent")
    assert held.approvals.approve(ben, e.value.request.id).executed


def test_a_destroy_asked_over_kmip_waits_then_runs_once_a_person_approves(held: Services, tmp_path: Path) -> None:
    """The KMIP client sees Permission Denied naming the request while it waits; once
    approved in the console or REST the destroy runs as that client."""
    from kmip.core import enums
    from kmip.pie.exceptions import KmipOperationFailure

    from keyserver.kmip.server import build_listener
    from tests.kmip.conftest import issue_client, make_client

    ann = _person(held)
    listener = build_listener(held, port=0)
    listener.start()
    try:
        files = issue_client(held, tmp_path, "kmip-client")
        with make_client(files, listener.port) as program:
            uid = program.create(enums.CryptographicAlgorithm.AES, 256, name=unique("kmip-held"))
            program.activate(uid)
            program.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
            with pytest.raises(KmipOperationFailure) as e:
                program.destroy(uid)
            assert e.value.reason == enums.ResultReason.PERMISSION_DENIED
            assert "approval" in e.value.message
            rid = next(w for w in e.value.message.split() if w.count("-") == 4)
            with serve(held) as url, session(url, ann.principal.name, PASSWORD) as a:
                r = a.post(f"/api/v1/approvals/{rid}/approve")
            assert r.status_code == 200 and r.json()["executed"] is True, r.text
            attrs = program.get_attributes(uid, ["State"])[1]
            assert attrs[0].attribute_value.value == enums.State.DESTROYED
            with pytest.raises(KmipOperationFailure) as again:  # asked again: as for any destroyed object
                program.destroy(uid)
            assert again.value.reason == enums.ResultReason.ILLEGAL_OPERATION
            assert "already destroyed" in again.value.message
    finally:
        listener.stop()
    assert [r.target for r in held.approvals.list(ann, state="pending")] == []
    held.audit.flush()
    with held.db() as s:
        rows = s.execute(select(AuditEvent.action, AuditEvent.actor).where(
            AuditEvent.object_id == rid).order_by(AuditEvent.seq)).all()
    assert [tuple(r) for r in rows] == [("approval.request", f"kmip:{files.name}"),
                                        ("approval.approve", ann.principal.name),
                                        ("approval.execute", f"kmip:{files.name}")]
