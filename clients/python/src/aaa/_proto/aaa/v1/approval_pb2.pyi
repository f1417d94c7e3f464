import datetime

from aaa._proto.aaa.v1 import routing_pb2 as _routing_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApprovalOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_OUTCOME_UNSPECIFIED: _ClassVar[ApprovalOutcome]
    APPROVAL_OUTCOME_GRANTED: _ClassVar[ApprovalOutcome]
    APPROVAL_OUTCOME_DENIED: _ClassVar[ApprovalOutcome]
    APPROVAL_OUTCOME_EXPIRED: _ClassVar[ApprovalOutcome]
    APPROVAL_OUTCOME_EDITED: _ClassVar[ApprovalOutcome]

class BatchDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BATCH_DECISION_UNSPECIFIED: _ClassVar[BatchDecision]
    BATCH_DECISION_GRANT: _ClassVar[BatchDecision]
    BATCH_DECISION_DENY: _ClassVar[BatchDecision]

class DecisionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_STATUS_UNSPECIFIED: _ClassVar[DecisionStatus]
    DECISION_STATUS_DECIDED: _ClassVar[DecisionStatus]
    DECISION_STATUS_ALREADY_DECIDED: _ClassVar[DecisionStatus]
    DECISION_STATUS_MISMATCH: _ClassVar[DecisionStatus]
    DECISION_STATUS_NOT_FOUND: _ClassVar[DecisionStatus]
    DECISION_STATUS_REFUSED: _ClassVar[DecisionStatus]
    DECISION_STATUS_NOT_APPLIED: _ClassVar[DecisionStatus]
APPROVAL_OUTCOME_UNSPECIFIED: ApprovalOutcome
APPROVAL_OUTCOME_GRANTED: ApprovalOutcome
APPROVAL_OUTCOME_DENIED: ApprovalOutcome
APPROVAL_OUTCOME_EXPIRED: ApprovalOutcome
APPROVAL_OUTCOME_EDITED: ApprovalOutcome
BATCH_DECISION_UNSPECIFIED: BatchDecision
BATCH_DECISION_GRANT: BatchDecision
BATCH_DECISION_DENY: BatchDecision
DECISION_STATUS_UNSPECIFIED: DecisionStatus
DECISION_STATUS_DECIDED: DecisionStatus
DECISION_STATUS_ALREADY_DECIDED: DecisionStatus
DECISION_STATUS_MISMATCH: DecisionStatus
DECISION_STATUS_NOT_FOUND: DecisionStatus
DECISION_STATUS_REFUSED: DecisionStatus
DECISION_STATUS_NOT_APPLIED: DecisionStatus

class Approval(_message.Message):
    __slots__ = ("run_id", "call_id", "tool", "arguments_json", "arguments_sha256", "requested_at", "expires_at", "labels", "seq", "position", "task", "approvals_required", "votes", "edited_from", "approvers")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    EDITED_FROM_FIELD_NUMBER: _ClassVar[int]
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    call_id: str
    tool: str
    arguments_json: str
    arguments_sha256: str
    requested_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    seq: int
    position: int
    task: str
    approvals_required: int
    votes: _containers.RepeatedCompositeFieldContainer[Vote]
    edited_from: str
    approvers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., call_id: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., arguments_sha256: _Optional[str] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., seq: _Optional[int] = ..., position: _Optional[int] = ..., task: _Optional[str] = ..., approvals_required: _Optional[int] = ..., votes: _Optional[_Iterable[_Union[Vote, _Mapping]]] = ..., edited_from: _Optional[str] = ..., approvers: _Optional[_Iterable[str]] = ...) -> None: ...

