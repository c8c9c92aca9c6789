"""End to end with PyKMIP's ProxyKmipClient over real mutual TLS."""

from __future__ import annotations

from typing import Any

import pytest
from kmip.core import enums
from kmip.pie.exceptions import KmipOperationFailure

from tests.conftest import unique


def test_create_activate_get_locate_revoke_destroy(kmip: Any) -> None:
    name = unique("kmip")
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
    attrs = {a.attribute_name.value: a.attribute_value for a in kmip.get_attributes(uid)[1]}
    assert attrs["State"].value == enums.State.PRE_ACTIVE
    assert attrs["Cryptographic Length"].value == 256
    # KMIP lets a client retrieve Pre-Active material (the state restricts use, not Get)
    pre_active = kmip.get(uid)
    kmip.activate(uid)
    key = kmip.get(uid)
    assert len(key.value) == 32 and key.value == pre_active.value
    assert kmip.locate(attributes=[_name_attr(name)]) == [uid]
    kmip.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
    kmip.destroy(uid)
    attrs = {a.attribute_name.value: a.attribute_value for a in kmip.get_attributes(uid)[1]}
    assert attrs["State"].value == enums.State.DESTROYED
    with pytest.raises(KmipOperationFailure) as e:
        kmip.get(uid)
    assert e.value.reason == enums.ResultReason.ILLEGAL_OPERATION and "erased" in str(e.value)
    # destroyed objects are found only by asking for their state; the name is free again
    assert kmip.locate(attributes=[_name_attr(name)]) == []
    destroyed = _state_attr(enums.State.DESTROYED)
    assert kmip.locate(attributes=[_name_attr(name), destroyed]) == [uid]
    again = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
    assert again != uid and kmip.locate(attributes=[_name_attr(name)]) == [again]


def _state_attr(state: enums.State) -> Any:
    from kmip.core.factories.attributes import AttributeFactory

    return AttributeFactory().create_attribute(enums.AttributeType.STATE, state)


def _name_attr(name: str) -> Any:
    from kmip.core.factories.attributes import AttributeFactory

    return AttributeFactory().create_attribute(enums.AttributeType.NAME, name)


@pytest.mark.parametrize("length", [128, 192, 256])
def test_create_lengths(kmip: Any, length: int) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, length, name=unique(f"aes{length}"))
    kmip.activate(uid)
    assert len(kmip.get(uid).value) == length // 8
