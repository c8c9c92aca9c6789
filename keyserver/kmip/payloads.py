"""Payloads PyKMIP 0.11's codec lacks, written the way its own are (kmip.core.messages.
payloads): typed properties over PyKMIP primitives, read/write of a Request/Response
Payload structure, and a registration with PyKMIP's payload factories so that its
message decoder builds them like any other.

AddAttribute (KMIP 1.x, §4.13): request = Unique Identifier (optional) + Attribute;
response = Unique Identifier + Attribute. KMIP 2.0's form is not served (see discovery).
MACVerify and RNGRetrieve (KMIP 1.2 §4.34, §4.35), without streaming (no correlation
value, init or final indicator). Sign's request (KMIP 1.4 §4.31) with Digested Data, in
place of PyKMIP's, which has Data only.
"""

from __future__ import annotations

from typing import Any

from kmip.core import attributes, enums, exceptions, objects, primitives, utils
from kmip.core.factories.payloads.request import RequestPayloadFactory
from kmip.core.factories.payloads.response import ResponsePayloadFactory
from kmip.core.messages.payloads import base


class _UidAndAttribute:
    """Unique Identifier (optional on requests) and one Attribute, KMIP 1.x."""

    _unique_identifier: Any
    _attribute: Any
    length: int
    _uid_required = False
    _name = ""

    @property
    def unique_identifier(self) -> str | None:
        return str(self._unique_identifier.value) if self._unique_identifier is not None else None

    @unique_identifier.setter
    def unique_identifier(self, value: str | None) -> None:
        if value is None:
            self._unique_identifier = None
        elif isinstance(value, str):
            self._unique_identifier = primitives.TextString(value, tag=enums.Tags.UNIQUE_IDENTIFIER)
        else:
            raise TypeError("The unique identifier must be a string.")

    @property
    def attribute(self) -> Any:
        return self._attribute

    @attribute.setter
    def attribute(self, value: Any) -> None:
        if value is not None and not isinstance(value, objects.Attribute):
            raise TypeError("The attribute must be an Attribute object.")
        self._attribute = value

    def _read_fields(self, input_buffer: Any, kmip_version: enums.KMIPVersion) -> None:
        if kmip_version >= enums.KMIPVersion.KMIP_2_0:
            raise exceptions.InvalidKmipEncoding(f"{self._name} is implemented for KMIP 1.x only.")
        local = utils.BytearrayStream(input_buffer.read(self.length))
        if self.is_tag_next(enums.Tags.UNIQUE_IDENTIFIER, local):  # type: ignore[attr-defined]
            self._unique_identifier = primitives.TextString(tag=enums.Tags.UNIQUE_IDENTIFIER)
            self._unique_identifier.read(local, kmip_version=kmip_version)
        elif self._uid_required:
            raise exceptions.InvalidKmipEncoding(f"The {self._name} encoding is missing the unique identifier.")
        else:
            self._unique_identifier = None
        if not self.is_tag_next(enums.Tags.ATTRIBUTE, local):  # type: ignore[attr-defined]
            raise exceptions.InvalidKmipEncoding(f"The {self._name} encoding is missing the attribute.")
        self._attribute = objects.Attribute()
        self._attribute.read(local, kmip_version=kmip_version)
        self.is_oversized(local)  # type: ignore[attr-defined]

    def _write_fields(self, kmip_version: enums.KMIPVersion) -> utils.BytearrayStream:
        if kmip_version >= enums.KMIPVersion.KMIP_2_0:
            raise exceptions.InvalidField(f"{self._name} is implemented for KMIP 1.x only.")
        local = utils.BytearrayStream()
        if self._unique_identifier is not None:
            self._unique_identifier.write(local, kmip_version=kmip_version)
        elif self._uid_required:
            raise exceptions.InvalidField(f"The {self._name} is missing the unique identifier field.")
        if self._attribute is None:
            raise exceptions.InvalidField(f"The {self._name} is missing the attribute field.")
        self._attribute.write(local, kmip_version=kmip_version)
        return local

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _UidAndAttribute)
        return self.unique_identifier == other.unique_identifier and self.attribute == other.attribute

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(unique_identifier={self.unique_identifier!r}, "
                f"attribute={self.attribute!r})")


