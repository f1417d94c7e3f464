"""Approvals: granted from another client while a third watches, denied, cancelled, duplicates harmless;
a watch resumes with its resume token, also across a server restart."""

from __future__ import annotations

import asyncio

import aaa
from aaa import text, tool, tool_call

from conftest import start_server, stop_process
from helpers import WAIT_S, collect, next_item, of_type, same


def payment_setup(uid: str):
    """A gated wire tool, a model that calls it once, and a log of the tool's real runs."""
    ran: list[tuple[int, str]] = []

    @tool(name=f"wire_{uid}", requires_approval=True)
    def wire(amount: int, to: str) -> str:
        """Send money."""
        ran.append((amount, to))
        return f"sent ${amount} to {to}"

    def model(request: aaa.ModelRequest) -> aaa.Reply:
        last = request.messages[-1]
        if last.role == "user":
            return tool_call(wire, amount=250, to="ACME")
        if last.error is not None:
            return text(f"refused: {last.error.type}: {last.error.message}")
        return text(last.content)

    return wire, model, ran


async def test_second_client_approves_while_third_watches(server, client, uid):
    wire, model, ran = payment_setup(uid)
    labels = {"test": uid}
    approver = await aaa.connect(server.address)
    watcher = await aaa.connect(server.address)
    watch = watcher.approvals.watch(labels=labels)
    try:
        snapshot = await next_item(watch)
        assert isinstance(snapshot, aaa.SnapshotComplete) and snapshot.pending == 0

        async with client.worker(tools=[wire], models={f"m-{uid}": model}):
            run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire], labels=labels)

            requested = await next_item(watch)
            assert isinstance(requested, aaa.Approval)
            assert (requested.run_id, requested.tool, requested.labels) == (run.id, wire.name, labels)
            assert requested.task == "Pay ACME $250"
            assert same(requested.arguments, {"amount": 250, "to": "ACME"})
            assert requested.arguments_json == '{"amount":250,"to":"ACME"}'

            listed = await approver.approvals.list(labels=labels)
            assert [(a.run_id, a.call_id) for a in listed] == [(run.id, requested.call_id)]
            info = await approver.get_run(run.id)
            assert info.status == aaa.RunStatus.WAITING_FOR_APPROVAL == "waiting_for_approval"
            assert [a.call_id for a in info.pending_approvals] == [requested.call_id]
            assert ran == []

            granted = await approver.run(run.id).approve(
                requested.call_id, arguments_sha256=requested.arguments_sha256, comment="ok by test"
            )
            assert (granted.already_decided, granted.decision) == (False, "aaa.approval.granted")
            assert granted.seq > requested.seq

            resolved = await next_item(watch)
            assert isinstance(resolved, aaa.ApprovalResolution)
            assert (resolved.run_id, resolved.call_id) == (run.id, requested.call_id)
            assert resolved.outcome == aaa.ApprovalOutcome.GRANTED

            outcome = await run.result(timeout=WAIT_S)
            assert outcome.ok and outcome.value == {"text": "sent $250 to ACME"}

        # Duplicates are harmless, also once the run has finished.
        again = await approver.run(run.id).approve(requested.call_id)
        assert (again.already_decided, again.decision) == (True, "aaa.approval.granted")
        late_deny = await approver.run(run.id).deny(requested.call_id, "too late")
        assert (late_deny.already_decided, late_deny.decision) == (True, "aaa.approval.granted")
        assert ran == [(250, "ACME")]
        assert await approver.approvals.list(labels=labels) == []
        assert (await approver.get_run(run.id)).status == aaa.RunStatus.COMPLETED

        # Resuming the watch from the snapshot's position replays the changes since.
        resumed = watcher.approvals.watch(labels=labels, after_position=snapshot.position)
        try:
            first, second = await next_item(resumed), await next_item(resumed)
        finally:
            await resumed.aclose()
        assert isinstance(first, aaa.Approval) and first.call_id == requested.call_id
        assert isinstance(second, aaa.ApprovalResolution) and second.position == resolved.position
    finally:
        await watch.aclose()
        await approver.close()
        await watcher.close()


