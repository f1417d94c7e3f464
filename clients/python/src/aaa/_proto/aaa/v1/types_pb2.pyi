import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ActorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTOR_KIND_UNSPECIFIED: _ClassVar[ActorKind]
    ACTOR_KIND_ENGINE: _ClassVar[ActorKind]
    ACTOR_KIND_WORKER: _ClassVar[ActorKind]
    ACTOR_KIND_CLIENT: _ClassVar[ActorKind]
    ACTOR_KIND_POLICY: _ClassVar[ActorKind]
    ACTOR_KIND_GRANT: _ClassVar[ActorKind]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    RUN_NOT_FOUND: _ClassVar[ErrorReason]
    CALL_NOT_FOUND: _ClassVar[ErrorReason]
    INVALID_FIELD: _ClassVar[ErrorReason]
    PAYLOAD_TOO_LARGE: _ClassVar[ErrorReason]
    RESERVED_EVENT_TYPE: _ClassVar[ErrorReason]
    RUN_FINISHED: _ClassVar[ErrorReason]
    STALE_ATTEMPT: _ClassVar[ErrorReason]
    ARGUMENTS_MISMATCH: _ClassVar[ErrorReason]
    TOOL_NOT_REGISTERED: _ClassVar[ErrorReason]
    INVALID_TOKEN: _ClassVar[ErrorReason]
    SHUTTING_DOWN: _ClassVar[ErrorReason]
    INTERNAL_ERROR: _ClassVar[ErrorReason]
    UNAUTHENTICATED: _ClassVar[ErrorReason]
    PERMISSION_DENIED: _ClassVar[ErrorReason]
    NOT_RUN_OWNER: _ClassVar[ErrorReason]
    SEPARATION_OF_DUTIES: _ClassVar[ErrorReason]
    GROUP_NOT_FOUND: _ClassVar[ErrorReason]
    GROUP_MISMATCH: _ClassVar[ErrorReason]
    MEMBER_TOO_SLOW: _ClassVar[ErrorReason]
    STORAGE_UNAVAILABLE: _ClassVar[ErrorReason]
    MALFORMED_REQUEST: _ClassVar[ErrorReason]
    NOT_ALLOWED_TO_SERVE: _ClassVar[ErrorReason]
    IDENTITY_TAKEN: _ClassVar[ErrorReason]
    NOT_TASK_HOLDER: _ClassVar[ErrorReason]
    OWNERSHIP_LOST: _ClassVar[ErrorReason]
    OWNER_UNAVAILABLE: _ClassVar[ErrorReason]
    ALREADY_VOTED: _ClassVar[ErrorReason]
    NOT_AN_APPROVER_FOR_CALL: _ClassVar[ErrorReason]
    GRANT_NOT_FOUND: _ClassVar[ErrorReason]
    RUN_EXPIRED: _ClassVar[ErrorReason]
ACTOR_KIND_UNSPECIFIED: ActorKind
ACTOR_KIND_ENGINE: ActorKind
ACTOR_KIND_WORKER: ActorKind
ACTOR_KIND_CLIENT: ActorKind
ACTOR_KIND_POLICY: ActorKind
ACTOR_KIND_GRANT: ActorKind
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
ERROR_REASON_UNSPECIFIED: ErrorReason
RUN_NOT_FOUND: ErrorReason
CALL_NOT_FOUND: ErrorReason
INVALID_FIELD: ErrorReason
PAYLOAD_TOO_LARGE: ErrorReason
RESERVED_EVENT_TYPE: ErrorReason
RUN_FINISHED: ErrorReason
STALE_ATTEMPT: ErrorReason
ARGUMENTS_MISMATCH: ErrorReason
TOOL_NOT_REGISTERED: ErrorReason
INVALID_TOKEN: ErrorReason
SHUTTING_DOWN: ErrorReason
INTERNAL_ERROR: ErrorReason
UNAUTHENTICATED: ErrorReason
PERMISSION_DENIED: ErrorReason
NOT_RUN_OWNER: ErrorReason
SEPARATION_OF_DUTIES: ErrorReason
GROUP_NOT_FOUND: ErrorReason
GROUP_MISMATCH: ErrorReason
MEMBER_TOO_SLOW: ErrorReason
STORAGE_UNAVAILABLE: ErrorReason
MALFORMED_REQUEST: ErrorReason
NOT_ALLOWED_TO_SERVE: ErrorReason
IDENTITY_TAKEN: ErrorReason
NOT_TASK_HOLDER: ErrorReason
OWNERSHIP_LOST: ErrorReason
OWNER_UNAVAILABLE: ErrorReason
ALREADY_VOTED: ErrorReason
NOT_AN_APPROVER_FOR_CALL: ErrorReason
GRANT_NOT_FOUND: ErrorReason
RUN_EXPIRED: ErrorReason

class Event(_message.Message):
    __slots__ = ("run_id", "seq", "position", "id", "type", "data_json", "time", "actor")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: int
    position: int
    id: str
    type: str
    data_json: str
    time: _timestamp_pb2.Timestamp
    actor: Actor
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., position: _Optional[int] = ..., id: _Optional[str] = ..., type: _Optional[str] = ..., data_json: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[_Union[Actor, _Mapping]] = ...) -> None: ...

class Actor(_message.Message):
    __slots__ = ("kind", "name", "principal")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    kind: ActorKind
    name: str
    principal: str
    def __init__(self, kind: _Optional[_Union[ActorKind, str]] = ..., name: _Optional[str] = ..., principal: _Optional[str] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("type", "message")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ToolDefinition(_message.Message):
    __slots__ = ("name", "description", "parameters_json", "requires_approval", "retry", "heartbeat_timeout_s", "approval_timeout_s", "approvals_required", "approvers", "remind_after_s", "reminders", "escalate_after_s", "escalate_to")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    REMIND_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    REMINDERS_FIELD_NUMBER: _ClassVar[int]
    ESCALATE_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    ESCALATE_TO_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    requires_approval: bool
    retry: RetryPolicy
    heartbeat_timeout_s: float
    approval_timeout_s: float
    approvals_required: int
    approvers: _containers.RepeatedScalarFieldContainer[str]
    remind_after_s: float
    reminders: int
    escalate_after_s: float
    escalate_to: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ..., requires_approval: _Optional[bool] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., heartbeat_timeout_s: _Optional[float] = ..., approval_timeout_s: _Optional[float] = ..., approvals_required: _Optional[int] = ..., approvers: _Optional[_Iterable[str]] = ..., remind_after_s: _Optional[float] = ..., reminders: _Optional[int] = ..., escalate_after_s: _Optional[float] = ..., escalate_to: _Optional[_Iterable[str]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "initial_backoff_s", "backoff_coefficient", "max_backoff_s")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_BACKOFF_S_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_COEFFICIENT_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_S_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    initial_backoff_s: float
    backoff_coefficient: float
    max_backoff_s: float
    def __init__(self, max_attempts: _Optional[int] = ..., initial_backoff_s: _Optional[float] = ..., backoff_coefficient: _Optional[float] = ..., max_backoff_s: _Optional[float] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "call_id", "name", "error")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    call_id: str
    name: str
    error: ErrorDetail
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., call_id: _Optional[str] = ..., name: _Optional[str] = ..., error: _Optional[_Union[ErrorDetail, _Mapping]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("call_id", "name", "arguments_json")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    arguments_json: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...
