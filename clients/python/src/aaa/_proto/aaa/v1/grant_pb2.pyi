import datetime

from aaa._proto.aaa.v1 import routing_pb2 as _routing_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GrantScope(_message.Message):
    __slots__ = ("run_id", "labels", "started_by")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    labels: _containers.ScalarMap[str, str]
    started_by: str
    def __init__(self, run_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., started_by: _Optional[str] = ...) -> None: ...

class CreateGrantRequest(_message.Message):
    __slots__ = ("tool", "scope", "condition", "arguments_sha256", "expires_at", "max_uses", "reason", "request_id")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_USES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tool: str
    scope: GrantScope
    condition: str
    arguments_sha256: str
    expires_at: _timestamp_pb2.Timestamp
    max_uses: int
    reason: str
    request_id: str
    def __init__(self, tool: _Optional[str] = ..., scope: _Optional[_Union[GrantScope, _Mapping]] = ..., condition: _Optional[str] = ..., arguments_sha256: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_uses: _Optional[int] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateGrantResponse(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: Grant
    def __init__(self, grant: _Optional[_Union[Grant, _Mapping]] = ...) -> None: ...

class RevokeGrantRequest(_message.Message):
    __slots__ = ("id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeGrantResponse(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: Grant
    def __init__(self, grant: _Optional[_Union[Grant, _Mapping]] = ...) -> None: ...

class ListGrantsRequest(_message.Message):
    __slots__ = ("include_revoked", "tool")
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    include_revoked: bool
    tool: str
    def __init__(self, include_revoked: _Optional[bool] = ..., tool: _Optional[str] = ...) -> None: ...

class ListGrantsResponse(_message.Message):
    __slots__ = ("grants",)
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    def __init__(self, grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("id", "tool", "scope", "condition", "arguments_sha256", "expires_at", "max_uses", "reason", "created_by", "created_at", "creator_groups", "uses", "uses_left", "revoked_at", "revoked_by", "revoke_reason", "active")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_USES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATOR_GROUPS_FIELD_NUMBER: _ClassVar[int]
    USES_FIELD_NUMBER: _ClassVar[int]
    USES_LEFT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    REVOKE_REASON_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    id: str
    tool: str
    scope: GrantScope
    condition: str
    arguments_sha256: str
    expires_at: _timestamp_pb2.Timestamp
    max_uses: int
    reason: str
    created_by: str
    created_at: _timestamp_pb2.Timestamp
    creator_groups: _containers.RepeatedScalarFieldContainer[str]
    uses: int
    uses_left: int
    revoked_at: _timestamp_pb2.Timestamp
    revoked_by: str
    revoke_reason: str
    active: bool
    def __init__(self, id: _Optional[str] = ..., tool: _Optional[str] = ..., scope: _Optional[_Union[GrantScope, _Mapping]] = ..., condition: _Optional[str] = ..., arguments_sha256: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_uses: _Optional[int] = ..., reason: _Optional[str] = ..., created_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., creator_groups: _Optional[_Iterable[str]] = ..., uses: _Optional[int] = ..., uses_left: _Optional[int] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_by: _Optional[str] = ..., revoke_reason: _Optional[str] = ..., active: _Optional[bool] = ...) -> None: ...
