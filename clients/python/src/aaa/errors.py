"""Typed exceptions for the errors the aaa server returns.

Every server error is a ``google.rpc.Status`` sent in the
``grpc-status-details-bin`` trailer, carrying one ``google.rpc.ErrorInfo`` with
domain ``aaa.v1`` and a reason from the ``ErrorReason`` enum of types.proto
(``RUN_NOT_FOUND``, ``STALE_ATTEMPT``, ...). The SDK turns each failed RPC into
the exception class of that reason; without a reason, into the class of the
gRPC status code. Branch on the classes::

    try:
        await client.get_run(run_id)
    except aaa.RunNotFound:
        ...

A failed *run* is not an exception: it is data (see ``Outcome``).
"""

from __future__ import annotations

from typing import Any, Mapping

import grpc
from google.rpc import error_details_pb2, status_pb2

from ._proto.aaa.v1 import types_pb2

#: The ErrorInfo domain of errors raised by aaa servers.
DOMAIN = "aaa.v1"

_DETAILS_KEY = "grpc-status-details-bin"


class AaaError(Exception):
    """Base class of every error the SDK raises for a failed RPC.

    Attributes:
        message: the server's message.
        code: the gRPC status code (``grpc.StatusCode``).
        reason: ``ErrorInfo.reason``, for example ``"RUN_NOT_FOUND"``; empty
            when the server sent none (a connection failure, say).
        metadata: ``ErrorInfo.metadata``, for example ``{"field": "task"}``.
    """

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})

    def __str__(self) -> str:
        return f"{self.reason or self.code.name}: {self.message}"


class NotFound(AaaError):
    """NOT_FOUND: the run or call does not exist."""


class RunNotFound(NotFound):
    """The run id is unknown, or (auth on) names another principal's run and the caller lacks
    the reader role (reason RUN_NOT_FOUND)."""


class RunExpired(NotFound):
    """The run finished and was deleted by retention (reason RUN_EXPIRED), said while its
    tombstone lasts; ``metadata["expired_ms"]`` says when it was deleted."""


class CallNotFound(NotFound):
    """The run has no such call, or no approval request for it (reason CALL_NOT_FOUND)."""


class GroupNotFound(NotFound):
    """A consumer group that does not exist (reason GROUP_NOT_FOUND)."""


class GrantNotFound(NotFound):
    """A standing grant that does not exist (reason GRANT_NOT_FOUND); ``metadata["grant_id"]`` names it."""


class InvalidArgument(AaaError):
    """INVALID_ARGUMENT: the request is malformed."""

    @property
    def field(self) -> str:
        """The request field the server complained about, if it named one."""
        return self.metadata.get("field", "")


class InvalidField(InvalidArgument):
    """A field is missing or malformed (reason INVALID_FIELD); see ``field``."""


class PayloadTooLarge(InvalidArgument):
    """A payload is larger than the server's limit (reason PAYLOAD_TOO_LARGE)."""


class ReservedEventType(InvalidArgument):
    """Signal with an event type only the engine may append (reason RESERVED_EVENT_TYPE)."""


class MalformedRequest(InvalidArgument):
    """The request bytes are not a valid message (reason MALFORMED_REQUEST): a bug of the
    client that sent them, not something a retry fixes."""


class ToolNotRegistered(InvalidArgument):
    """StartRun names a tool no worker has registered (reason TOOL_NOT_REGISTERED)."""


class InvalidToken(InvalidArgument):
    """A task token this server did not mint (reason INVALID_TOKEN)."""


class FailedPrecondition(AaaError):
    """FAILED_PRECONDITION: the run or attempt is in the wrong state."""


class RunFinished(FailedPrecondition):
    """The run has finished (reason RUN_FINISHED)."""


class StaleAttempt(FailedPrecondition):
    """The task token names an attempt that is no longer current (reason STALE_ATTEMPT)."""


