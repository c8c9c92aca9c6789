"""KMIP tenancy (issue 28, docs/kmip.md "Tenancy"): through PyKMIP's ProxyKmipClient over
real mutual TLS, clients of different groups cannot see, use or destroy each other's
objects; grants make an object visible with exactly their rights, and their deletion
hides it on the very next request of the same connection; clients of one group share;
an admin-role client sees all; a key made over REST is seen once it is assigned."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from kmip.core import enums
from kmip.pie.exceptions import KmipOperationFailure
from sqlalchemy import select

from keyserver.kmip.listener import KmipListener
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.conftest import unique
from tests.kmip.conftest import ClientFiles, make_client
from tests.kmip.test_interop import name_attr

R = enums.ResultReason
AES = enums.CryptographicAlgorithm.AES


def reason(call: Callable[[], Any]) -> tuple[Any, str]:
    with pytest.raises(KmipOperationFailure) as e:
        call()
    return e.value.reason, e.value.message


@contextmanager
def opened(files: ClientFiles, port: int) -> Iterator[Any]:
    client = make_client(files, port)
    client.open()
    try:
        yield client
    finally:
        client.close()


def denied(services: Services, files: ClientFiles) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.actor == f"kmip:{files.name}",
                                                       AuditEvent.outcome == "denied")
                              .order_by(AuditEvent.seq)).scalars())


def key_in_group(client: Any, **kw: Any) -> str:
    uid = client.create(AES, 256, name=unique("tenant"), **kw)
    client.activate(uid)
    return str(uid)


def grant(admin: httpx.Client, **body: Any) -> dict[str, Any]:
    r = admin.post("/api/v1/kmip/grants", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_clients_of_two_groups_cannot_locate_get_use_revoke_or_destroy_each_others_keys(
        kmip_files: Callable[..., ClientFiles], kmip_listener: KmipListener, services: Services) -> None:
    a_files, b_files = kmip_files("kmip-client"), kmip_files("kmip-client")
    assert a_files.group != b_files.group
    with opened(a_files, kmip_listener.port) as a, opened(b_files, kmip_listener.port) as b:
        name = unique("vsphere-key")
        uid = a.create(AES, 256, name=name)
        a.activate(uid)
        ciphertext, iv = a.encrypt(b"vm disk", uid=uid)
        mine = [key_in_group(b) for _ in range(3)]

        assert b.locate(attributes=[name_attr(name)]) == []
        assert uid not in b.locate() and set(mine) <= set(b.locate())
        refusals = {
            "Get": lambda: b.get(uid), "GetAttributes": lambda: b.get_attributes(uid),
            "GetAttributeList": lambda: b.get_attribute_list(uid),
            "Encrypt": lambda: b.encrypt(b"x", uid=uid),
            "Decrypt": lambda: b.decrypt(ciphertext, uid=uid, iv_counter_nonce=iv),
            "Activate": lambda: b.activate(uid), "ReKey": lambda: b.rekey(uid=uid),
            "Revoke": lambda: b.revoke(enums.RevocationReasonCode.KEY_COMPROMISE, uid),
            "Destroy": lambda: b.destroy(uid),
        }
        for operation, call in refusals.items():
            got, message = reason(call)
            # exactly what a key that does not exist answers: tenancy is no existence oracle
            assert (got, message) == (R.ITEM_NOT_FOUND, f"no KMIP object with unique identifier '{uid}'"), operation
        absent = "00000000-0000-4000-8000-000000000000"
        assert reason(lambda: b.get(absent)) == (R.ITEM_NOT_FOUND, f"no KMIP object with unique identifier '{absent}'")

        # the owner's key is untouched, and usable by its owner
        assert a.decrypt(ciphertext, uid=uid, iv_counter_nonce=iv) == b"vm disk"
        assert len(a.get(uid).value) == 32
        # and the other way round
        assert not set(mine) & set(a.locate())
        assert reason(lambda: a.get(mine[0]))[0] == R.ITEM_NOT_FOUND

        # Locate's paging counts only what the caller sees
        pages = [b.locate(maximum_items=1, offset_items=i) for i in range(3)]
        assert [p for page in pages for p in page] == b.locate(maximum_items=3)

    records = denied(services, b_files)
    hidden = [r for r in records if r.details.get("reason") == "not visible to this client"]
    # one record per refusal, naming the key (the answer named nothing)
    assert len(hidden) == len(refusals) and {r.object_type for r in hidden} == {"key"}
    assert {r.action for r in hidden} >= {"kmip.get_attributes", "key.encrypt", "key.decrypt"}
    assert [r.object_id for r in records if r not in hidden] == [absent]  # the dispatcher's, for the absent one


def test_a_key_grant_gives_exactly_its_rights_and_its_deletion_hides_the_key_on_the_next_request(
        kmip_files: Callable[..., ClientFiles], kmip_listener: KmipListener, admin: httpx.Client,
        services: Services) -> None:
    owner_files, backup_files = kmip_files("kmip-client"), kmip_files("kmip-client")
    with opened(owner_files, kmip_listener.port) as owner, opened(backup_files, kmip_listener.port) as backup:
        name = unique("shared-by-grant")
        uid = owner.create(AES, 256, name=name)
        owner.activate(uid)
        other = key_in_group(owner)  # not granted: stays hidden
        made = grant(admin, grantee=f"client:{backup_files.name}", key=name, rights=["read", "use"])
        assert made["target_kind"] == "key" and made["target_name"] == name and made["rights"] == ["read", "use"]

        assert backup.locate(attributes=[name_attr(name)]) == [uid]
        assert backup.get_attributes(uid)[0] == uid
        ciphertext, iv = backup.encrypt(b"backup set", uid=uid)
        assert owner.decrypt(ciphertext, uid=uid, iv_counter_nonce=iv) == b"backup set"
        # read without export still cannot Get; no destroy right, no lifecycle
        for call in (lambda: backup.get(uid), lambda: backup.revoke(enums.RevocationReasonCode.UNSPECIFIED, uid),
                     lambda: backup.destroy(uid), lambda: backup.activate(uid), lambda: backup.rekey(uid=uid)):
            assert reason(call)[0] == R.PERMISSION_DENIED
        assert reason(lambda: backup.get(other))[0] == R.ITEM_NOT_FOUND

        r = admin.delete(f"/api/v1/kmip/grants/{made['id']}")
        assert r.status_code == 204
        # the very next request, on the same connection
        assert reason(lambda: backup.encrypt(b"x", uid=uid))[0] == R.ITEM_NOT_FOUND
        assert backup.locate(attributes=[name_attr(name)]) == []

        # export and destroy, granted, do what they say
        made = grant(admin, grantee=f"client:{backup_files.name}", key=name, rights=["export", "destroy"])
        assert owner.get(uid).value == backup.get(uid).value
        assert backup.locate(attributes=[name_attr(name)]) == []  # no read right: not located
        backup.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
        # ... except shredding what the owner still uses: a destroy right is not a right
        # to make another client's data unreadable (decision 0024; retire the version first)
        refused, why = reason(lambda: backup.destroy(uid))
        assert refused == R.PERMISSION_DENIED and "in use" in why and owner_files.name in why, why
        unused_name = unique("destroy-by-grant")
        unused = owner.create(AES, 256, name=unused_name)
        owner.activate(unused)
        grant(admin, grantee=f"client:{backup_files.name}", key=unused_name, rights=["export", "destroy"])
        backup.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, unused)
        backup.destroy(unused)
    rights = [r.details.get("granted") for r in denied(services, backup_files) if "granted" in r.details]
    assert rights and all(g == ["read", "use"] for g in rights)


def test_a_group_grant_covers_every_object_of_the_group_for_every_client_of_the_grantee_group(
        kmip_files: Callable[..., ClientFiles], kmip_listener: KmipListener, admin: httpx.Client) -> None:
    vcenter = kmip_files("kmip-client")
    nas_group = unique("nas")
    nas1, nas2 = kmip_files("kmip-client", nas_group), kmip_files("kmip-client", nas_group)
    with opened(vcenter, kmip_listener.port) as v:
        keys = [key_in_group(v) for _ in range(2)]
        public, private = v.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
    made = grant(admin, grantee=f"group:{nas_group}", group=vcenter.group, rights=["read", "export"])
    assert made["target_kind"] == "group" and made["target"] == vcenter.group
    for files in (nas1, nas2):
        with opened(files, kmip_listener.port) as nas:
            assert set(keys) | {public, private} <= set(nas.locate())
            assert all(len(nas.get(k).value) == 32 for k in keys)
            assert nas.get(public).key_format_type == enums.KeyFormatType.X_509
            assert reason(lambda: nas.destroy(keys[0]))[0] == R.PERMISSION_DENIED
    listed = admin.get("/api/v1/kmip/groups").json()
    [group] = [g for g in listed if g["name"] == nas_group]
    assert sorted(group["clients"]) == sorted([nas1.name, nas2.name]) and group["objects"] == 0
    [theirs] = [g for g in listed if g["name"] == vcenter.group]
    assert theirs["clients"] == [vcenter.name] and theirs["objects"] == 4


def test_clients_of_one_group_share_its_objects(kmip_files: Callable[..., ClientFiles],
                                                kmip_listener: KmipListener) -> None:
    cluster = unique("vcenter-cluster")
    first, second = kmip_files("kmip-client", cluster), kmip_files("kmip-client", cluster)
    with opened(first, kmip_listener.port) as one, opened(second, kmip_listener.port) as two:
        uid = key_in_group(one)
        assert uid in two.locate()
        assert two.get(uid).value == one.get(uid).value
        ciphertext, iv = two.encrypt(b"shared", uid=uid)
        assert one.decrypt(ciphertext, uid=uid, iv_counter_nonce=iv) == b"shared"
        two.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
        # One member cannot shred what another still uses (decision 0024): retire first.
        refused, why = reason(lambda: two.destroy(uid))
        assert refused == R.PERMISSION_DENIED and "in use" in why, why


def test_an_admin_role_client_sees_every_object(kmip_files: Callable[..., ClientFiles],
                                                kmip_listener: KmipListener) -> None:
    tenant, operator = kmip_files("kmip-client"), kmip_files("admin")
    with opened(tenant, kmip_listener.port) as t, opened(operator, kmip_listener.port) as o:
        name = unique("seen-by-admin")
        uid = t.create(AES, 256, name=name)
        t.activate(uid)
        assert o.locate(attributes=[name_attr(name)]) == [uid]
        assert o.get(uid).value == t.get(uid).value


def test_a_rest_key_is_invisible_until_assigned_a_group_or_granted(
        kmip_files: Callable[..., ClientFiles], kmip_listener: KmipListener, admin: httpx.Client,
        services: Services) -> None:
    files = kmip_files("kmip-client")
    name = unique("from-rest")
    r = admin.post("/api/v1/keys", json={"name": name})
    assert r.status_code == 201 and r.json()["kmip_group"] is None
    with opened(files, kmip_listener.port) as c:
        assert c.locate(attributes=[name_attr(name)]) == []
        r = admin.patch(f"/api/v1/keys/{name}", json={"kmip_group": files.group})
        assert r.status_code == 200 and r.json()["kmip_group"] == files.group
        [uid] = c.locate(attributes=[name_attr(name)])
        assert len(c.get(uid).value) == 32  # Get's cache now holds the key
        r = admin.patch(f"/api/v1/keys/{name}", json={"kmip_group": None})
        assert r.status_code == 200 and r.json()["kmip_group"] is None
        assert reason(lambda: c.get(uid))[0] == R.ITEM_NOT_FOUND  # the same connection, next request
        made = grant(admin, grantee=f"client:{files.name}", key=name, rights=["read", "export"])
        assert len(c.get(uid).value) == 32
        admin.delete(f"/api/v1/kmip/grants/{made['id']}")
        assert reason(lambda: c.get(uid))[0] == R.ITEM_NOT_FOUND
    services.audit.flush()
    updates = admin.get("/api/v1/audit/events", params={"action": "key.update", "object_id": r.json()["id"],
                                                        "limit": 5}).json()["items"]
    assert [u["details"]["changed"].get("kmip_group", "-") for u in updates][:2] == [None, files.group]


def test_moving_a_client_to_another_group_applies_on_its_next_request(
        kmip_files: Callable[..., ClientFiles], kmip_listener: KmipListener, admin: httpx.Client) -> None:
    a_files, b_files = kmip_files("kmip-client"), kmip_files("kmip-client")
    with opened(a_files, kmip_listener.port) as a, opened(b_files, kmip_listener.port) as b:
        uid = key_in_group(a)
        assert reason(lambda: b.get(uid))[0] == R.ITEM_NOT_FOUND
        r = admin.patch(f"/api/v1/kmip/clients/{b_files.client_id}", json={"group": a_files.group})
        assert r.status_code == 200 and r.json()["group"] == a_files.group
        assert b.get(uid).value == a.get(uid).value
        made = key_in_group(b)  # made in its new group: the first client sees it
        assert a.get(made).value
