from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Node(_message.Message):
    __slots__ = ("kind", "organization", "cluster", "instance")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ORGANIZATION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    organization: str
    cluster: str
    instance: str
    def __init__(self, kind: _Optional[str] = ..., organization: _Optional[str] = ..., cluster: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("node", "version_info", "response_nonce", "error_detail")
    NODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_INFO_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_NONCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_DETAIL_FIELD_NUMBER: _ClassVar[int]
    node: Node
    version_info: str
    response_nonce: str
    error_detail: ErrorDetail
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ..., version_info: _Optional[str] = ..., response_nonce: _Optional[str] = ..., error_detail: _Optional[_Union[ErrorDetail, _Mapping]] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("version_info", "nonce", "kind", "files")
    VERSION_INFO_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    version_info: str
    nonce: str
    kind: str
    files: _containers.RepeatedCompositeFieldContainer[ConfigFile]
    def __init__(self, version_info: _Optional[str] = ..., nonce: _Optional[str] = ..., kind: _Optional[str] = ..., files: _Optional[_Iterable[_Union[ConfigFile, _Mapping]]] = ...) -> None: ...

class ConfigFile(_message.Message):
    __slots__ = ("name", "content")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    content: bytes
    def __init__(self, name: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...