#: Another name for ``StaleAttempt``: the attempt was superseded.
SupersededAttempt = StaleAttempt


class ArgumentsMismatch(FailedPrecondition):
    """A decision's arguments_sha256 (of a grant, denial or edit) does not match the requested
    arguments (reason ARGUMENTS_MISMATCH)."""


class AlreadyVoted(FailedPrecondition):
    """This approver already granted the call, which needs grants from several distinct approvers
    (reason ALREADY_VOTED); ``metadata["approver"]`` and ``metadata["call_id"]`` name them. Another
    approver must cast the next grant."""


class GroupMismatch(FailedPrecondition):
    """Subscribe asked a group for another definition than it was created with (reason GROUP_MISMATCH)."""


class AlreadyExists(AaaError):
    """ALREADY_EXISTS: an id clash."""


class Unauthenticated(AaaError):
    """UNAUTHENTICATED: no token or client certificate, or one the server does not know."""


class PermissionDenied(AaaError):
    """PERMISSION_DENIED: the caller lacks the role (``metadata["roles"]`` lists those that
    would do), acts on a run it did not start (reason NOT_RUN_OWNER), decides a call of a
    run it started under separation of duties (reason SEPARATION_OF_DUTIES), serves a tool or
    model its auth config does not list (reason NOT_ALLOWED_TO_SERVE), uses another principal's
    worker identity (reason IDENTITY_TAKEN), reports on another principal's task (reason
    NOT_TASK_HOLDER) or decides a call outside its approver groups (reason NOT_AN_APPROVER_FOR_CALL)."""


class NotRunOwner(PermissionDenied):
    """A runner with the reader role acts on a run another principal started (a caller without
    reader gets ``RunNotFound`` instead); reason NOT_RUN_OWNER."""


class SeparationOfDuties(PermissionDenied):
    """With separation of duties on, the principal that started the run decides one of its calls
    (reason SEPARATION_OF_DUTIES)."""


class NotAllowedToServe(PermissionDenied):
    """A worker principal registers or polls a tool or model that its ``tools`` / ``models`` in
    the auth config do not list (reason NOT_ALLOWED_TO_SERVE); ``metadata["tool"]`` or
    ``metadata["model"]`` names it."""


class IdentityTaken(PermissionDenied):
    """The worker identity was first used by another principal (reason IDENTITY_TAKEN);
    ``metadata["identity"]`` names it: choose another identity."""


class NotTaskHolder(PermissionDenied):
    """CompleteTask, FailTask or HeartbeatTask from another principal than the one the task was
    handed to (reason NOT_TASK_HOLDER)."""


class NotAnApproverForCall(PermissionDenied):
    """The call may be decided (granted, denied, edited) only by members of its approver groups,
    and the caller is in none of them (reason NOT_AN_APPROVER_FOR_CALL); ``groups`` lists them,
    ``metadata["call_id"]`` names the call."""

    @property
    def groups(self) -> list[str]:
        """The approver groups that may decide the call."""
        # The server sends them comma-separated in the ErrorInfo metadata.
        return [g for g in self.metadata.get("groups", "").split(",") if g]


class MemberTooSlow(AaaError):
    """RESOURCE_EXHAUSTED: a subscriber read none of its deliveries while they piled up, and the
    server ended its stream (reason MEMBER_TOO_SLOW); ``Client.subscribe`` joins again by itself."""


class Unavailable(AaaError):
    """UNAVAILABLE: the server cannot be reached or is not serving."""


class ShuttingDown(Unavailable):
    """The server is shutting down (reason SHUTTING_DOWN)."""


class StorageUnavailable(Unavailable):
    """The server's store cannot take writes (disk full, I/O error, database unreachable) and
    wrote nothing of the call (reason STORAGE_UNAVAILABLE): retry with backoff, as the SDK does."""


class OwnershipLost(Unavailable):
    """UNAVAILABLE: another aaa server on the same PostgreSQL database took the run over, so this
    server no longer writes it and wrote nothing of the call (reason OWNERSHIP_LOST); send the
    call to the server that serves the deployment now."""


