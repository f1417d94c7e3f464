"""Consumer groups: a subscriber reacts to approval requests (the seed's notify), a nacked delivery comes again."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import aaa
from aaa import text, tool, tool_call
from aaa.pb import subscription_pb2

from conftest import start_server, stop_process
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


class EndsFirstStream:
    """A SubscriptionService stub whose first Subscribe stream ends cleanly after its first
    delivery, as when the server ends it; later streams are the real ones."""

    def __init__(self, real) -> None:
        self.real = real
        self.streams = 0

    def Subscribe(self, requests):
        self.streams += 1
        call = self.real.Subscribe(requests)
        return call if self.streams > 1 else _EndsAfterADelivery(call)


class _EndsAfterADelivery:
    def __init__(self, call) -> None:
        self.call = call

    def cancel(self) -> bool:
        return self.call.cancel()

    async def __aiter__(self):
        async for response in self.call:
            yield response
            if response.WhichOneof("item") == "delivery":
                return


async def test_a_subscriber_joins_again_after_the_server_ends_its_stream(tmp_path, uid):
    server = start_server(tmp_path / "data", tmp_path / "server.log")
    # retry_s=0: calls do not retry, but a subscription joins again all the same.
    subscriber = await aaa.connect(server.address, retry_s=0)
    subscriber.stubs.subscription = EndsFirstStream(subscriber.stubs.subscription)
    client = await aaa.connect(server.address)
    labels = {"test": uid}
    started: asyncio.Queue[str] = asyncio.Queue()

    async def next_run_started(run: aaa.Run) -> None:
        """Waits for the delivery of ``run``'s aaa.run.started (skipping redeliveries of earlier ones)."""
        while await asyncio.wait_for(started.get(), WAIT_S) != run.id:
            pass

    try:
        async with subscribed(
            subscriber,
            "aaa.run.started",
            lambda d: started.put_nowait(d.event.run_id),
            group=f"restart-{uid}",
            labels=labels,
            start_from="beginning",
        ) as subscription:
            before = await client.start_run("one", model=[text("1")], labels=labels)
            await next_run_started(before)  # and the first stream ends
            after_end = await client.start_run("two", model=[text("2")], labels=labels)
            await next_run_started(after_end)
            assert subscriber.stubs.subscription.streams >= 2

            stop_process(server.process)  # SIGTERM: the stream ends with UNAVAILABLE (SHUTTING_DOWN)
            server = start_server(tmp_path / "data", tmp_path / "server.log", listen=server.address)
            after_restart = await client.start_run("three", model=[text("3")], labels=labels)
            await next_run_started(after_restart)
            assert not subscription.done()
    finally:
        await subscriber.close()
        await client.close()
        stop_process(server.process)
