import datetime

from aaa._proto.aaa.v1 import approval_pb2 as _approval_pb2
from aaa._proto.aaa.v1 import routing_pb2 as _routing_pb2
from aaa._proto.aaa.v1 import types_pb2 as _types_pb2
from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_RUNNING: _ClassVar[RunStatus]
    RUN_STATUS_WAITING_FOR_APPROVAL: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_WAITING_FOR_APPROVAL: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_CANCELLED: RunStatus

class Run(_message.Message):
    __slots__ = ("run_id", "status", "task", "model", "tools", "labels", "created_at", "updated_at", "deadline_at", "last_seq", "result_json", "error", "pending_approvals", "usage")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PENDING_APPROVALS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    status: RunStatus
    task: str
    model: str
    tools: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    deadline_at: _timestamp_pb2.Timestamp
    last_seq: int
    result_json: str
    error: _types_pb2.ErrorDetail
    pending_approvals: _containers.RepeatedCompositeFieldContainer[_approval_pb2.Approval]
    usage: TokenUsage
    def __init__(self, run_id: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., task: _Optional[str] = ..., model: _Optional[str] = ..., tools: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_seq: _Optional[int] = ..., result_json: _Optional[str] = ..., error: _Optional[_Union[_types_pb2.ErrorDetail, _Mapping]] = ..., pending_approvals: _Optional[_Iterable[_Union[_approval_pb2.Approval, _Mapping]]] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ...) -> None: ...

class TokenUsage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("deadline_s", "max_model_calls", "max_tokens")
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    deadline_s: float
    max_model_calls: int
    max_tokens: int
    def __init__(self, deadline_s: _Optional[float] = ..., max_model_calls: _Optional[int] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class ToolRef(_message.Message):
    __slots__ = ("name", "requires_approval", "approval_timeout_s", "approvals_required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    requires_approval: bool
    approval_timeout_s: float
    approvals_required: int
    def __init__(self, name: _Optional[str] = ..., requires_approval: _Optional[bool] = ..., approval_timeout_s: _Optional[float] = ..., approvals_required: _Optional[int] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("worker", "scripted", "openai")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SCRIPTED_FIELD_NUMBER: _ClassVar[int]
    OPENAI_FIELD_NUMBER: _ClassVar[int]
    worker: str
    scripted: ScriptedModel
    openai: OpenAiModel
    def __init__(self, worker: _Optional[str] = ..., scripted: _Optional[_Union[ScriptedModel, _Mapping]] = ..., openai: _Optional[_Union[OpenAiModel, _Mapping]] = ...) -> None: ...

class OpenAiModel(_message.Message):
    __slots__ = ("model", "provider", "temperature", "max_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    provider: str
    temperature: float
    max_tokens: int
    def __init__(self, model: _Optional[str] = ..., provider: _Optional[str] = ..., temperature: _Optional[float] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class ScriptedModel(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[ScriptedStep]
    def __init__(self, steps: _Optional[_Iterable[_Union[ScriptedStep, _Mapping]]] = ...) -> None: ...

class ScriptedStep(_message.Message):
    __slots__ = ("text", "tool_calls", "echo")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    ECHO_FIELD_NUMBER: _ClassVar[int]
    text: str
    tool_calls: ScriptedToolCalls
    echo: _empty_pb2.Empty
    def __init__(self, text: _Optional[str] = ..., tool_calls: _Optional[_Union[ScriptedToolCalls, _Mapping]] = ..., echo: _Optional[_Union[_empty_pb2.Empty, _Mapping]] = ...) -> None: ...

class ScriptedToolCalls(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ScriptedToolCall]
    def __init__(self, calls: _Optional[_Iterable[_Union[ScriptedToolCall, _Mapping]]] = ...) -> None: ...

class ScriptedToolCall(_message.Message):
    __slots__ = ("name", "arguments_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ("task", "model", "tools", "budget", "labels", "request_id", "system")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    task: str
    model: ModelSpec
    tools: _containers.RepeatedCompositeFieldContainer[ToolRef]
    budget: Budget
    labels: _containers.ScalarMap[str, str]
    request_id: str
    system: str
    def __init__(self, task: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[ToolRef, _Mapping]]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ..., system: _Optional[str] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ("run_id", "created")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    created: bool
    def __init__(self, run_id: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("status", "labels", "page_size", "page_token")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    status: RunStatus
    labels: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, status: _Optional[_Union[RunStatus, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("run_id", "after_seq", "follow", "type_prefix", "stop_at_end")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TYPE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    STOP_AT_END_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_seq: int
    follow: bool
    type_prefix: str
    stop_at_end: bool
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., follow: _Optional[bool] = ..., type_prefix: _Optional[str] = ..., stop_at_end: _Optional[bool] = ...) -> None: ...

class StreamEventsResponse(_message.Message):
    __slots__ = ("event", "caught_up")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    event: _types_pb2.Event
    caught_up: CaughtUp
    def __init__(self, event: _Optional[_Union[_types_pb2.Event, _Mapping]] = ..., caught_up: _Optional[_Union[CaughtUp, _Mapping]] = ...) -> None: ...

class CaughtUp(_message.Message):
    __slots__ = ("last_seq",)
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    last_seq: int
    def __init__(self, last_seq: _Optional[int] = ...) -> None: ...

class SignalRequest(_message.Message):
    __slots__ = ("run_id", "type", "data_json", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    type: str
    data_json: str
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., type: _Optional[str] = ..., data_json: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SignalResponse(_message.Message):
    __slots__ = ("seq", "already_decided", "decision", "votes", "approvals_required", "new_call_id", "new_arguments_sha256")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ALREADY_DECIDED_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    NEW_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    seq: int
    already_decided: bool
    decision: str
    votes: int
    approvals_required: int
    new_call_id: str
    new_arguments_sha256: str
    def __init__(self, seq: _Optional[int] = ..., already_decided: _Optional[bool] = ..., decision: _Optional[str] = ..., votes: _Optional[int] = ..., approvals_required: _Optional[int] = ..., new_call_id: _Optional[str] = ..., new_arguments_sha256: _Optional[str] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...
