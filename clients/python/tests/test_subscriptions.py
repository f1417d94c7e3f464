"""Consumer groups: a subscriber reacts to approval requests (the seed's notify), a nacked delivery comes again."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import aaa
from aaa import text, tool, tool_call
from aaa.pb import subscription_pb2

from helpers import WAIT_S


def gated_setup(uid: str):
    """A gated tool and a model that calls it once, then echoes its result."""

    @tool(name=f"wire_{uid}", requires_approval=True)
    def wire(amount: int, to: str) -> str:
        """Send money."""
        return f"sent ${amount} to {to}"

    def model(request: aaa.ModelRequest) -> aaa.Reply:
        last = request.messages[-1]
        if last.role == "user":
            return tool_call(wire, amount=250, to="ACME")
        return text(last.content)

    return wire, model


@contextlib.asynccontextmanager
async def subscribed(client: aaa.Client, *args, **kwargs):
    """Runs client.subscribe in a task for the block's duration."""
    task = asyncio.create_task(client.subscribe(*args, **kwargs))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_subscriber_approves_each_request_once(server, client, uid):
    wire, model = gated_setup(uid)
    labels = {"test": uid}
    seen: list[tuple[str, int, int]] = []

    async def approve(delivery: aaa.Delivery) -> None:
        event = delivery.event
        seen.append((event.run_id, event.seq, delivery.attempt))
        await client.run(event.run_id).approve(event.data["call_id"])

    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        async with subscribed(
            client, "aaa.approval.requested", approve, group=f"notify-{uid}", labels=labels, start_from="beginning"
        ):
            runs = [
                await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire], labels=labels) for _ in range(3)
            ]
            outcomes = [await run.result(timeout=WAIT_S) for run in runs]
    assert [o.value for o in outcomes] == [{"text": "sent $250 to ACME"}] * 3
    assert sorted(r for r, _, _ in seen) == sorted(run.id for run in runs)
    assert all(attempt == 1 for _, _, attempt in seen)


async def test_a_failing_handler_gets_the_event_again(server, client, uid):
    wire, model = gated_setup(uid)
    labels = {"test": uid}
    attempts: list[int] = []
    done = asyncio.Event()

    def flaky(delivery: aaa.Delivery) -> None:
        attempts.append(delivery.attempt)
        if delivery.attempt == 1:
            raise RuntimeError("mail server down")
        done.set()

    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        async with subscribed(
            client, "aaa.approval.requested", flaky, group=f"flaky-{uid}", labels=labels, start_from="beginning"
        ):
            run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire], labels=labels)
            await asyncio.wait_for(done.wait(), WAIT_S)
            await run.cancel("done")
    assert attempts == [1, 2]


async def test_bad_subscriptions_are_refused(client, uid):
    with pytest.raises(aaa.InvalidField) as bad:
        await client.subscribe("app.*.x", lambda d: None, group=f"g-{uid}")
    assert bad.value.metadata["field"] == "open.event_types[0]"
    # A first member creates the group (raw stub: its first answer says it joined).
    opening = subscription_pb2.SubscriptionOpen(group=f"g-{uid}", event_types=["app.one"])
    first = client.stubs.subscription.Subscribe(iter([subscription_pb2.SubscribeRequest(open=opening)]))
    try:
        assert (await first.read()).subscribed.created
        with pytest.raises(aaa.GroupMismatch) as mismatch:
            await client.subscribe("app.two", lambda d: None, group=f"g-{uid}")
        assert mismatch.value.metadata["field"] == "open.event_types"
    finally:
        first.cancel()
