"""The two-person rule (issue 15): held actions wait for other people's approval, run
as their requester when enough have approved, and every step is audited. On a store of
its own, configured with STRONGROOM_APPROVALS."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from hsm import HsmBackend
from keyserver.core.approvals import ApprovalPending
from keyserver.core.errors import Conflict, Forbidden
from keyserver.core.keys import KeySpec
from keyserver.core.principal import RequestContext, system_context
from keyserver.kmip.errors import translate
from keyserver.services import Services
from keyserver.store.models import ApprovalRequest, AuditEvent
from tests.api.sessions import session
from tests.api.test_health_and_faults import serve
from tests.conftest import own_services, unique

PASSWORD = "a long enough passphrase 1"


@pytest.fixture
def held(services: Services, hsm_backend: HsmBackend, tmp_path: Path) -> Iterator[Services]:
    with own_services(tmp_path / "data", hsm_backend,
                      approvals={"key.destroy": 2, "user.role": 1, "kek.rotate": 1, "key.export": 1}) as svc:
        yield svc


def _person(svc: Services, role: str) -> RequestContext:
    name = unique(role.replace("-", ""))
    svc.identity.create_user(system_context("tests"), username=name, role=role, password=PASSWORD)
    return RequestContext(svc.identity.login(name, PASSWORD, source_ip=None, request_id=None).principal)


def _actions(svc: Services, approval_id: uuid.UUID) -> list[tuple[str, str, str]]:
    svc.audit.flush()
    with svc.db() as s:
        rows = s.execute(select(AuditEvent.action, AuditEvent.actor, AuditEvent.outcome)
                         .where(AuditEvent.object_id == str(approval_id)).order_by(AuditEvent.seq)).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def test_a_destroy_waits_for_two_other_officers_then_runs_as_its_requester(held: Services) -> None:
    alice, bob, carol = (_person(held, "key-officer") for _ in range(3))
    auditor = _person(held, "auditor")
    key = held.keys.create(alice, KeySpec(name=unique("held")))
    held.keys.revoke(alice, str(key.id), reason="cessation-of-operation")
    with pytest.raises(ApprovalPending) as e:
        held.keys.destroy(alice, str(key.id))
    req = e.value.request
    assert (req.action, req.required, req.state) == ("key.destroy", 2, "pending")
    assert held.keys.get(alice, str(key.id)).versions[0].state != "destroyed"  # nothing happened yet
    assert translate(e.value)[0].name == "PERMISSION_DENIED" and str(req.id) in translate(e.value)[1]

    with pytest.raises(Forbidden) as own:
        held.approvals.approve(alice, req.id)
    assert own.value.code == "own_request"
    with pytest.raises(Forbidden):
        held.approvals.approve(auditor, req.id)  # lacks keys:destroy
    assert not held.approvals.approve(bob, req.id).executed
    with pytest.raises(Conflict) as again:
        held.approvals.approve(bob, req.id)
    assert again.value.code == "approval_repeated"
    done = held.approvals.approve(carol, req.id)
    assert done.executed and done.request.state == "executed"
    assert held.keys.get(alice, str(key.id)).versions[0].state == "destroyed"
    names = (alice.principal.name, bob.principal.name, carol.principal.name)
    assert _actions(held, req.id) == [
        ("approval.request", names[0], "allowed"),
        ("approval.approve", names[0], "denied"), ("approval.approve", auditor.principal.name, "denied"),
        ("approval.approve", names[1], "allowed"), ("approval.approve", names[2], "allowed"),
        ("approval.execute", names[0], "allowed")]
    held.audit.flush()
    with held.db() as s:
        destroyed = s.execute(select(AuditEvent.actor).where(AuditEvent.action == "key.destroy",
                                                             AuditEvent.object_id == str(key.id))).scalar_one()
    assert destroyed == names[0]  # the action is the requester's


def test_rejected_and_expired_requests_never_run(held: Services) -> None:
    alice, bob = _person(held, "key-officer"), _person(held, "key-officer")
    key = held.keys.create(alice, KeySpec(name=unique("kept"), activate=False))
    with pytest.raises(ApprovalPending) as e:
        held.keys.destroy(alice, str(key.id))
    rejected = held.approvals.reject(bob, e.value.request.id)
    assert rejected.state == "rejected"
    with pytest.raises(Conflict) as closed:
        held.approvals.approve(bob, rejected.id)
    assert closed.value.code == "approval_closed"
    with pytest.raises(ApprovalPending) as e2:
        held.keys.destroy(alice, str(key.id))
    with held.db.begin() as s:
        s.execute(update(ApprovalRequest).where(ApprovalRequest.id == e2.value.request.id)
                  .values(expires_at=e2.value.request.created_at - timedelta(seconds=1)))
    with pytest.raises(Conflict):
        held.approvals.approve(bob, e2.value.request.id)
    assert [r.state for r in held.approvals.list(bob) if r.id == e2.value.request.id] == ["expired"]
    assert held.keys.get(alice, str(key.id)).versions[0].state == "pre-active"


def test_role_changes_and_kek_rotation_are_held_too_and_the_cli_is_not(held: Services) -> None:
    ann, ben = _person(held, "admin"), _person(held, "admin")
    target = _person(held, "auditor")
    with pytest.raises(ApprovalPending) as e:
        held.identity.update_user(ann, target.principal.user_id, role="key-officer")  # type: ignore[arg-type]
    assert held.approvals.approve(ben, e.value.request.id).executed
    users = {u.username: u.role for u in held.identity.list_users(ann)}
    assert users[target.principal.name] == "key-officer"
    held.identity.update_user(ann, target.principal.user_id, full_name="Ann's colleague")  # type: ignore[arg-type]
    with pytest.raises(ApprovalPending) as k:
        held.keks.start_rotation(ann)
    assert held.approvals.approve(ben, k.value.request.id).executed
    # The server's own CLI (a system actor) is not held: whoever runs it holds the HSM's PINs anyway.
    key = held.keys.create(ann, KeySpec(name=unique("cli"), activate=False))
    assert held.keys.destroy(system_context("cli"), str(key.id)).versions[0].state == "destroyed"


def test_rest_answers_202_with_the_request_and_approvers_sign_in_to_approve(held: Services) -> None:
    alice, bob = _person(held, "key-officer"), _person(held, "key-officer")
    tokens = {c.principal.name: held.identity.create_token(c, name="t", scopes=None, expires_in_days=1).secret
              for c in (alice, bob)}
    key = held.keys.create(alice, KeySpec(name=unique("rest-held"), activate=False))
    with serve(held) as url:
        def as_(c: RequestContext) -> httpx.Client:
            return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens[c.principal.name]}"})

        with as_(alice) as a, as_(bob) as b:
            r = a.post(f"/api/v1/keys/{key.id}/destroy", json={})
            assert r.status_code == 202 and r.json()["code"] == "approval_required", r.text
            rid = r.json()["approval"]["id"]
            assert r.json()["approval"]["state"] == "pending" and r.json()["approval"]["required"] == 2
            listed: Any = b.get("/api/v1/approvals", params={"state": "pending"}).json()
            assert rid in [x["id"] for x in listed]
            # A token is a program's credential, whoever it belongs to: it never approves.
            r = b.post(f"/api/v1/approvals/{rid}/approve")
            assert r.status_code == 403 and r.json()["code"] == "approver_not_a_person", r.text
            with session(url, bob.principal.name, PASSWORD) as person:
                r = person.post(f"/api/v1/approvals/{rid}/approve")
            assert r.status_code == 200 and r.json()["executed"] is False, r.text
            assert a.post(f"/api/v1/approvals/{rid}/approve").json()["code"] == "own_request"
            assert b.get(f"/api/v1/approvals/{rid}").json()["approvals"][0]["by"] == bob.principal.name


def test_a_plaintext_export_over_kmip_waits_for_approval_then_goes_once(held: Services, tmp_path: Path) -> None:
    """KMIP Get cannot wait: it is refused (Permission Denied, the request's id in the
    message) and asking again reuses the request; once another person approves, the
    client's next Get of that key succeeds — once."""
    from kmip.core import enums
    from kmip.pie.exceptions import KmipOperationFailure

    from keyserver.kmip.server import build_listener
    from tests.kmip.conftest import issue_client, make_client

    officer = _person(held, "key-officer")
    listener = build_listener(held, port=0)
    listener.start()
    try:
        files = issue_client(held, tmp_path, "kmip-client")
        with make_client(files, listener.port) as program:
            uid = program.create(enums.CryptographicAlgorithm.AES, 256, name=unique("held-export"))
            program.activate(uid)
            ids = []
            for _ in range(2):
                with pytest.raises(KmipOperationFailure) as e:
                    program.get(uid)
                assert e.value.reason == enums.ResultReason.PERMISSION_DENIED
                ids.append(next(w for w in e.value.message.split() if w.count("-") == 4))
            assert ids[0] == ids[1]  # asking again: the same request
            assert held.approvals.approve(officer, uuid.UUID(ids[0])).executed
            assert len(program.get(uid).value) == 32  # the grant, used
            with pytest.raises(KmipOperationFailure):
                program.get(uid)  # once only
            wrapped_ok = program.get_attributes(uid)  # reading attributes is not export
            assert wrapped_ok[0] == uid
    finally:
        listener.stop()
    assert ("approval.use", f"kmip:{files.name}", "allowed") in _actions(held, uuid.UUID(ids[0]))
