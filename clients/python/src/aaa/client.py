"""The asyncio client: start runs, follow their events, answer approvals.

::

    client = await aaa.connect("127.0.0.1:50051")
    run = await client.start_run("Pay ACME $250", model="seed", tools=[wire_money])
    async for event in run.events():
        ...
    outcome = await run.result()

Transient failures (UNAVAILABLE: a dropped connection, a restarting server)
are retried for up to ``retry_s`` seconds. StartRun, Signal and
DecideApprovals get a fresh ``request_id`` when the caller gives none, so a
retried call never starts a second run or appends a second event, and
answers as the first try did. Event and approval streams resume from
their cursor after a dropped connection, with no gap and no duplicate.

Given a list of addresses (the servers of a cluster), the client spreads its
calls over them (gRPC's ``round_robin``) and leaves out those that do not
answer, until they do again; a run's writes go to the server that owns the
run when the client knows which (see ``_route.RunOwners``).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncGenerator, Callable, Iterable, Mapping, Sequence, Union

import grpc
import grpc.aio

from . import _otel
from ._backoff import Backoff, transient
from ._connection import DEFAULT_ADDRESS, Connection  # DEFAULT_ADDRESS: aaa.client's, as before
from ._proto.aaa.v1 import approval_pb2, grant_pb2, policy_pb2, run_pb2, subscription_pb2
from .errors import AaaError, Unavailable, from_rpc_error
from .models import OpenAI, Reply
from .subscriptions import START_FROM, Handler, follow_group
from ._tool import Tool
from .types import (
    TERMINAL_EVENT_TYPES,
    Approval,
    ApprovalResolution,
    ApprovalVoted,
    Budget,
    DecisionResult,
    Event,
    Grant,
    Outcome,
    Policy,
    RunInfo,
    RunStatus,
    SignalResult,
    SnapshotComplete,
    ToolRef,
    dumps,
)
from .worker import Worker

ToolLike = Union[Tool, ToolRef, str]
ModelLike = Union[str, OpenAI, Sequence[Reply]]
#: A call for ``decide_approvals``: an ``Approval`` or ``(run_id, call_id, arguments_sha256)``.
DecisionItemLike = Union[Approval, tuple[str, str, str]]

_BATCH_DECISIONS = {"grant": approval_pb2.BATCH_DECISION_GRANT, "deny": approval_pb2.BATCH_DECISION_DENY}


async def connect(
    address: str | Sequence[str] | None = None,
    *,
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    timeout: float = 10.0,
    retry_s: float = 30.0,
) -> Client:
    """Connect to an aaa server, or to the servers of a cluster, and wait until one answers.

    Args:
        address: "host:port"; defaults to env AAA_SERVER, then 127.0.0.1:50051. A list of
            "host:port" (the servers of a cluster, "[ipv6]:port" too) spreads the calls over
            those that answer (round robin); host names in it are resolved once, here.
        token: bearer token sent with every call; defaults to env AAA_TOKEN.
        credentials: TLS settings, e.g. ``grpc.ssl_channel_credentials(ca_pem)``
            (with ``private_key`` and ``certificate_chain`` for a client
            certificate); without them the connection is plain text.
        timeout: seconds to wait for the connection before raising ``Unavailable``.
        retry_s: how long calls keep retrying while the server is unavailable.
    """
    client = Client(address, token=token, credentials=credentials, retry_s=retry_s)
    try:
        await asyncio.wait_for(client._channel.channel_ready(), timeout)
    except asyncio.TimeoutError:
        await client.close()
        raise Unavailable(
            f"no aaa server answered at {client.address} within {timeout:g}s",
            code=grpc.StatusCode.UNAVAILABLE,
        ) from None
    if client._owners.enabled:
        await client._owners.read()  # best effort: without the map, writes take the round robin
    return client


class Client(Connection):
    """A connection to an aaa server (or to the servers of a cluster). Create it with
    ``await aaa.connect(...)``; close it with ``await client.close()`` or ``async with client:``.

    Attributes:
        address: the server address (those of a list joined by commas).
        addresses: the server addresses, one unless a list was given.
        approvals: list and watch pending approvals (``Approvals``).
        stubs: the generated gRPC stubs (``stubs.run``, ``stubs.approval``, ``stubs.worker``,
            ``stubs.subscription``, ``stubs.policy``, ``stubs.grant``) for anything the SDK does not wrap.
    """

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        retry_s: float = 30.0,
    ) -> None:
        super().__init__(address, token=token, credentials=credentials, retry_s=retry_s)
        self.approvals = Approvals(self)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start_run(
        self,
        task: str,
        *,
        model: ModelLike,
        tools: Iterable[ToolLike] = (),
        budget: Budget | None = None,
        labels: Mapping[str, str] | None = None,
        request_id: str | None = None,
        system: str = "",
    ) -> Run:
        """Start a run and return its handle.

        Args:
            task: the conversation's first user message.
            model: the name of a worker-served model, ``openai(...)`` for the
                server's built-in OpenAI-compatible model, or a list of steps for
                the built-in scripted model (``text(...)``, ``tool_call(...)``, ``echo()``).
            tools: the tools the run may call: ``@tool`` functions (their gate
                and ``approvals_required`` are applied to this run too), ``ToolRef``s
                or names. They must have been registered by a worker first.
            budget: deadline and model-call limit.
            labels: labels for filtering runs and approvals.
            request_id: idempotency key; a retry with the same key returns the
                first run. Generated when omitted.
            system: optional system instructions.
        """
        spec = run_pb2.ModelSpec()
        if isinstance(model, str):
            spec.worker = model
        elif isinstance(model, OpenAI):
            spec.openai.CopyFrom(model.to_proto())
        else:
            spec.scripted.steps.extend(step.to_step() for step in model)
        request = run_pb2.StartRunRequest(
            task=task,
            model=spec,
            tools=[_tool_ref(t).to_proto() for t in tools],
            labels=dict(labels or {}),
            request_id=request_id or str(uuid.uuid4()),
            system=system,
        )
        if budget is not None:
            request.budget.CopyFrom(budget.to_proto())
        # With OpenTelemetry set up and a span current, the run's spans join its trace.
        traceparent = _otel.traceparent()
        metadata = (("traceparent", traceparent),) if traceparent else None
        response = await self._call(self.stubs.run.StartRun, request, metadata=metadata)
        return Run(self, response.run_id, created=response.created)

    def run(self, run_id: str) -> Run:
        """The handle of an existing run (no call is made)."""
        return Run(self, run_id)

    async def decide_approvals(
        self,
        items: Iterable[DecisionItemLike],
        decision: str = "grant",
        *,
        reason: str | None = None,
        comment: str | None = None,
        all_or_nothing: bool = False,
        approver: str | None = None,
        request_id: str | None = None,
    ) -> list[DecisionResult]:
        """Grant or deny several calls at once; one ``DecisionResult`` per item, in order.

        Each item is bound to the digest of the arguments the reviewer was shown:
        an ``Approval`` (from ``approvals.list`` or ``approvals.watch``) or a
        ``(run_id, call_id, arguments_sha256)`` tuple. A call whose arguments are
        not those gets ``MISMATCH`` and is not decided. There is no "decide
        everything matching a filter": list the approvals, show them, pass them.

        Args:
            decision: "grant" or "deny".
            reason: for a denial, what the model reads.
            comment: for a grant, recorded with it.
            all_or_nothing: decide nothing unless every item is decided (the
                others then get ``NOT_APPLIED``).
            approver: with auth off, the name the grants count under (see ``Run.approve``).
            request_id: idempotency key; a retry with the same key answers each item
                the first call decided with that first result (``DECIDED`` and its
                seq, not ``ALREADY_DECIDED``). Generated when omitted.

        An item's refusal is its result's ``status``, not an exception; a
        malformed batch (no items, a call twice) raises ``InvalidField``.
        """
        if decision not in _BATCH_DECISIONS:
            raise ValueError(f"decision must be 'grant' or 'deny', not {decision!r}")
        request = approval_pb2.DecideApprovalsRequest(
            items=[_decision_item(item) for item in items],
            decision=_BATCH_DECISIONS[decision],
            reason=reason or "",
            comment=comment or "",
            all_or_nothing=all_or_nothing,
            approver=approver or "",
            request_id=request_id or str(uuid.uuid4()),
        )
        # A retry after a lost answer gets the first answer again (the request id).
        response = await self._call(self.stubs.approval.DecideApprovals, request)
        return [DecisionResult.from_proto(r) for r in response.results]

    async def get_policy(self) -> Policy:
        """The approval policy this server runs with (``loaded`` is False without one).

        Each server of a cluster answers for its own ``--policy`` file.
        """
        response = await self._call(self.stubs.policy.GetPolicy, policy_pb2.GetPolicyRequest())
        return Policy.from_proto(response)

    async def reload_policy(self) -> Policy:
        """Make the server read its policy file again; returns the policy now in force.

        Role admin. A file that does not check raises ``InvalidField`` (the message names the
        rule) and the policy in force stays; so does a server started without ``--policy``. Calls
        requested from now on follow the new policy; those already waiting keep what they were
        requested with.
        """
        response = await self._call(self.stubs.policy.ReloadPolicy, policy_pb2.ReloadPolicyRequest())
        return Policy.from_proto(response.policy)

    async def create_grant(
        self,
        tool: ToolLike,
        *,
        reason: str,
        run_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        started_by: str | None = None,
        condition: str | None = None,
        arguments_sha256: str | None = None,
        expires_at: datetime | None = None,
        expires_in: float | None = None,
        max_uses: int = 0,
        request_id: str | None = None,
    ) -> Grant:
        """Grant a tool's calls in advance (role approver): a call that would wait for one
        person and that the grant matches runs at once, with actor kind ``grant``.

        Args:
            tool: the tool (a ``@tool`` function, ``ToolRef`` or name).
            reason: why, for the audit trail (required).
            run_id, labels, started_by: the scope: only this run's calls, runs with every
                one of these labels, runs this principal started.
            condition: a CEL expression over the call (``args``, ``labels``, ``task``,
                ``started_by``, ``now``), e.g. ``"args.amount < 500"``.
            arguments_sha256: only a call with exactly these arguments (``Approval.arguments_sha256``).
            expires_at / expires_in: when it stops granting (a datetime, or seconds from now).
            max_uses: how many calls it may grant (0: any number).
            request_id: idempotency key: a retry with the same id creates nothing and
                returns the grant the first call created (default: a fresh one).

        Bad input raises ``InvalidField`` naming the field. Retried while the server is
        unavailable, with one request id, so a lost answer never makes a second grant.
        """
        if expires_in is not None:
            expires_at = datetime.now(timezone.utc) + timedelta(seconds=expires_in)
        request = grant_pb2.CreateGrantRequest(
            tool=_tool_ref(tool).name,
            scope=grant_pb2.GrantScope(run_id=run_id or "", labels=dict(labels or {}), started_by=started_by or ""),
            condition=condition or "",
            arguments_sha256=arguments_sha256 or "",
            max_uses=max_uses,
            reason=reason,
            request_id=request_id or str(uuid.uuid4()),
        )
        if expires_at is not None:
            request.expires_at.FromDatetime(expires_at.astimezone(timezone.utc))
        response = await self._call(self.stubs.grant.CreateGrant, request)
        return Grant.from_proto(response.grant)

    async def list_grants(self, *, include_revoked: bool = False, tool: str | None = None) -> list[Grant]:
        """The grants in force with their uses (``include_revoked``: revoked, expired and used-up ones too)."""
        request = grant_pb2.ListGrantsRequest(include_revoked=include_revoked, tool=tool or "")
        response = await self._call(self.stubs.grant.ListGrants, request)
        return [Grant.from_proto(g) for g in response.grants]

    async def revoke_grant(self, grant_id: str, *, reason: str) -> Grant:
        """Revoke a grant: it grants nothing from now on (role approver). Revoking twice changes nothing."""
        request = grant_pb2.RevokeGrantRequest(id=grant_id, reason=reason)
        response = await self._call(self.stubs.grant.RevokeGrant, request)
        return Grant.from_proto(response.grant)

    async def get_run(self, run_id: str) -> RunInfo:
        """Return a run's summary, with its pending approvals."""
        response = await self._call(self.stubs.run.GetRun, run_pb2.GetRunRequest(run_id=run_id))
        return RunInfo.from_proto(response.run)

    async def list_runs(
        self,
        *,
        status: RunStatus | str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int | None = None,
    ) -> list[RunInfo]:
        """List runs, newest first, optionally filtered by status and labels (all pages, up to ``limit``)."""
        request = run_pb2.ListRunsRequest(labels=dict(labels or {}), page_size=min(limit or 1000, 1000))
        if status is not None:
            request.status = RunStatus(status).to_proto()
        runs: list[RunInfo] = []
        while True:
            response = await self._call(self.stubs.run.ListRuns, request)
            runs.extend(RunInfo.from_proto(r) for r in response.runs)
            if not response.next_page_token or (limit is not None and len(runs) >= limit):
                return runs[:limit] if limit is not None else runs
            request.page_token = response.next_page_token

    async def subscribe(
        self,
        event_types: str | Sequence[str],
        handler: Handler,
        *,
        group: str,
        labels: Mapping[str, str] | None = None,
        start_from: str = "now",
        start_after_position: int | None = None,
        ack_timeout_s: float = 0.0,
        max_deliveries: int = 0,
        max_in_flight: int = 0,
    ) -> None:
        """Join a consumer group and call ``handler`` for each delivery, until cancelled.

        Each event matching ``event_types`` (exact types, prefixes like
        ``"aaa.approval.*"``, or ``"*"``) goes to one member of ``group`` at a
        time. ``handler(delivery)`` (sync or async; ``delivery.event`` is the
        event) returning acks it; raising nacks it, and it is delivered again
        (``delivery.attempt`` + 1) until the group's ``max_deliveries`` move it
        to the dead-letter list. Deliveries are handled concurrently, at most
        ``max_in_flight`` at a time. Delivery is at least once: deduplicate on
        ``(event.run_id, event.seq)``.

        When the stream ends for a reason that passes (the server ended it,
        stopped, restarted or was unreachable: UNAVAILABLE; or dropped this
        member as too slow: MEMBER_TOO_SLOW), the group is joined again after
        a backoff of 50 ms doubling up to 5 s, for as long as it takes
        (``retry_s`` does not apply); deliveries not acked come again.

        Args:
            group: the group's name; the first member creates it.
            labels: only events of runs carrying all of these labels.
            start_from: where a new group starts: "now" (default) or "beginning".
            start_after_position: a new group starts after this global position.
            ack_timeout_s: seconds before an unacked delivery is made again (0: group's, 30 s).
            max_deliveries: attempts before dead-lettering (0: group's, 5).
            max_in_flight: unacked deliveries this member holds at most (0: 16).

        Any other refusal ends it: ``InvalidField`` for a bad pattern or group
        name, ``GroupMismatch`` when the group exists with another definition,
        ``PermissionDenied``, ``Unauthenticated``...
        """
        opening = subscription_pb2.SubscriptionOpen(
            group=group,
            event_types=[event_types] if isinstance(event_types, str) else list(event_types),
            labels=dict(labels or {}),
            ack_timeout_s=ack_timeout_s,
            max_deliveries=max_deliveries,
            max_in_flight=max_in_flight,
        )
        if start_after_position is not None:
            opening.start_from = subscription_pb2.START_FROM_AFTER_POSITION
            opening.start_after_position = start_after_position
        else:
            opening.start_from = START_FROM[start_from]
        await follow_group(self, opening, handler)

    def worker(
        self,
        *,
        tools: Iterable[Tool] = (),
        models: Mapping[str, Callable[..., Any]] | None = None,
        identity: str | None = None,
        concurrency: int = 10,
        poll_wait_s: float = 0.0,
        stop_grace_s: float | None = 30.0,
    ) -> Worker:
        """Create a worker serving these tools and models; start it with ``async with worker:``.

        See ``aaa.Worker`` for the arguments.
        """
        return Worker(
            self,
            tools=tools,
            models=models,
            identity=identity,
            concurrency=concurrency,
            poll_wait_s=poll_wait_s,
            stop_grace_s=stop_grace_s,
        )