async def test_denied_call_never_runs_and_the_model_reads_why(client, uid):
    wire, model, ran = payment_setup(uid)
    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire])
        request = await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
        denied = await run.deny(request.data["call_id"], "over the limit")
        assert (denied.already_decided, denied.decision) == (False, "aaa.approval.denied")
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.value == {"text": "refused: ApprovalDenied: over the limit"}
    assert ran == []
    events = await collect(run)
    assert of_type(events, "aaa.tool.started") == []
    failed = of_type(events, "aaa.tool.failed")
    assert [e.data["error"] for e in failed] == [{"type": "ApprovalDenied", "message": "over the limit"}]
    assert failed[0].data["call_id"] == request.data["call_id"]
    # A grant after the denial changes nothing.
    late = await run.approve(request.data["call_id"])
    assert (late.already_decided, late.decision) == (True, "aaa.approval.denied")


async def test_cancel_expires_the_pending_approval(client, uid):
    wire, model, ran = payment_setup(uid)
    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire], labels={"test": uid})
        request = await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
        assert await run.cancel("changed my mind") > 0
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.status == aaa.RunStatus.CANCELLED
    assert outcome.error == aaa.ErrorDetail("Cancelled", "changed my mind")
    expired = of_type(await collect(run), "aaa.approval.expired")
    assert [e.data["call_id"] for e in expired] == [request.data["call_id"]]
    assert await client.approvals.list(labels={"test": uid}) == []
    late = await run.approve(request.data["call_id"])
    assert (late.already_decided, late.decision) == (True, "aaa.approval.expired")
    assert ran == []
    runs = await client.list_runs(labels={"test": uid})
    assert [(r.run_id, r.status) for r in runs] == [(run.id, aaa.RunStatus.CANCELLED)]
    assert await client.list_runs(labels={"test": uid}, status="completed") == []


async def test_deadline_expires_the_pending_approval(client, uid):
    wire, model, ran = payment_setup(uid)
    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        run = await client.start_run(
            "Pay ACME $250", model=f"m-{uid}", tools=[wire], budget=aaa.Budget(deadline_s=1.0)
        )
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.status == aaa.RunStatus.FAILED and outcome.error.type == "DeadlineExceeded"
    expired = of_type(await collect(run), "aaa.approval.expired")
    assert [e.data["reason"] for e in expired] == ["deadline"]
    assert ran == []


async def test_approval_timeout_becomes_a_denial(client, uid):
    wire, model, ran = payment_setup(uid)
    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        ref = aaa.ToolRef(wire.name, approval_timeout_s=0.5)
        run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[ref])
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.value == {"text": "refused: ApprovalDenied: timeout"}
    assert ran == []


def gated_wire(uid: str):
    """A gated tool (a worker must offer it for a run to ask for it)."""

    @tool(name=f"wire_{uid}", requires_approval=True)
    def wire(amount: int) -> str:
        """Send money."""
        return f"sent ${amount}"

    return wire


async def request_approval(client: aaa.Client, wire, labels: dict[str, str], amount: int) -> aaa.Run:
    """A run that asks to call ``wire`` and waits for the decision."""
    run = await client.start_run("pay", model=[tool_call(wire, amount=amount), text("done")], tools=[wire], labels=labels)
    await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
    return run


def change(item) -> tuple[str, str, str, int]:
    """What a watch item says, without its resume token (a resumed stream may encode the same place differently)."""
    return (type(item).__name__, item.run_id, item.call_id, item.position)


