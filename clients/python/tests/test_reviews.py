"""Reviews: editing a call's arguments, N-of-M approvals, batch decisions, racing grants."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

import aaa
from aaa import text, tool, tool_call

from helpers import WAIT_S, collect, next_item, of_type


def payment_setup(uid: str, approvals_required: int | None = None):
    """A gated wire tool, a model that calls it once and then repeats what it read, the tool
    messages the model read, and a log of the tool's real runs."""
    ran: list[tuple[int, str]] = []
    read: list[aaa.Message] = []

    @tool(name=f"wire_{uid}", requires_approval=True, approvals_required=approvals_required)
    def wire(amount: int, to: str) -> str:
        """Send money."""
        ran.append((amount, to))
        return f"sent ${amount} to {to}"

    def model(request: aaa.ModelRequest) -> aaa.Reply:
        last = request.messages[-1]
        if last.role == "user":
            return tool_call(wire, amount=250, to="ACME")
        read.append(last)
        if last.error is not None:
            return text(f"refused: {last.error.message}")
        return text(last.content)

    return wire, model, ran, read


def digest(canonical_json: str) -> str:
    """The server's arguments_sha256: hex SHA-256 of the canonical JSON text."""
    return hashlib.sha256(canonical_json.encode()).hexdigest()


async def pending(client: aaa.Client, run: aaa.Run) -> aaa.Approval:
    """The run's one pending approval, once it is requested."""
    await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
    [approval] = await client.approvals.list(run_id=run.id)
    return approval


def test_approvals_required_goes_into_definitions_and_tool_refs():
    wire, *_ = payment_setup("defs", approvals_required=2)
    assert wire.approvals_required == 2 and wire.definition().approvals_required == 2
    assert aaa.ToolRef("wire", requires_approval=True, approvals_required=3).to_proto().approvals_required == 3
    plain, *_ = payment_setup("plain")
    assert plain.definition().approvals_required == 0  # the server reads 0 as one


async def test_edit_then_grant_runs_the_edited_arguments(client, uid):
    wire, model, ran, read = payment_setup(uid)
    labels = {"test": uid}
    watch = client.approvals.watch(labels=labels)
    try:
        assert isinstance(await next_item(watch), aaa.SnapshotComplete)
        async with client.worker(tools=[wire], models={f"m-{uid}": model}):
            run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire], labels=labels)
            original = await pending(client, run)
            assert (original.approvals_required, original.votes, original.edited_from) == (1, [], "")
            assert await next_item(watch) == original

            # Refused edits change nothing: the same arguments, arguments that do not fit, a stale digest.
            with pytest.raises(aaa.InvalidField) as err:
                await run.edit(original.call_id, {"amount": 250, "to": "ACME"})
            assert err.value.field == "data_json.arguments"
            with pytest.raises(aaa.InvalidField) as err:
                await run.edit(original.call_id, {"amount": "lots", "to": "ACME"})
            assert err.value.field == "data_json.arguments"
            with pytest.raises(aaa.ArgumentsMismatch):
                await run.edit(original.call_id, {"amount": 200, "to": "ACME"}, arguments_sha256="0" * 64)

            edited = await run.edit(
                original.call_id,
                {"amount": 200, "to": "ACME"},
                reason="the limit is $200",
                arguments_sha256=original.arguments_sha256,
            )
            assert (edited.decision, edited.already_decided, edited.votes) == ("aaa.approval.edited", False, 0)
            assert edited.new_call_id not in ("", original.call_id)
            assert edited.new_arguments_sha256 == digest('{"amount":200,"to":"ACME"}')

            resolved = await next_item(watch)
            assert isinstance(resolved, aaa.ApprovalResolution)
            assert (resolved.call_id, resolved.outcome, resolved.replaced_by, resolved.reason) == (
                original.call_id,
                aaa.ApprovalOutcome.EDITED,
                edited.new_call_id,
                "the limit is $200",
            )
            # The new call waits for its own grant, bound to its own digest.
            [replacement] = await client.approvals.list(run_id=run.id)
            assert await next_item(watch) == replacement
            assert (replacement.call_id, replacement.edited_from) == (edited.new_call_id, original.call_id)
            assert replacement.arguments == {"amount": 200, "to": "ACME"}
            assert replacement.arguments_sha256 == edited.new_arguments_sha256
            assert ran == []
            with pytest.raises(aaa.ArgumentsMismatch):
                await run.approve(edited.new_call_id, arguments_sha256=original.arguments_sha256)

            granted = await run.approve(edited.new_call_id, arguments_sha256=edited.new_arguments_sha256)
            assert (granted.decision, granted.votes, granted.approvals_required) == ("aaa.approval.granted", 1, 1)
            outcome = await run.result(timeout=WAIT_S)
    finally:
        await watch.aclose()
    assert ran == [(200, "ACME")]
    # The model's own call is answered, with a note of what the reviewer changed and why.
    [message] = read
    assert message.call_id == original.call_id
    assert '{"amount":200,"to":"ACME"}' in message.content and "the limit is $200" in message.content
    assert message.content.endswith("sent $200 to ACME")
    assert outcome.value == {"text": message.content}
    again = await run.edit(original.call_id, {"amount": 100, "to": "ACME"})
    assert (again.already_decided, again.decision) == (True, "aaa.approval.edited")