def _tool_ref(item: ToolLike) -> ToolRef:
    """Normalize a tools= item to a ToolRef."""
    if isinstance(item, ToolRef):
        return item
    if isinstance(item, Tool):
        return ToolRef(
            item.name, requires_approval=item.requires_approval, approvals_required=item.approvals_required or 0
        )
    if isinstance(item, str):
        return ToolRef(item)
    raise TypeError(f"tools= takes @tool functions, ToolRef or names, not {item!r}")


def _decision_item(item: DecisionItemLike) -> approval_pb2.DecisionItem:
    """Normalize a decide_approvals item: an Approval, or (run_id, call_id, arguments_sha256)."""
    if isinstance(item, Approval):
        return approval_pb2.DecisionItem(
            run_id=item.run_id, call_id=item.call_id, arguments_sha256=item.arguments_sha256
        )
    if isinstance(item, tuple) and len(item) == 3 and all(isinstance(part, str) for part in item):
        run_id, call_id, arguments_sha256 = item
        return approval_pb2.DecisionItem(run_id=run_id, call_id=call_id, arguments_sha256=arguments_sha256)
    raise TypeError(f"decide_approvals takes Approvals or (run_id, call_id, arguments_sha256) tuples, not {item!r}")


class Run:
    """The handle of one run: follow its events, signal it, wait for its outcome.

    Attributes:
        id: the run's id.
        created: False when StartRun's request_id matched an earlier run.
    """

    def __init__(self, client: Client, run_id: str, *, created: bool = True) -> None:
        self.client = client
        self.id = run_id
        self.created = created

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    @property
    def run_id(self) -> str:
        """The run's id (same as ``id``)."""
        return self.id

    async def get(self) -> RunInfo:
        """Return the run's summary, with its pending approvals."""
        return await self.client.get_run(self.id)

    async def events(
        self,
        after_seq: int = 0,
        *,
        follow: bool = True,
        type_prefix: str = "",
        stop_at_end: bool = True,
    ) -> AsyncGenerator[Event, None]:
        """Iterate over the run's events with seq greater than ``after_seq``.

        Args:
            after_seq: exclusive cursor; pass the seq of the last event you
                handled to resume.
            follow: after the stored history, wait for live events.
            type_prefix: only events whose type starts with this.
            stop_at_end: end after the run's terminal event.

        A dropped connection is resumed from the last event received, so no
        event is skipped or repeated. Close the iterator (break out of the
        loop) when done; ``contextlib.aclosing`` closes it at once.
        """
        cursor = after_seq
        backoff = Backoff(self.client.retry_s)
        while True:
            request = run_pb2.StreamEventsRequest(
                run_id=self.id, after_seq=cursor, follow=follow, type_prefix=type_prefix, stop_at_end=stop_at_end
            )
            call = self.client.stubs.run.StreamEvents(request)
            try:
                async for item in call:
                    backoff.reset()
                    if item.HasField("caught_up"):
                        cursor = max(cursor, item.caught_up.last_seq)
                        continue
                    if item.event.seq <= cursor:
                        continue  # already delivered before a reconnect
                    cursor = item.event.seq
                    event = Event.from_proto(item.event)
                    yield event
                    if stop_at_end and event.type in TERMINAL_EVENT_TYPES:
                        return
                return
            except grpc.aio.AioRpcError as err:
                if transient(err) and await backoff.wait():
                    continue
                raise from_rpc_error(err) from err
            finally:
                call.cancel()

    async def wait_for(self, event_type: str, *, after_seq: int = 0) -> Event:
        """Return the first event of this type after ``after_seq``, waiting for it if needed.

        Raises ``AaaError`` if the run ends without such an event.
        """
        stream = self.events(after_seq, type_prefix=event_type)
        try:
            async for event in stream:
                if event.type == event_type:
                    return event
        finally:
            await stream.aclose()
        raise AaaError(f"run {self.id} ended without a {event_type} event", reason="NO_SUCH_EVENT")

    async def result(self, *, timeout: float | None = None) -> Outcome:
        """Wait for the run to end and return its ``Outcome`` (status, value, error).

        A failed or cancelled run is an outcome, not an exception.
        """
        return await asyncio.wait_for(self._result(), timeout)

    async def _result(self) -> Outcome:
        stream = self.events(type_prefix="aaa.run.")
        try:
            async for event in stream:
                if event.type in TERMINAL_EVENT_TYPES:
                    return Outcome.from_event(event)
        finally:
            await stream.aclose()
        raise AaaError(f"the event stream of run {self.id} ended before its terminal event", reason="STREAM_ENDED")

    async def signal(
        self, type: str, data: Mapping[str, Any] | None = None, *, request_id: str | None = None
    ) -> SignalResult:
        """Append a client event: "aaa.approval.granted", "aaa.approval.denied",
        "aaa.approval.edited", or a type outside "aaa.".

        Args:
            type: the event type.
            data: the event's data, a JSON object.
            request_id: idempotency key; generated when omitted.
        """
        request = run_pb2.SignalRequest(
            run_id=self.id, type=type, data_json=dumps(dict(data or {})), request_id=request_id or str(uuid.uuid4())
        )
        response = await self.client._call(self.client._for_run(self.id, lambda stubs: stubs.run.Signal), request)
        return SignalResult.from_proto(response)

    async def approve(
        self,
        call_id: str,
        *,
        arguments_sha256: str | None = None,
        comment: str | None = None,
        approver: str | None = None,
        request_id: str | None = None,
    ) -> SignalResult:
        """Grant one call. With ``arguments_sha256`` (from the ``Approval``), only those exact arguments.

        A call that needs several approvers runs at the last grant it needs; the
        ones before answer ``decision == "aaa.approval.voted"`` with ``votes`` of
        ``approvals_required``. The same approver granting twice raises ``AlreadyVoted``.
        ``approver`` names who grants when the server runs without auth (unverified;
        by default the caller's IP address); with auth on the approver is the
        authenticated principal, and naming anyone else raises ``InvalidField``.
        """
        data = _decision_data(call_id, arguments_sha256, approver)
        if comment:
            data["comment"] = comment
        return await self.signal("aaa.approval.granted", data, request_id=request_id)

    async def deny(
        self,
        call_id: str,
        reason: str | None = None,
        *,
        arguments_sha256: str | None = None,
        approver: str | None = None,
        request_id: str | None = None,
    ) -> SignalResult:
        """Deny one call; the model reads a tool failure of type ApprovalDenied with ``reason``.

        One denial denies a call that needs several approvers. ``arguments_sha256``
        and ``approver`` are as for ``approve``.
        """
        data = _decision_data(call_id, arguments_sha256, approver)
        if reason:
            data["reason"] = reason
        return await self.signal("aaa.approval.denied", data, request_id=request_id)

    async def edit(
        self,
        call_id: str,
        arguments: Mapping[str, Any],
        *,
        reason: str | None = None,
        grant: bool = False,
        arguments_sha256: str | None = None,
        approver: str | None = None,
        request_id: str | None = None,
    ) -> SignalResult:
        """Replace a pending call's arguments: the call never runs, a new call with ``arguments``
        takes its place and waits for its own grant.

        Returns the ``SignalResult`` with ``decision == "aaa.approval.edited"``,
        ``new_call_id`` and ``new_arguments_sha256`` (pass both to ``approve``). With
        ``grant=True`` the edit also grants the new call (``votes`` 1): a call that needs
        one approver runs at once. The model reads the tool's result prefixed with a
        note of the new arguments and ``reason``.

        Args:
            arguments: the whole new arguments object; it must fit the tool's schema
                and differ from the requested arguments (else ``InvalidField``,
                field "data_json.arguments").
            arguments_sha256: the digest of the arguments being edited, as shown;
                ``ArgumentsMismatch`` if they are not the call's.
            approver: the name of the grant with ``grant=True`` (as for ``approve``).
        """
        data = _decision_data(call_id, arguments_sha256, approver)
        data["arguments"] = dict(arguments)
        if reason:
            data["reason"] = reason
        if grant:
            data["grant"] = True
        return await self.signal("aaa.approval.edited", data, request_id=request_id)

    async def cancel(self, reason: str = "") -> int:
        """Cancel the run; returns the seq of aaa.run.cancelled (0 if it was already cancelled)."""
        request = run_pb2.CancelRunRequest(run_id=self.id, reason=reason)
        response = await self.client._call(self.client._for_run(self.id, lambda stubs: stubs.run.CancelRun), request)
        return response.seq


