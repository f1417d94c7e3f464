import datetime

from aaa._proto.aaa.v1 import routing_pb2 as _routing_pb2
from aaa._proto.aaa.v1 import types_pb2 as _types_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("identity", "tools", "models")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    identity: str
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolDefinition]
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, identity: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[_types_pb2.ToolDefinition, _Mapping]]] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolDefinition]
    def __init__(self, tools: _Optional[_Iterable[_Union[_types_pb2.ToolDefinition, _Mapping]]] = ...) -> None: ...

class PollTaskRequest(_message.Message):
    __slots__ = ("identity", "tools", "models", "wait_s")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    identity: str
    tools: _containers.RepeatedScalarFieldContainer[str]
    models: _containers.RepeatedScalarFieldContainer[str]
    wait_s: float
    def __init__(self, identity: _Optional[str] = ..., tools: _Optional[_Iterable[str]] = ..., models: _Optional[_Iterable[str]] = ..., wait_s: _Optional[float] = ...) -> None: ...

class PollTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("token", "run_id", "call_id", "attempt", "heartbeat_timeout_s", "deadline_at", "tool", "model", "traceparent")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    token: str
    run_id: str
    call_id: str
    attempt: int
    heartbeat_timeout_s: float
    deadline_at: _timestamp_pb2.Timestamp
    tool: ToolTask
    model: ModelTask
    traceparent: str
    def __init__(self, token: _Optional[str] = ..., run_id: _Optional[str] = ..., call_id: _Optional[str] = ..., attempt: _Optional[int] = ..., heartbeat_timeout_s: _Optional[float] = ..., deadline_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tool: _Optional[_Union[ToolTask, _Mapping]] = ..., model: _Optional[_Union[ModelTask, _Mapping]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class ToolTask(_message.Message):
    __slots__ = ("name", "arguments_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ModelTask(_message.Message):
    __slots__ = ("model", "messages", "tools")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.Message]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolDefinition]
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_types_pb2.Message, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[_types_pb2.ToolDefinition, _Mapping]]] = ...) -> None: ...

class ModelReply(_message.Message):
    __slots__ = ("content", "tool_calls")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ModelToolCall]
    def __init__(self, content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ModelToolCall, _Mapping]]] = ...) -> None: ...

class ModelToolCall(_message.Message):
    __slots__ = ("name", "arguments_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class HeartbeatTaskRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class HeartbeatTaskResponse(_message.Message):
    __slots__ = ("cancel_requested",)
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    cancel_requested: bool
    def __init__(self, cancel_requested: _Optional[bool] = ...) -> None: ...

class CompleteTaskRequest(_message.Message):
    __slots__ = ("token", "output_json", "reply")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    token: str
    output_json: str
    reply: ModelReply
    def __init__(self, token: _Optional[str] = ..., output_json: _Optional[str] = ..., reply: _Optional[_Union[ModelReply, _Mapping]] = ...) -> None: ...

class CompleteTaskResponse(_message.Message):
    __slots__ = ("already_recorded",)
    ALREADY_RECORDED_FIELD_NUMBER: _ClassVar[int]
    already_recorded: bool
    def __init__(self, already_recorded: _Optional[bool] = ...) -> None: ...

class FailTaskRequest(_message.Message):
    __slots__ = ("token", "error", "non_retryable")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NON_RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    token: str
    error: _types_pb2.ErrorDetail
    non_retryable: bool
    def __init__(self, token: _Optional[str] = ..., error: _Optional[_Union[_types_pb2.ErrorDetail, _Mapping]] = ..., non_retryable: _Optional[bool] = ...) -> None: ...

class FailTaskResponse(_message.Message):
    __slots__ = ("already_recorded",)
    ALREADY_RECORDED_FIELD_NUMBER: _ClassVar[int]
    already_recorded: bool
    def __init__(self, already_recorded: _Optional[bool] = ...) -> None: ...
