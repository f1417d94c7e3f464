"""Plain Python views of the aaa.v1 wire messages.

The SDK hands out these dataclasses instead of protobuf messages. Every
``*_json`` field of the wire is parsed with Python's ``json`` module, so
numbers keep their exact type and value: 250 stays the int 250 and integers
beyond 2**53 keep every digit. The raw JSON text is kept beside the parsed
value where it matters (``Event.data_json``, ``Approval.arguments_json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Mapping

from ._proto.aaa.v1 import approval_pb2, grant_pb2, policy_pb2, run_pb2, types_pb2

#: Event types that end a run.
TERMINAL_EVENT_TYPES = frozenset({"aaa.run.completed", "aaa.run.failed", "aaa.run.cancelled"})


def dumps(value: Any) -> str:
    """Encode a value as compact JSON text (ints stay exact; NaN and infinities are refused)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: str, empty: Any = None) -> Any:
    """Decode JSON text; return ``empty`` for an empty string."""
    return json.loads(text) if text else empty


def _time(msg: Any, name: str) -> datetime | None:
    """Return a Timestamp field as an aware UTC datetime, or None when unset."""
    if not msg.HasField(name):
        return None
    return getattr(msg, name).ToDatetime(tzinfo=timezone.utc)


def _enum_name(wrapper: Any, value: int, prefix: str) -> str:
    """The lowercase name of a proto enum value without its prefix ("unknown" for numbers this SDK predates)."""
    try:
        return wrapper.Name(value).removeprefix(prefix).lower()
    except ValueError:
        return "unknown"


class RunStatus(str, Enum):
    """Where a run is in its lifecycle. Members compare equal to their lowercase value."""

    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def is_terminal(self) -> bool:
        """True for completed, failed and cancelled."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)

    def to_proto(self) -> Any:
        """The matching ``aaa.v1.RunStatus`` number."""
        return run_pb2.RunStatus.Value("RUN_STATUS_" + self.name)

    @classmethod
    def from_proto(cls, value: int) -> RunStatus | None:
        """Convert an ``aaa.v1.RunStatus`` number (None for UNSPECIFIED)."""
        try:
            return cls(_enum_name(run_pb2.RunStatus, value, "RUN_STATUS_"))
        except ValueError:
            return None


class ApprovalOutcome(str, Enum):
    """How an approval request ended. Members compare equal to their lowercase value."""

    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"
    #: A reviewer changed the arguments: the call never runs, ``replaced_by`` is requested instead.
    EDITED = "edited"
    #: A value this SDK does not know (from a newer server).
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ErrorDetail:
    """An error recorded in events: a short ``type`` (e.g. "ApprovalDenied") and a ``message``."""

    type: str
    message: str = ""

    @classmethod
    def from_proto(cls, msg: types_pb2.ErrorDetail) -> ErrorDetail:
        """Convert an ``aaa.v1.ErrorDetail``."""
        return cls(msg.type, msg.message)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ErrorDetail | None:
        """Convert the ``error`` object of an event's data (None stays None)."""
        if not data:
            return None
        return cls(str(data.get("type", "")), str(data.get("message", "")))


@dataclass(frozen=True)
class Actor:
    """Who caused an event: ``kind`` is "engine", "worker", "client" or "policy"; ``name``
    identifies it (a worker's identity, a client's name, the policy rule that granted or denied). ``principal`` is, for a worker with auth on, the
    authenticated principal that served the task (an identity alone is only a label); empty
    otherwise (a client's name already is its principal when auth is on)."""

    kind: str
    name: str = ""
    principal: str = ""


@dataclass(frozen=True)
class Event:
    """One event of a run's log.

    Attributes:
        run_id: the run.
        seq: position in the run's log, dense from 1.
        position: position in the server's global log.
        id: the event's unique id.
        type: for example "aaa.approval.requested".
        data: the event's data, parsed from ``data_json`` (a dict).
        data_json: the data exactly as the server sent it.
        time: when it was appended (UTC).
        actor: who caused it.
    """

    run_id: str
    seq: int
    position: int
    id: str
    type: str
    data: dict[str, Any]
    data_json: str
    time: datetime | None
    actor: Actor

    @classmethod
    def from_proto(cls, msg: types_pb2.Event) -> Event:
        """Convert an ``aaa.v1.Event``."""
        kind = _enum_name(types_pb2.ActorKind, msg.actor.kind, "ACTOR_KIND_")
        return cls(
            run_id=msg.run_id,
            seq=msg.seq,
            position=msg.position,
            id=msg.id,
            type=msg.type,
            data=loads(msg.data_json, {}),
            data_json=msg.data_json,
            time=_time(msg, "time"),
            actor=Actor(kind, msg.actor.name, msg.actor.principal),
        )