def _decision_data(call_id: str, arguments_sha256: str | None, approver: str | None) -> dict[str, Any]:
    """The data every approval decision may carry (empty values are left out)."""
    data: dict[str, Any] = {"call_id": call_id}
    if arguments_sha256:
        data["arguments_sha256"] = arguments_sha256
    if approver:
        data["approver"] = approver
    return data


ApprovalItem = Union[Approval, ApprovalVoted, ApprovalResolution, SnapshotComplete]


class Approvals:
    """Pending approvals across runs: ``client.approvals.list()`` and ``client.approvals.watch()``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def list(
        self,
        *,
        tool: str = "",
        run_id: str = "",
        labels: Mapping[str, str] | None = None,
        limit: int | None = None,
        decidable: bool = False,
    ) -> list[Approval]:
        """List pending approval requests, oldest run first (all pages, up to ``limit``).

        With ``decidable=True`` only the calls the caller may decide: those whose approver
        groups include one of its own, and those that name none (with auth off, every call).
        """
        request = approval_pb2.ListApprovalsRequest(
            tool=tool,
            run_id=run_id,
            labels=dict(labels or {}),
            page_size=min(limit or 1000, 1000),
            decidable=decidable,
        )
        found: list[Approval] = []
        while True:
            response = await self.client._call(self.client.stubs.approval.ListApprovals, request)
            found.extend(Approval.from_proto(a) for a in response.approvals)
            if not response.next_page_token or (limit is not None and len(found) >= limit):
                return found[:limit] if limit is not None else found
            request.page_token = response.next_page_token

    async def watch(
        self,
        *,
        tool: str = "",
        run_id: str = "",
        labels: Mapping[str, str] | None = None,
        resume_token: str | None = None,
        after_position: int | None = None,
        heartbeat_s: float = 0.0,
        decidable: bool = False,
    ) -> AsyncGenerator[ApprovalItem, None]:
        """Iterate over pending approvals, then over changes, forever.

        Yields each pending ``Approval`` (the snapshot), one ``SnapshotComplete``,
        then each new ``Approval``, each ``ApprovalVoted`` (a grant of a call that
        needs several, not yet the last) and each ``ApprovalResolution`` (granted,
        denied, edited: see ``replaced_by``, or expired) as it happens. With
        ``resume_token`` (the ``resume_token`` of the last item you handled, as it
        came) the snapshot is skipped and exactly the changes after that item come,
        on any server of the deployment and across restarts.
        ``after_position`` (the ``position`` of the last item handled) is the older
        form of resuming: exact only for positions from before the server's log was
        partitioned by shard, or of a log with one committer (the embedded store, or
        one server on PostgreSQL); it is ignored when ``resume_token`` is given.
        With ``decidable=True`` only the requests the caller may decide are yielded
        (see ``list``); votes and resolutions are not filtered.
        A dropped connection is resumed with the last resume token seen (the last
        position seen, from a server that sends no tokens); a snapshot cut short is
        restarted without repeating what was yielded.
        """
        token = resume_token or None
        position = after_position
        snapshot_seen: set[tuple[str, str]] = set()
        backoff = Backoff(self.client.retry_s)
        while True:
            request = approval_pb2.WatchApprovalsRequest(
                tool=tool, run_id=run_id, labels=dict(labels or {}), heartbeat_s=heartbeat_s, decidable=decidable
            )
            # One resume point: the server refuses an after_position past its head even
            # beside a token, and a token says more.
            if token is not None:
                request.resume_token = token
            elif position is not None:
                request.after_position = position
            call = self.client.stubs.approval.WatchApprovals(request)
            try:
                async for item in call:
                    backoff.reset()
                    kind = item.WhichOneof("item")
                    in_snapshot = token is None and position is None
                    if not in_snapshot or kind == "snapshot_complete":
                        # The snapshot's requests carry no token: resuming there would skip the rest.
                        token = item.resume_token or token
                        position = item.position
                    if kind == "snapshot_complete":
                        yield SnapshotComplete(item.snapshot_complete.pending, item.position, item.resume_token)
                    elif kind == "requested":
                        if in_snapshot:
                            key = (item.requested.run_id, item.requested.call_id)
                            if key in snapshot_seen:
                                continue
                            snapshot_seen.add(key)
                        yield Approval.from_proto(item.requested, item.resume_token)
                    elif kind == "voted":
                        yield ApprovalVoted.from_proto(item.voted, item.position, item.resume_token)
                    elif kind == "resolved":
                        yield ApprovalResolution.from_proto(item.resolved, item.position, item.resume_token)
                return
            except grpc.aio.AioRpcError as err:
                if transient(err) and await backoff.wait():
                    continue
                raise from_rpc_error(err) from err
            finally:
                call.cancel()
