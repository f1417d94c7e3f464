from aaa._proto.aaa.v1 import routing_pb2 as _routing_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("loaded", "sha256", "rules", "file")
    LOADED_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    loaded: bool
    sha256: str
    rules: _containers.RepeatedScalarFieldContainer[str]
    file: str
    def __init__(self, loaded: _Optional[bool] = ..., sha256: _Optional[str] = ..., rules: _Optional[_Iterable[str]] = ..., file: _Optional[str] = ...) -> None: ...

class ReloadPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadPolicyResponse(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: GetPolicyResponse
    def __init__(self, policy: _Optional[_Union[GetPolicyResponse, _Mapping]] = ...) -> None: ...