@dataclass(frozen=True)
class Vote:
    """One approver's grant of a call that needs several.

    ``approver`` is the authenticated principal with auth on; with auth off the
    grant's ``approver=`` (unverified) or the caller's IP address.
    """

    approver: str
    time: datetime | None
    comment: str = ""

    @classmethod
    def from_proto(cls, msg: approval_pb2.Vote) -> Vote:
        """Convert an ``aaa.v1.Vote``."""
        return cls(msg.approver, _time(msg, "time"), msg.comment)


@dataclass(frozen=True)
class Approval:
    """A tool call waiting for a human decision.

    Attributes:
        run_id: the run that waits.
        call_id: the call to approve or deny.
        tool: the tool's name.
        arguments: the exact arguments the tool gets if granted (parsed).
        arguments_json: the same, as the canonical JSON text the server holds.
        arguments_sha256: hex SHA-256 of ``arguments_json``; pass it to
            ``Run.approve`` to approve exactly these arguments.
        requested_at: when the request was made.
        expires_at: when it expires, if it does.
        labels: the run's labels.
        seq: seq of the aaa.approval.requested event.
        position: global position of that event.
        task: the run's task (its first user message): what the call is for.
        approvals_required: grants from distinct approvers the call needs (1 unless
            its tool or run asks for more); any one denial denies.
        votes: the grants cast so far, oldest first. Requests that ``approvals.watch``
            yields after its snapshot have none yet: follow its ``ApprovalVoted`` items.
        edited_from: for a call a reviewer edited, the call it replaces.
        approvers: the approver groups that may decide it (from its tool or a policy rule);
            empty: any approver.
        resume_token: from ``approvals.watch``, where this item leaves the stream: pass it as
            ``resume_token`` to resume after it. Empty on the snapshot's requests and from ``list``.
    """

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    arguments_json: str
    arguments_sha256: str
    requested_at: datetime | None
    expires_at: datetime | None
    labels: dict[str, str]
    seq: int
    position: int
    task: str
    approvals_required: int = 1
    votes: list[Vote] = field(default_factory=list)
    edited_from: str = ""
    approvers: list[str] = field(default_factory=list)
    resume_token: str = field(default="", compare=False)  # where it was seen, not what it is

    @classmethod
    def from_proto(cls, msg: approval_pb2.Approval, resume_token: str = "") -> Approval:
        """Convert an ``aaa.v1.Approval`` (``resume_token``: of the watch item that carried it)."""
        return cls(
            run_id=msg.run_id,
            call_id=msg.call_id,
            tool=msg.tool,
            arguments=loads(msg.arguments_json, {}),
            arguments_json=msg.arguments_json,
            arguments_sha256=msg.arguments_sha256,
            requested_at=_time(msg, "requested_at"),
            expires_at=_time(msg, "expires_at"),
            labels=dict(msg.labels),
            seq=msg.seq,
            position=msg.position,
            task=msg.task,
            approvals_required=max(msg.approvals_required, 1),  # older servers send 0: one grant
            votes=[Vote.from_proto(v) for v in msg.votes],
            edited_from=msg.edited_from,
            approvers=list(msg.approvers),
            resume_token=resume_token,
        )


@dataclass(frozen=True)
class ApprovalResolution:
    """An approval request that was granted, denied, edited or expired (from ``approvals.watch``).

    ``reason`` is the denial's, edit's or expiry's reason, or a grant's comment;
    ``position`` is the position of the resolving event; ``resume_token`` is where
    this item leaves the stream (pass it as ``resume_token`` to resume after it).
    For an edit, ``replaced_by`` is the call that takes this one's place (its own
    ``Approval`` follows).
    """

    run_id: str
    call_id: str
    tool: str
    outcome: ApprovalOutcome
    reason: str
    seq: int
    time: datetime | None
    position: int
    replaced_by: str = ""
    resume_token: str = field(default="", compare=False)  # where it was seen, not what it is

    @classmethod
    def from_proto(
        cls, msg: approval_pb2.ApprovalResolution, position: int, resume_token: str = ""
    ) -> ApprovalResolution:
        """Convert an ``aaa.v1.ApprovalResolution``."""
        name = _enum_name(approval_pb2.ApprovalOutcome, msg.outcome, "APPROVAL_OUTCOME_")
        return cls(
            run_id=msg.run_id,
            call_id=msg.call_id,
            tool=msg.tool,
            outcome=ApprovalOutcome(name) if name in ApprovalOutcome._value2member_map_ else ApprovalOutcome.UNKNOWN,
            reason=msg.reason,
            seq=msg.seq,
            time=_time(msg, "time"),
            position=position,
            replaced_by=msg.replaced_by,
            resume_token=resume_token,
        )


