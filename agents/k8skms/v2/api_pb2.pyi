from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("version", "healthz", "key_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HEALTHZ_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    version: str
    healthz: str
    key_id: str
    def __init__(self, version: _Optional[str] = ..., healthz: _Optional[str] = ..., key_id: _Optional[str] = ...) -> None: ...

class DecryptRequest(_message.Message):
    __slots__ = ("ciphertext", "uid", "key_id", "annotations")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    ciphertext: bytes
    uid: str
    key_id: str
    annotations: _containers.ScalarMap[str, bytes]
    def __init__(self, ciphertext: _Optional[bytes] = ..., uid: _Optional[str] = ..., key_id: _Optional[str] = ..., annotations: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class DecryptResponse(_message.Message):
    __slots__ = ("plaintext",)
    PLAINTEXT_FIELD_NUMBER: _ClassVar[int]
    plaintext: bytes
    def __init__(self, plaintext: _Optional[bytes] = ...) -> None: ...

class EncryptRequest(_message.Message):
    __slots__ = ("plaintext", "uid")
    PLAINTEXT_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    plaintext: bytes
    uid: str
    def __init__(self, plaintext: _Optional[bytes] = ..., uid: _Optional[str] = ...) -> None: ...

class EncryptResponse(_message.Message):
    __slots__ = ("ciphertext", "key_id", "annotations")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    ciphertext: bytes
    key_id: str
    annotations: _containers.ScalarMap[str, bytes]
    def __init__(self, ciphertext: _Optional[bytes] = ..., key_id: _Optional[str] = ..., annotations: _Optional[_Mapping[str, bytes]] = ...) -> None: ...
