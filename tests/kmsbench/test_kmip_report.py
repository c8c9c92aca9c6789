"""kms-bench kmip: its requests are what they claim (decoded with PyKMIP's codec) and its
report states each target with the measured ratio, and refusals as refusals."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import messages
from kmip.core.utils import BytearrayStream

from kmsbench import kmip_load


def decode(msg: bytes) -> Any:
    m = messages.RequestMessage()
    m.read(BytearrayStream(msg))
    return m.batch_items[0]


def test_requests_decode_to_their_operations() -> None:
    enc = decode(kmip_load._request("encrypt", "uid-1"))
    assert enc.operation.value == enums.Operation.ENCRYPT
    assert enc.request_payload.data == bytes(kmip_load.ENCRYPT_BYTES)
    assert enc.request_payload.cryptographic_parameters.block_cipher_mode == enums.BlockCipherMode.CBC
    sign = decode(kmip_load._request("sign", "uid-2"))
    assert sign.operation.value == enums.Operation.SIGN and sign.request_payload.unique_identifier == "uid-2"
    revoke = decode(kmip_load._request("revoke", "uid-3"))
    assert revoke.request_payload.revocation_reason.revocation_code.value == \
        enums.RevocationReasonCode.CESSATION_OF_OPERATION
    assert decode(kmip_load._request("destroy", "uid-4")).operation.value == enums.Operation.DESTROY
    pair = decode(kmip_load._request("create_key_pair", None)).request_payload
    assert pair.common_template_attribute is not None


def test_uid_is_read_from_a_response_without_decoding_it() -> None:
    from kmip.core.messages import contents, payloads

    header = messages.ResponseHeader(protocol_version=contents.ProtocolVersion(1, 2),
                                     time_stamp=contents.TimeStamp(0), batch_count=contents.BatchCount(1))
    item = messages.ResponseBatchItem(
        operation=contents.Operation(enums.Operation.CREATE),
        result_status=contents.ResultStatus(enums.ResultStatus.SUCCESS),
        response_payload=payloads.CreateResponsePayload(object_type=enums.ObjectType.SYMMETRIC_KEY,
                                                        unique_identifier="6f1c-abc"))
    stream = BytearrayStream()
    messages.ResponseMessage(response_header=header, batch_items=[item]).write(stream)
    response = bytes(stream.buffer)
    assert kmip_load._ok(response) and kmip_load._uid_fast(response) == "6f1c-abc"


def test_report_states_targets_and_refusals() -> None:
    r = {"machine": {"cpu": "cpu", "cores": 2, "memory_gib": 24}, "when": "now", "duration_s": 5, "repeats": 3,
         "ops": ["get", "lifecycle", "sign"],
         "servers": {"strongroom": {"get": {"50": 900.0}, "lifecycle": {"8": 60.0}, "sign": {"8": 0.0}},
                     "pykmip": {"get": {"50": 300.0}, "lifecycle": {"8": 30.0}, "sign": {"8": 40.0}}},
         "runs": {}, "refused": {"strongroom": {"sign": "OPERATION_NOT_SUPPORTED: no"}}}
    report = kmip_load.render(r, [8, 50])
    assert "| Get at 50 connections ≥ 2x PyKMIP | 3.00x | yes |" in report
    assert "| Lifecycle (Create→Activate→Get→Revoke→Destroy) at 8 connections ≥ 3x PyKMIP | 2.00x | no |" in report
    assert "refused (OPERATION_NOT_SUPPORTED: no)" in report
