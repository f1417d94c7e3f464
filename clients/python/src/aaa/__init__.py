"""Python SDK of aaa: durable agent runs with a server-enforced human approval gate.

Connect, serve tools and models with a worker, start runs, follow their
events, and answer approvals::

    import aaa
    from aaa import tool, tool_call, text

    client = await aaa.connect()                 # env AAA_SERVER or 127.0.0.1:50051
    async with client.worker(tools=[wire_money], models={"seed": model}):
        run = await client.start_run("Pay ACME $250", model="seed", tools=[wire_money])
        request = await run.wait_for("aaa.approval.requested")
        await run.approve(request.data["call_id"])
        outcome = await run.result()

See the README of clients/python for the whole API.
"""

from .client import DEFAULT_ADDRESS, Approvals, Client, Run, connect
from .errors import (
    AaaError,
    AlreadyExists,
    AlreadyVoted,
    ArgumentsMismatch,
    CallNotFound,
    FailedPrecondition,
    GrantNotFound,
    GroupMismatch,
    GroupNotFound,
    IdentityTaken,
    InternalError,
    InvalidArgument,
    InvalidField,
    InvalidToken,
    MalformedRequest,
    MemberTooSlow,
    NotAllowedToServe,
    NotAnApproverForCall,
    NotFound,
    NotRunOwner,
    NotTaskHolder,
    PayloadTooLarge,
    PermissionDenied,
    ReservedEventType,
    RunFinished,
    RunNotFound,
    SeparationOfDuties,
    ShuttingDown,
    StaleAttempt,
    StorageUnavailable,
    OwnershipLost,
    OwnerUnavailable,
    SupersededAttempt,
    ToolNotRegistered,
    Unauthenticated,
    Unavailable,
)
from .models import Message, ModelRequest, Reply, ToolCall, ToolSpec, echo, text, tool_call
from .subscriptions import Delivery
from .tools import Tool, tool
from .types import (
    TERMINAL_EVENT_TYPES,
    Actor,
    Approval,
    ApprovalOutcome,
    ApprovalResolution,
    ApprovalVoted,
    Budget,
    DecisionResult,
    DecisionStatus,
    ErrorDetail,
    Event,
    Grant,
    Outcome,
    RunInfo,
    RunStatus,
    SignalResult,
    SnapshotComplete,
    ToolRef,
    Vote,
)
from .worker import NonRetryable, TaskInfo, Worker, current_task

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ADDRESS",
    "TERMINAL_EVENT_TYPES",
    "AaaError",
    "Actor",
    "AlreadyExists",
    "AlreadyVoted",
    "Approval",
    "ApprovalOutcome",
    "ApprovalResolution",
    "ApprovalVoted",
    "Approvals",
    "ArgumentsMismatch",
    "Budget",
    "CallNotFound",
    "Client",
    "DecisionResult",
    "DecisionStatus",
    "Delivery",
    "ErrorDetail",
    "Event",
    "FailedPrecondition",
    "Grant",
    "GrantNotFound",
    "GroupMismatch",
    "GroupNotFound",
    "IdentityTaken",
    "InternalError",
    "InvalidArgument",
    "InvalidField",
    "InvalidToken",
    "MalformedRequest",
    "MemberTooSlow",
    "Message",
    "ModelRequest",
    "NonRetryable",
    "NotAllowedToServe",
    "NotAnApproverForCall",
    "NotFound",
    "NotRunOwner",
    "NotTaskHolder",
    "Outcome",
    "PayloadTooLarge",
    "PermissionDenied",
    "Reply",
    "ReservedEventType",
    "Run",
    "RunFinished",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "SeparationOfDuties",
    "ShuttingDown",
    "SignalResult",
    "SnapshotComplete",
    "StaleAttempt",
    "StorageUnavailable",
    "OwnershipLost",
    "OwnerUnavailable",
    "SupersededAttempt",
    "TaskInfo",
    "Tool",
    "ToolCall",
    "ToolNotRegistered",
    "ToolRef",
    "ToolSpec",
    "Unauthenticated",
    "Unavailable",
    "Vote",
    "Worker",
    "connect",
    "current_task",
    "echo",
    "text",
    "tool",
    "tool_call",
]