class OwnerUnavailable(Unavailable):
    """UNAVAILABLE: this server forwards the call to the server of the cluster that owns the runs,
    and none answers now (the owner died and its lease has not lapsed yet, or no server holds the
    runs); ``metadata["owner"]`` names the last owner known (reason OWNER_UNAVAILABLE). Retried with
    backoff like any ``Unavailable``: another server takes the runs over within seconds."""


class InternalError(AaaError):
    """INTERNAL: the server failed; its log has the details."""


_R = types_pb2.ErrorReason

#: The class of each ``ErrorReason`` of types.proto (all but ERROR_REASON_UNSPECIFIED; a test
#: checks that none is missing). A reason newer than this SDK gets the class of its status code.
_BY_REASON: dict[str, type[AaaError]] = {
    _R.Name(reason): cls
    for reason, cls in {
        types_pb2.RUN_NOT_FOUND: RunNotFound,
        types_pb2.CALL_NOT_FOUND: CallNotFound,
        types_pb2.INVALID_FIELD: InvalidField,
        types_pb2.PAYLOAD_TOO_LARGE: PayloadTooLarge,
        types_pb2.RESERVED_EVENT_TYPE: ReservedEventType,
        types_pb2.RUN_FINISHED: RunFinished,
        types_pb2.STALE_ATTEMPT: StaleAttempt,
        types_pb2.ARGUMENTS_MISMATCH: ArgumentsMismatch,
        types_pb2.TOOL_NOT_REGISTERED: ToolNotRegistered,
        types_pb2.INVALID_TOKEN: InvalidToken,
        types_pb2.SHUTTING_DOWN: ShuttingDown,
        types_pb2.INTERNAL_ERROR: InternalError,
        types_pb2.UNAUTHENTICATED: Unauthenticated,
        types_pb2.PERMISSION_DENIED: PermissionDenied,
        types_pb2.NOT_RUN_OWNER: NotRunOwner,
        types_pb2.SEPARATION_OF_DUTIES: SeparationOfDuties,
        types_pb2.GROUP_NOT_FOUND: GroupNotFound,
        types_pb2.GROUP_MISMATCH: GroupMismatch,
        types_pb2.MEMBER_TOO_SLOW: MemberTooSlow,
        types_pb2.STORAGE_UNAVAILABLE: StorageUnavailable,
        types_pb2.OWNERSHIP_LOST: OwnershipLost,
        types_pb2.OWNER_UNAVAILABLE: OwnerUnavailable,
        types_pb2.MALFORMED_REQUEST: MalformedRequest,
        types_pb2.NOT_ALLOWED_TO_SERVE: NotAllowedToServe,
        types_pb2.IDENTITY_TAKEN: IdentityTaken,
        types_pb2.NOT_TASK_HOLDER: NotTaskHolder,
        types_pb2.ALREADY_VOTED: AlreadyVoted,
        types_pb2.NOT_AN_APPROVER_FOR_CALL: NotAnApproverForCall,
        types_pb2.GRANT_NOT_FOUND: GrantNotFound,
        types_pb2.RUN_EXPIRED: RunExpired,
    }.items()
}

_BY_CODE: dict[grpc.StatusCode, type[AaaError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.INTERNAL: InternalError,
}


def from_rpc_error(err: grpc.RpcError) -> AaaError:
    """Convert a failed gRPC call (``grpc.aio.AioRpcError``) into its typed exception."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = (err.details() if hasattr(err, "details") else None) or ""
    reason, metadata = "", {}
    trailers: Any = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key != _DETAILS_KEY:
            continue
        status = status_pb2.Status.FromString(value)
        message = status.message or message
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.domain == DOMAIN:
                reason, metadata = info.reason, dict(info.metadata)
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, AaaError)
    return cls(message, code=code, reason=reason, metadata=metadata)