@dataclass(frozen=True)
class ApprovalVoted:
    """A grant of a call that needs several, not yet the last one (from ``approvals.watch``).

    The call stays pending: ``votes`` of ``approvals_required`` grants are cast,
    ``vote`` is this one. ``position`` is the position of the aaa.approval.voted event;
    ``resume_token`` is where this item leaves the stream.
    """

    run_id: str
    call_id: str
    tool: str
    vote: Vote
    votes: int
    approvals_required: int
    seq: int
    position: int
    resume_token: str = field(default="", compare=False)  # where it was seen, not what it is

    @classmethod
    def from_proto(cls, msg: approval_pb2.ApprovalVoted, position: int, resume_token: str = "") -> ApprovalVoted:
        """Convert an ``aaa.v1.ApprovalVoted``."""
        return cls(
            run_id=msg.run_id,
            call_id=msg.call_id,
            tool=msg.tool,
            vote=Vote.from_proto(msg.vote),
            votes=msg.votes,
            approvals_required=msg.approvals_required,
            seq=msg.seq,
            position=position,
            resume_token=resume_token,
        )


@dataclass(frozen=True)
class SnapshotComplete:
    """From ``approvals.watch``: the snapshot of ``pending`` requests is complete; changes follow.

    ``resume_token`` resumes after the snapshot (empty from a server older than resume tokens).
    """

    pending: int
    position: int
    resume_token: str = field(default="", compare=False)  # where it was seen, not what it is