class Vote(_message.Message):
    __slots__ = ("approver", "time", "comment")
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    approver: str
    time: _timestamp_pb2.Timestamp
    comment: str
    def __init__(self, approver: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., comment: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("tool", "run_id", "labels", "page_size", "page_token", "decidable", "newest_first")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOOL_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DECIDABLE_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    tool: str
    run_id: str
    labels: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    decidable: bool
    newest_first: bool
    def __init__(self, tool: _Optional[str] = ..., run_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., decidable: _Optional[bool] = ..., newest_first: _Optional[bool] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchApprovalsRequest(_message.Message):
    __slots__ = ("tool", "run_id", "labels", "after_position", "heartbeat_s", "decidable", "resume_token")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOOL_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    AFTER_POSITION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    DECIDABLE_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tool: str
    run_id: str
    labels: _containers.ScalarMap[str, str]
    after_position: int
    heartbeat_s: float
    decidable: bool
    resume_token: str
    def __init__(self, tool: _Optional[str] = ..., run_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., after_position: _Optional[int] = ..., heartbeat_s: _Optional[float] = ..., decidable: _Optional[bool] = ..., resume_token: _Optional[str] = ...) -> None: ...

class WatchApprovalsResponse(_message.Message):
    __slots__ = ("position", "resume_token", "requested", "resolved", "snapshot_complete", "heartbeat", "voted")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    VOTED_FIELD_NUMBER: _ClassVar[int]
    position: int
    resume_token: str
    requested: Approval
    resolved: ApprovalResolution
    snapshot_complete: SnapshotComplete
    heartbeat: Heartbeat
    voted: ApprovalVoted
    def __init__(self, position: _Optional[int] = ..., resume_token: _Optional[str] = ..., requested: _Optional[_Union[Approval, _Mapping]] = ..., resolved: _Optional[_Union[ApprovalResolution, _Mapping]] = ..., snapshot_complete: _Optional[_Union[SnapshotComplete, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., voted: _Optional[_Union[ApprovalVoted, _Mapping]] = ...) -> None: ...

class ApprovalVoted(_message.Message):
    __slots__ = ("run_id", "call_id", "tool", "vote", "votes", "approvals_required", "seq")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    VOTE_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    call_id: str
    tool: str
    vote: Vote
    votes: int
    approvals_required: int
    seq: int
    def __init__(self, run_id: _Optional[str] = ..., call_id: _Optional[str] = ..., tool: _Optional[str] = ..., vote: _Optional[_Union[Vote, _Mapping]] = ..., votes: _Optional[int] = ..., approvals_required: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class ApprovalResolution(_message.Message):
    __slots__ = ("run_id", "call_id", "tool", "outcome", "reason", "seq", "time", "replaced_by")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    REPLACED_BY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    call_id: str
    tool: str
    outcome: ApprovalOutcome
    reason: str
    seq: int
    time: _timestamp_pb2.Timestamp
    replaced_by: str
    def __init__(self, run_id: _Optional[str] = ..., call_id: _Optional[str] = ..., tool: _Optional[str] = ..., outcome: _Optional[_Union[ApprovalOutcome, str]] = ..., reason: _Optional[str] = ..., seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., replaced_by: _Optional[str] = ...) -> None: ...

class DecideApprovalsRequest(_message.Message):
    __slots__ = ("items", "decision", "reason", "comment", "all_or_nothing", "approver", "request_id")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    ALL_OR_NOTHING_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DecisionItem]
    decision: BatchDecision
    reason: str
    comment: str
    all_or_nothing: bool
    approver: str
    request_id: str
    def __init__(self, items: _Optional[_Iterable[_Union[DecisionItem, _Mapping]]] = ..., decision: _Optional[_Union[BatchDecision, str]] = ..., reason: _Optional[str] = ..., comment: _Optional[str] = ..., all_or_nothing: _Optional[bool] = ..., approver: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DecisionItem(_message.Message):
    __slots__ = ("run_id", "call_id", "arguments_sha256")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    call_id: str
    arguments_sha256: str
    def __init__(self, run_id: _Optional[str] = ..., call_id: _Optional[str] = ..., arguments_sha256: _Optional[str] = ...) -> None: ...

class DecideApprovalsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DecisionResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DecisionResult, _Mapping]]] = ...) -> None: ...

class DecisionResult(_message.Message):
    __slots__ = ("run_id", "call_id", "status", "decision", "seq", "error_reason", "error_message")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    call_id: str
    status: DecisionStatus
    decision: str
    seq: int
    error_reason: str
    error_message: str
    def __init__(self, run_id: _Optional[str] = ..., call_id: _Optional[str] = ..., status: _Optional[_Union[DecisionStatus, str]] = ..., decision: _Optional[str] = ..., seq: _Optional[int] = ..., error_reason: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class SnapshotComplete(_message.Message):
    __slots__ = ("pending",)
    PENDING_FIELD_NUMBER: _ClassVar[int]
    pending: int
    def __init__(self, pending: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