async def test_edit_with_grant_runs_at_once(client, uid):
    wire, model, ran, read = payment_setup(uid)
    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire])
        original = await pending(client, run)
        edited = await run.edit(original.call_id, {"amount": 200, "to": "ACME"}, grant=True)
        assert (edited.decision, edited.votes, edited.approvals_required) == ("aaa.approval.edited", 1, 1)
        outcome = await run.result(timeout=WAIT_S)
    assert ran == [(200, "ACME")]
    assert outcome.value["text"].endswith("sent $200 to ACME")
    granted = of_type(await collect(run), "aaa.approval.granted")
    assert [e.data["call_id"] for e in granted] == [edited.new_call_id]


async def test_two_of_n_approvers(client, uid):
    wire, model, ran, read = payment_setup(uid, approvals_required=2)
    labels = {"test": uid}
    watch = client.approvals.watch(labels=labels)
    try:
        assert isinstance(await next_item(watch), aaa.SnapshotComplete)
        async with client.worker(tools=[wire], models={f"m-{uid}": model}):
            run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire], labels=labels)
            approval = await pending(client, run)
            assert (approval.approvals_required, approval.votes) == (2, [])
            assert await next_item(watch) == approval

            first = await run.approve(
                approval.call_id, arguments_sha256=approval.arguments_sha256, approver="alice", comment="looks right"
            )
            assert (first.decision, first.already_decided) == ("aaa.approval.voted", False)
            assert (first.votes, first.approvals_required) == (1, 2)
            voted = await next_item(watch)
            assert isinstance(voted, aaa.ApprovalVoted)
            assert (voted.call_id, voted.vote.approver) == (approval.call_id, "alice")
            assert voted.vote.comment == "looks right"
            assert (voted.votes, voted.approvals_required, voted.seq) == (1, 2, first.seq)
            [still] = await client.approvals.list(run_id=run.id)
            assert [(v.approver, v.comment) for v in still.votes] == [("alice", "looks right")]
            assert still.votes[0].time is not None
            assert ran == []

            with pytest.raises(aaa.AlreadyVoted) as err:
                await run.approve(approval.call_id, approver="alice")
            assert isinstance(err.value, aaa.FailedPrecondition) and err.value.reason == "ALREADY_VOTED"
            assert err.value.metadata == {"approver": "alice", "call_id": approval.call_id}

            second = await run.approve(approval.call_id, arguments_sha256=approval.arguments_sha256, approver="bob")
            assert (second.decision, second.votes, second.approvals_required) == ("aaa.approval.granted", 2, 2)
            resolved = await next_item(watch)
            assert isinstance(resolved, aaa.ApprovalResolution) and resolved.outcome == aaa.ApprovalOutcome.GRANTED
            outcome = await run.result(timeout=WAIT_S)
    finally:
        await watch.aclose()
    assert ran == [(250, "ACME")] and outcome.value == {"text": "sent $250 to ACME"}
    [granted] = of_type(await collect(run), "aaa.approval.granted")
    assert granted.data["approvers"] == ["alice", "bob"]


async def test_a_run_asks_for_more_approvers_and_one_denial_denies(client, uid):
    wire, model, ran, read = payment_setup(uid)
    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        ref = aaa.ToolRef(wire.name, approvals_required=3)
        run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[ref])
        approval = await pending(client, run)
        assert approval.approvals_required == 3
        assert (await run.approve(approval.call_id, approver="alice")).decision == "aaa.approval.voted"
        denied = await run.deny(
            approval.call_id, "not this week", arguments_sha256=approval.arguments_sha256, approver="bob"
        )
        assert (denied.decision, denied.already_decided) == ("aaa.approval.denied", False)
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.value == {"text": "refused: not this week"}
    assert ran == []