async def test_a_watch_resumed_with_a_token_gets_exactly_the_changes_after_it(server, client, uid):
    wire = gated_wire(uid)
    labels = {"test": uid}
    watch = client.approvals.watch(labels=labels)
    try:
        snapshot = await next_item(watch)
        assert isinstance(snapshot, aaa.SnapshotComplete) and snapshot.resume_token
        async with client.worker(tools=[wire]):
            first = await request_approval(client, wire, labels, 1)
            second = await request_approval(client, wire, labels, 2)
        await first.cancel("no")
        await second.cancel("no")
        changes = [await next_item(watch) for _ in range(4)]
    finally:
        await watch.aclose()
    assert [type(c) for c in changes] == [aaa.Approval, aaa.Approval, aaa.ApprovalResolution, aaa.ApprovalResolution]
    assert all(c.resume_token for c in changes)

    # From the snapshot's token and from each change's: exactly the changes after it, in order.
    marks = [snapshot.resume_token] + [c.resume_token for c in changes]
    for k in range(len(marks)):
        resumed = client.approvals.watch(labels=labels, resume_token=marks[k])
        try:
            got = [await next_item(resumed) for _ in changes[k:]]
            assert [change(g) for g in got] == [change(c) for c in changes[k:]]
            # Nothing repeated after them: the next item is a new change.
            async with client.worker(tools=[wire]):
                third = await request_approval(client, wire, labels, 3 + k)
            new = await next_item(resumed)
            assert isinstance(new, aaa.Approval) and new.run_id == third.id
            await third.cancel("no")
            resolved = await next_item(resumed)
            assert isinstance(resolved, aaa.ApprovalResolution) and resolved.run_id == third.id
        finally:
            await resumed.aclose()
        # This round's changes come after every token: the later rounds get them too.
        changes += [new, resolved]


class RecordsWatches:
    """An ApprovalService stub that records each WatchApprovals request it sends."""

    def __init__(self, real) -> None:
        self.real = real
        self.requests = []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def WatchApprovals(self, request):
        self.requests.append(request)
        return self.real.WatchApprovals(request)


async def test_a_watch_resumes_with_its_last_token_across_a_server_restart(tmp_path, uid):
    server = start_server(tmp_path / "data", tmp_path / "server.log")
    watcher = await aaa.connect(server.address)
    watcher.stubs.approval = RecordsWatches(watcher.stubs.approval)
    client = await aaa.connect(server.address)
    wire = gated_wire(uid)
    labels = {"test": uid}
    watch = watcher.approvals.watch(labels=labels)
    try:
        snapshot = await next_item(watch)
        async with client.worker(tools=[wire]):
            first = await request_approval(client, wire, labels, 1)
            second = await request_approval(client, wire, labels, 2)
        requested = [await next_item(watch) for _ in range(2)]
        assert [(type(r), r.run_id) for r in requested] == [(aaa.Approval, first.id), (aaa.Approval, second.id)]
        await first.cancel("no")
        resolved = await next_item(watch)
        assert isinstance(resolved, aaa.ApprovalResolution) and resolved.run_id == first.id and resolved.resume_token

        stop_process(server.process)  # SIGTERM: the stream ends with UNAVAILABLE
        server = start_server(tmp_path / "data", tmp_path / "server.log", listen=server.address)
        await second.cancel("no")
        # Only the change made while the stream was down: none of the earlier ones again.
        after_restart = await next_item(watch)
        assert isinstance(after_restart, aaa.ApprovalResolution) and after_restart.run_id == second.id

        # The first stream started with a snapshot; each try after it (some may have found the
        # server down) resumed with the token of the last item seen.
        first_request, *retries = watcher.stubs.approval.requests
        assert not first_request.HasField("resume_token") and not first_request.HasField("after_position")
        assert retries and all(r.resume_token == resolved.resume_token for r in retries)
        assert not any(r.HasField("after_position") for r in retries)
        assert snapshot.resume_token != resolved.resume_token
    finally:
        await watch.aclose()
        await watcher.close()
        await client.close()
        stop_process(server.process)