@dataclass(frozen=True)
class TokenUsage:
    """Tokens a run's model calls used, as the provider reported them (built-in models only)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class RunInfo:
    """A run's summary, as returned by ``get_run`` and ``list_runs``.

    ``result`` is the parsed value of aaa.run.completed (e.g. ``{"text": ...}``)
    for a completed run; ``error`` says why a failed or cancelled run ended;
    ``pending_approvals`` is filled by ``get_run`` only.
    """

    run_id: str
    status: RunStatus | None
    task: str
    model: str
    tools: list[str]
    labels: dict[str, str]
    created_at: datetime | None
    updated_at: datetime | None
    deadline_at: datetime | None
    last_seq: int
    result: Any
    error: ErrorDetail | None
    pending_approvals: list[Approval] = field(default_factory=list)
    #: Tokens the run's built-in model calls used: prompt, completion, total.
    usage: TokenUsage = field(default_factory=lambda: TokenUsage())

    @classmethod
    def from_proto(cls, msg: run_pb2.Run) -> RunInfo:
        """Convert an ``aaa.v1.Run``."""
        return cls(
            run_id=msg.run_id,
            status=RunStatus.from_proto(msg.status),
            task=msg.task,
            model=msg.model,
            tools=list(msg.tools),
            labels=dict(msg.labels),
            created_at=_time(msg, "created_at"),
            updated_at=_time(msg, "updated_at"),
            deadline_at=_time(msg, "deadline_at"),
            last_seq=msg.last_seq,
            result=loads(msg.result_json),
            error=ErrorDetail.from_proto(msg.error) if msg.HasField("error") else None,
            pending_approvals=[Approval.from_proto(a) for a in msg.pending_approvals],
            usage=TokenUsage(
                prompt_tokens=msg.usage.prompt_tokens,
                completion_tokens=msg.usage.completion_tokens,
                total_tokens=msg.usage.total_tokens,
            ),
        )


@dataclass(frozen=True)
class Outcome:
    """How a run ended, from its terminal event.

    Attributes:
        run_id: the run.
        status: COMPLETED, FAILED or CANCELLED.
        value: for a completed run, the parsed ``value`` of aaa.run.completed
            (``{"text": ...}`` for a model's final text); otherwise None.
        error: for a failed run, the run's error (e.g. type "DeadlineExceeded");
            for a cancelled one, type "Cancelled" with the reason; otherwise None.
        event: the terminal event itself.
    """

    run_id: str
    status: RunStatus
    value: Any
    error: ErrorDetail | None
    event: Event

    @property
    def ok(self) -> bool:
        """True when the run completed."""
        return self.status is RunStatus.COMPLETED

    @classmethod
    def from_event(cls, event: Event) -> Outcome:
        """Build the outcome from a terminal event (aaa.run.completed/failed/cancelled)."""
        if event.type == "aaa.run.completed":
            return cls(event.run_id, RunStatus.COMPLETED, event.data.get("value"), None, event)
        if event.type == "aaa.run.failed":
            error = ErrorDetail.from_json(event.data.get("error")) or ErrorDetail("Unknown")
            return cls(event.run_id, RunStatus.FAILED, None, error, event)
        if event.type == "aaa.run.cancelled":
            error = ErrorDetail("Cancelled", str(event.data.get("reason", "")))
            return cls(event.run_id, RunStatus.CANCELLED, None, error, event)
        raise ValueError(f"not a terminal event: {event.type}")


@dataclass(frozen=True)
class SignalResult:
    """Signal's answer.

    Attributes:
        seq: seq of the appended event; 0 when nothing was appended.
        already_decided: for approval decisions, True when an earlier decision
            (or expiry) stands and this one changed nothing.
        decision: for approval decisions, the event type of the decision that
            stands: "aaa.approval.granted", "aaa.approval.denied",
            "aaa.approval.edited", "aaa.approval.expired", or "aaa.approval.voted"
            for a grant that is not yet the last one the call needs (it stays pending).
        votes: for a grant (or an edit with ``grant=True``), the grants cast so far, this one
            included; 0 when nothing was recorded.
        approvals_required: for a grant or an edit, how many grants the call needs.
        new_call_id: for an edit, the call that takes the edited one's place.
        new_arguments_sha256: for an edit, the digest of the new call's arguments:
            a grant of ``new_call_id`` is bound to it.
    """

    seq: int
    already_decided: bool
    decision: str
    votes: int = 0
    approvals_required: int = 0
    new_call_id: str = ""
    new_arguments_sha256: str = ""

    @classmethod
    def from_proto(cls, msg: run_pb2.SignalResponse) -> SignalResult:
        """Convert an ``aaa.v1.SignalResponse``."""
        return cls(
            seq=msg.seq,
            already_decided=msg.already_decided,
            decision=msg.decision,
            votes=msg.votes,
            approvals_required=msg.approvals_required,
            new_call_id=msg.new_call_id,
            new_arguments_sha256=msg.new_arguments_sha256,
        )


class DecisionStatus(str, Enum):
    """How one item of ``Client.decide_approvals`` went. Members compare equal to their lowercase value."""

    #: Recorded: a grant, a vote (a grant not yet the last one needed) or a denial.
    DECIDED = "decided"
    #: The call was already decided or expired, or this approver already voted; nothing recorded.
    ALREADY_DECIDED = "already_decided"
    #: The digest is not that of the call's arguments (they are not what the reviewer saw).
    MISMATCH = "mismatch"
    #: No such run or pending call.
    NOT_FOUND = "not_found"
    #: Refused for another reason (``error_reason``): a finished run, separation of duties...
    REFUSED = "refused"
    #: ``all_or_nothing`` was set and another item was not decided: nothing was recorded.
    NOT_APPLIED = "not_applied"
    #: A value this SDK does not know (from a newer server).
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DecisionResult:
    """The outcome of one item of ``Client.decide_approvals``, in the order of the items.

    Attributes:
        run_id, call_id: the item.
        status: what happened (``DecisionStatus``); ``ok`` is True for DECIDED.
        decision: for DECIDED, the event recorded ("aaa.approval.granted",
            "aaa.approval.voted" or "aaa.approval.denied"); for ALREADY_DECIDED,
            the decision that stands.
        seq: seq of the recorded event; 0 when nothing was recorded.
        error_reason: for a refusal, the ``ErrorReason`` name (e.g. "ARGUMENTS_MISMATCH",
            "ALREADY_VOTED", "RUN_FINISHED"), as the typed exceptions' ``reason``.
        error_message: the refusal's message.
    """

    run_id: str
    call_id: str
    status: DecisionStatus
    decision: str = ""
    seq: int = 0
    error_reason: str = ""
    error_message: str = ""

    @property
    def ok(self) -> bool:
        """True when this item's decision was recorded."""
        return self.status is DecisionStatus.DECIDED

    @classmethod
    def from_proto(cls, msg: approval_pb2.DecisionResult) -> DecisionResult:
        """Convert an ``aaa.v1.DecisionResult``."""
        name = _enum_name(approval_pb2.DecisionStatus, msg.status, "DECISION_STATUS_")
        return cls(
            run_id=msg.run_id,
            call_id=msg.call_id,
            status=DecisionStatus(name) if name in DecisionStatus._value2member_map_ else DecisionStatus.UNKNOWN,
            decision=msg.decision,
            seq=msg.seq,
            error_reason=msg.error_reason,
            error_message=msg.error_message,
        )


@dataclass(frozen=True)
class Budget:
    """Limits of one run: a deadline in seconds (0: none), a cap on model calls (0: server default)
    and on the tokens built-in models use (0: none)."""

    deadline_s: float = 0.0
    max_model_calls: int = 0
    max_tokens: int = 0

    def to_proto(self) -> run_pb2.Budget:
        """Convert to ``aaa.v1.Budget``."""
        return run_pb2.Budget(
            deadline_s=self.deadline_s, max_model_calls=self.max_model_calls, max_tokens=self.max_tokens
        )


@dataclass(frozen=True)
class ToolRef:
    """A tool a run may call, by registered name, optionally gated for this run only.

    A run can add a gate (``requires_approval=True``), never remove one.
    ``approval_timeout_s`` > 0 turns an unanswered request into a denial: shorter
    than the tool's, or one where it has none (longer is refused, INVALID_FIELD).
    ``approvals_required`` above the tool's asks for more distinct approvers in
    this run (never fewer; 0 keeps the tool's).
    """

    name: str
    requires_approval: bool = False
    approval_timeout_s: float = 0.0
    approvals_required: int = 0

    def to_proto(self) -> run_pb2.ToolRef:
        """Convert to ``aaa.v1.ToolRef``."""
        return run_pb2.ToolRef(
            name=self.name,
            requires_approval=self.requires_approval,
            approval_timeout_s=self.approval_timeout_s,
            approvals_required=self.approvals_required,
        )


@dataclass(frozen=True)
class Policy:
    """The approval policy a server runs with (``Client.get_policy``, ``Client.reload_policy``).

    Attributes:
        loaded: False when the server runs without a policy (the other fields are then empty).
        sha256: hex SHA-256 of the policy file as loaded; events a rule decided carry it.
        rules: the rules' names, in the order they are tried.
        file: the file it was loaded from.
    """

    loaded: bool
    sha256: str = ""
    rules: list[str] = field(default_factory=list)
    file: str = ""

    @classmethod
    def from_proto(cls, msg: policy_pb2.GetPolicyResponse) -> Policy:
        """Convert an ``aaa.v1.GetPolicyResponse``."""
        return cls(loaded=msg.loaded, sha256=msg.sha256, rules=list(msg.rules), file=msg.file)


@dataclass(frozen=True)
class Grant:
    """A standing grant: an approver's decision made in advance (see ``Client.create_grant``).

    Attributes:
        id: its id; the calls it grants name it as their actor (kind ``grant``).
        tool: the tool whose calls it grants.
        run_id, labels, started_by: its scope (empty: any).
        condition: a CEL expression the call must make true (empty: any call).
        arguments_sha256: the exact arguments it grants (empty: any).
        expires_at: when it stops granting (None: never).
        max_uses: how many calls it may grant (0: any number).
        uses: calls it granted so far; ``uses_left``: None when unlimited.
        active: in force (not revoked, expired or used up).
        reason, created_by, created_at, creator_groups: who made it, when and why.
        revoked_at, revoked_by, revoke_reason: set once revoked.
    """

    id: str
    tool: str
    run_id: str
    labels: dict[str, str]
    started_by: str
    condition: str
    arguments_sha256: str
    expires_at: datetime | None
    max_uses: int
    uses: int
    uses_left: int | None
    active: bool
    reason: str
    created_by: str
    created_at: datetime | None
    creator_groups: list[str]
    revoked_at: datetime | None
    revoked_by: str
    revoke_reason: str

    @classmethod
    def from_proto(cls, msg: grant_pb2.Grant) -> Grant:
        """Convert an ``aaa.v1.Grant``."""
        return cls(
            id=msg.id,
            tool=msg.tool,
            run_id=msg.scope.run_id,
            labels=dict(msg.scope.labels),
            started_by=msg.scope.started_by,
            condition=msg.condition,
            arguments_sha256=msg.arguments_sha256,
            expires_at=_time(msg, "expires_at"),
            max_uses=msg.max_uses,
            uses=msg.uses,
            uses_left=msg.uses_left if msg.HasField("uses_left") else None,
            active=msg.active,
            reason=msg.reason,
            created_by=msg.created_by,
            created_at=_time(msg, "created_at"),
            creator_groups=list(msg.creator_groups),
            revoked_at=_time(msg, "revoked_at"),
            revoked_by=msg.revoked_by,
            revoke_reason=msg.revoke_reason,
        )
