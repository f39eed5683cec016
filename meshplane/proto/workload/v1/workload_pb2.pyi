from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SignRequest(_message.Message):
    __slots__ = ("csr_pem", "cluster", "instance")
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    csr_pem: str
    cluster: str
    instance: str
    def __init__(self, csr_pem: _Optional[str] = ..., cluster: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class SignResponse(_message.Message):
    __slots__ = ("certificate_chain_pem", "trust_bundle_pem", "not_after_unix")
    CERTIFICATE_CHAIN_PEM_FIELD_NUMBER: _ClassVar[int]
    TRUST_BUNDLE_PEM_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_UNIX_FIELD_NUMBER: _ClassVar[int]
    certificate_chain_pem: str
    trust_bundle_pem: _containers.RepeatedScalarFieldContainer[str]
    not_after_unix: int
    def __init__(self, certificate_chain_pem: _Optional[str] = ..., trust_bundle_pem: _Optional[_Iterable[str]] = ..., not_after_unix: _Optional[int] = ...) -> None: ...