class AddAttributeRequestPayload(_UidAndAttribute, base.RequestPayload):  # type: ignore[misc]
    _name = "AddAttribute request payload"

    def __init__(self, unique_identifier: str | None = None, attribute: Any = None) -> None:
        base.RequestPayload.__init__(self)
        self.unique_identifier = unique_identifier
        self.attribute = attribute

    def read(self, input_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        base.RequestPayload.read(self, input_buffer, kmip_version=kmip_version)
        self._read_fields(input_buffer, kmip_version)

    def write(self, output_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        local = self._write_fields(kmip_version)
        self.length = local.length()
        base.RequestPayload.write(self, output_buffer, kmip_version=kmip_version)
        output_buffer.write(local.buffer)


class AddAttributeResponsePayload(_UidAndAttribute, base.ResponsePayload):  # type: ignore[misc]
    _name = "AddAttribute response payload"
    _uid_required = True

    def __init__(self, unique_identifier: str | None = None, attribute: Any = None) -> None:
        base.ResponsePayload.__init__(self)
        self.unique_identifier = unique_identifier
        self.attribute = attribute

    def read(self, input_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        base.ResponsePayload.read(self, input_buffer, kmip_version=kmip_version)
        self._read_fields(input_buffer, kmip_version)

    def write(self, output_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        local = self._write_fields(kmip_version)
        self.length = local.length()
        base.ResponsePayload.write(self, output_buffer, kmip_version=kmip_version)
        output_buffer.write(local.buffer)


def register() -> None:
    """Teach PyKMIP's payload factories (hence its message decoder) our payloads. The
    factories raise NotImplementedError for these operations, so nothing is overridden
    that PyKMIP implements."""
    RequestPayloadFactory._create_add_attribute_payload = lambda self: AddAttributeRequestPayload()
    ResponsePayloadFactory._create_add_attribute_payload = lambda self: AddAttributeResponsePayload()


register()


# --- MACVerify and RNGRetrieve (KMIP 1.2 §4.34, §4.35) -------------------------------------
def _read_items(payload: Any, input_buffer: Any, kmip_version: enums.KMIPVersion,
                fields: tuple[tuple[str, enums.Tags, type], ...]) -> None:
    """Optional fields in order; each read if its tag comes next."""
    local = utils.BytearrayStream(input_buffer.read(payload.length))
    for name, tag, kind in fields:
        if payload.is_tag_next(tag, local):
            item = kind(tag=tag) if kind is not attributes.CryptographicParameters else kind()
            item.read(local, kmip_version=kmip_version)
            setattr(payload, "_" + name, item)
        else:
            setattr(payload, "_" + name, None)
    payload.is_oversized(local)


def _write_items(payload: Any, output_buffer: Any, kmip_version: enums.KMIPVersion, base_cls: Any,
                 fields: tuple[str, ...]) -> None:
    local = utils.BytearrayStream()
    for name in fields:
        item = getattr(payload, "_" + name)
        if item is not None:
            item.write(local, kmip_version=kmip_version)
    payload.length = local.length()
    base_cls.write(payload, output_buffer, kmip_version=kmip_version)
    output_buffer.write(local.buffer)


_Fields = tuple[tuple[str, enums.Tags, type], ...]


class _KeyedDataRequest(base.RequestPayload):  # type: ignore[misc]
    """A request naming a key and the bytes to use it on: Unique Identifier, Cryptographic
    Parameters and Data first, then the fields of its operation (`FIELDS`, in order, each
    optional). MACVerify and Sign read and write through this one place."""

    FIELDS: _Fields = (
        ("unique_identifier", enums.Tags.UNIQUE_IDENTIFIER, primitives.TextString),
        ("cryptographic_parameters", enums.Tags.CRYPTOGRAPHIC_PARAMETERS, attributes.CryptographicParameters),
        ("data", enums.Tags.DATA, primitives.ByteString),
    )

    def __init__(self, **values: Any) -> None:
        super().__init__()
        for name, tag, kind in self.FIELDS:
            value = values.pop(name, None)
            if value is not None and kind is not attributes.CryptographicParameters:
                value = kind(value, tag=tag)
            setattr(self, "_" + name, value)
        if values:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(values)}")

    def _bytes(self, name: str) -> bytes | None:
        item = getattr(self, "_" + name)
        return bytes(item.value) if item is not None else None

    @property
    def unique_identifier(self) -> str | None:
        return str(self._unique_identifier.value) if self._unique_identifier is not None else None

    @property
    def cryptographic_parameters(self) -> Any:
        return self._cryptographic_parameters

    @property
    def data(self) -> bytes | None:
        return self._bytes("data")

    def read(self, input_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        super().read(input_buffer, kmip_version=kmip_version)
        _read_items(self, input_buffer, kmip_version, self.FIELDS)

    def write(self, output_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        _write_items(self, output_buffer, kmip_version, base.RequestPayload,
                     tuple(name for name, _, _ in self.FIELDS))


class MACVerifyRequestPayload(_KeyedDataRequest):
    """Unique Identifier, Cryptographic Parameters, Data, MAC Data (no streaming)."""

    FIELDS = (*_KeyedDataRequest.FIELDS, ("mac_data", enums.Tags.MAC_DATA, primitives.ByteString))

    def __init__(self, unique_identifier: str | None = None, cryptographic_parameters: Any = None,
                 data: bytes | None = None, mac_data: bytes | None = None) -> None:
        super().__init__(unique_identifier=unique_identifier, cryptographic_parameters=cryptographic_parameters,
                         data=data, mac_data=mac_data)

    @property
    def mac_data(self) -> bytes | None:
        return self._bytes("mac_data")


class MACVerifyResponsePayload(base.ResponsePayload):  # type: ignore[misc]
    """Unique Identifier, Validity Indicator."""

    def __init__(self, unique_identifier: str | None = None, valid: bool | None = None) -> None:
        super().__init__()
        self._unique_identifier = (primitives.TextString(unique_identifier, tag=enums.Tags.UNIQUE_IDENTIFIER)
                                   if unique_identifier is not None else None)
        self._validity_indicator = (primitives.Enumeration(
            enums.ValidityIndicator, enums.ValidityIndicator.VALID if valid else enums.ValidityIndicator.INVALID,
            tag=enums.Tags.VALIDITY_INDICATOR) if valid is not None else None)

    @property
    def valid(self) -> bool | None:
        if self._validity_indicator is None:
            return None
        return bool(self._validity_indicator.value == enums.ValidityIndicator.VALID)

    def read(self, input_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        super().read(input_buffer, kmip_version=kmip_version)
        local = utils.BytearrayStream(input_buffer.read(self.length))
        self._unique_identifier = primitives.TextString(tag=enums.Tags.UNIQUE_IDENTIFIER)
        self._unique_identifier.read(local, kmip_version=kmip_version)
        self._validity_indicator = primitives.Enumeration(enums.ValidityIndicator, tag=enums.Tags.VALIDITY_INDICATOR)
        self._validity_indicator.read(local, kmip_version=kmip_version)
        self.is_oversized(local)

    def write(self, output_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        _write_items(self, output_buffer, kmip_version, base.ResponsePayload,
                     ("unique_identifier", "validity_indicator"))


class RNGRetrieveRequestPayload(base.RequestPayload):  # type: ignore[misc]
    """Data Length."""

    def __init__(self, data_length: int | None = None) -> None:
        super().__init__()
        self._data_length = (primitives.Integer(data_length, tag=enums.Tags.DATA_LENGTH)
                             if data_length is not None else None)

    @property
    def data_length(self) -> int | None:
        return int(self._data_length.value) if self._data_length is not None else None

    def read(self, input_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        super().read(input_buffer, kmip_version=kmip_version)
        _read_items(self, input_buffer, kmip_version, (("data_length", enums.Tags.DATA_LENGTH, primitives.Integer),))

    def write(self, output_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        _write_items(self, output_buffer, kmip_version, base.RequestPayload, ("data_length",))


class RNGRetrieveResponsePayload(base.ResponsePayload):  # type: ignore[misc]
    """Data."""

    def __init__(self, data: bytes | None = None) -> None:
        super().__init__()
        self._data = primitives.ByteString(data, tag=enums.Tags.DATA) if data is not None else None

    @property
    def data(self) -> bytes | None:
        return bytes(self._data.value) if self._data is not None else None

    def read(self, input_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        super().read(input_buffer, kmip_version=kmip_version)
        _read_items(self, input_buffer, kmip_version, (("data", enums.Tags.DATA, primitives.ByteString),))

    def write(self, output_buffer: Any, kmip_version: enums.KMIPVersion = enums.KMIPVersion.KMIP_1_0) -> None:
        _write_items(self, output_buffer, kmip_version, base.ResponsePayload, ("data",))


def _register_services() -> None:
    RequestPayloadFactory._create_mac_verify_payload = lambda self: MACVerifyRequestPayload()
    ResponsePayloadFactory._create_mac_verify_payload = lambda self: MACVerifyResponsePayload()
    RequestPayloadFactory._create_rng_retrieve_payload = lambda self: RNGRetrieveRequestPayload()
    ResponsePayloadFactory._create_rng_retrieve_payload = lambda self: RNGRetrieveResponsePayload()


_register_services()


# --- Sign requests with Digested Data (KMIP 1.4 §4.31) -----------------------------------------
# PyKMIP 0.11's Sign request payload knows Data only (and refuses a request without it);
# this one reads every field KMIP 1.4 defines, so that Sign can serve Digested Data and
# refuse streaming by name. (PyKMIP's SignatureVerify request payload has them all.)
class SignRequestPayload(_KeyedDataRequest):
    """Unique Identifier, Cryptographic Parameters, Data or Digested Data, and the
    streaming fields (Correlation Value, Init and Final Indicator: read, to be refused)."""

    FIELDS = (
        *_KeyedDataRequest.FIELDS,
        ("digested_data", enums.Tags.DIGESTED_DATA, primitives.ByteString),
        ("correlation_value", enums.Tags.CORRELATION_VALUE, primitives.ByteString),
        ("init_indicator", enums.Tags.INIT_INDICATOR, primitives.Boolean),
        ("final_indicator", enums.Tags.FINAL_INDICATOR, primitives.Boolean),
    )

    def __init__(self, unique_identifier: str | None = None, cryptographic_parameters: Any = None,
                 data: bytes | None = None, digested_data: bytes | None = None,
                 correlation_value: bytes | None = None) -> None:
        super().__init__(unique_identifier=unique_identifier, cryptographic_parameters=cryptographic_parameters,
                         data=data, digested_data=digested_data, correlation_value=correlation_value)

    @property
    def digested_data(self) -> bytes | None:
        return self._bytes("digested_data")

    @property
    def correlation_value(self) -> bytes | None:
        return self._bytes("correlation_value")

    @property
    def init_indicator(self) -> bool | None:
        return bool(self._init_indicator.value) if self._init_indicator is not None else None

    @property
    def final_indicator(self) -> bool | None:
        return bool(self._final_indicator.value) if self._final_indicator is not None else None


def _register_sign() -> None:
    RequestPayloadFactory._create_sign_payload = lambda self: SignRequestPayload()


_register_sign()