async def test_batch_decisions_are_bound_to_digests(client, uid):
    wire, model, ran, read = payment_setup(uid)
    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        runs = [
            await client.start_run(f"Pay ACME $250 ({i})", model=f"m-{uid}", tools=[wire], labels={"test": uid})
            for i in range(3)
        ]
        one, two, three = [await pending(client, run) for run in runs]
        wrong_two = (two.run_id, two.call_id, "0" * 64)

        # all_or_nothing: one item that cannot be decided leaves every item undecided.
        results = await client.decide_approvals([one, wrong_two], "grant", all_or_nothing=True)
        assert [(r.run_id, r.call_id) for r in results] == [(one.run_id, one.call_id), (two.run_id, two.call_id)]
        assert [r.status for r in results] == [aaa.DecisionStatus.NOT_APPLIED, aaa.DecisionStatus.MISMATCH]
        assert [r.seq for r in results] == [0, 0]
        assert len(await client.approvals.list(labels={"test": uid})) == 3

        batch = ([one, wrong_two, three],)
        options = {"comment": "batch ok", "approver": "carol", "request_id": f"batch-{uid}"}
        results = await client.decide_approvals(*batch, **options)
        # A retry with the request id (its answer lost) gets the first answer again.
        again = await client.decide_approvals(*batch, **options)
        assert [(r.status, r.seq) for r in again] == [(r.status, r.seq) for r in results]
        assert [r.status for r in results] == [
            aaa.DecisionStatus.DECIDED,
            aaa.DecisionStatus.MISMATCH,
            aaa.DecisionStatus.DECIDED,
        ]
        assert [r.ok for r in results] == [True, False, True]
        assert results[0].decision == results[2].decision == "aaa.approval.granted"
        assert results[0].seq > one.seq
        assert results[1].error_reason == "ARGUMENTS_MISMATCH" and results[1].error_message

        results = await client.decide_approvals(
            [(two.run_id, two.call_id, two.arguments_sha256), one, (two.run_id, "no-such-call", "0" * 64)],
            "deny",
            reason="not in this batch",
        )
        assert [(r.status, r.decision) for r in results] == [
            (aaa.DecisionStatus.DECIDED, "aaa.approval.denied"),
            (aaa.DecisionStatus.ALREADY_DECIDED, "aaa.approval.granted"),
            (aaa.DecisionStatus.NOT_FOUND, ""),
        ]
        outcomes = [await run.result(timeout=WAIT_S) for run in runs]
    texts = [o.value["text"] for o in outcomes]
    assert texts == ["sent $250 to ACME", "refused: not in this batch", "sent $250 to ACME"]
    assert ran == [(250, "ACME"), (250, "ACME")]

    # Calls are named one by one, never by a filter; a malformed batch is refused whole.
    with pytest.raises(TypeError):
        await client.decide_approvals([{"labels": {"test": uid}}])
    with pytest.raises(ValueError):
        await client.decide_approvals([one], "approve")
    with pytest.raises(aaa.InvalidField):
        await client.decide_approvals([])
    with pytest.raises(aaa.InvalidField):
        await client.decide_approvals([one, one])


async def test_two_grants_at_once_leave_one_granted(server, client, uid):
    wire, model, ran, read = payment_setup(uid)
    other = await aaa.connect(server.address)
    try:
        async with client.worker(tools=[wire], models={f"m-{uid}": model}):
            run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire])
            approval = await pending(client, run)
            answers = await asyncio.gather(
                run.approve(approval.call_id, arguments_sha256=approval.arguments_sha256, approver="alice"),
                other.run(run.id).approve(approval.call_id, arguments_sha256=approval.arguments_sha256, approver="bob"),
            )
            outcome = await run.result(timeout=WAIT_S)
    finally:
        await other.close()
    assert sorted(a.already_decided for a in answers) == [False, True]
    assert [a.decision for a in answers] == ["aaa.approval.granted"] * 2
    assert len(of_type(await collect(run), "aaa.approval.granted")) == 1
    assert ran == [(250, "ACME")] and outcome.ok
