"""Event streams: resuming from a cursor, filtering, and surviving a dropped connection."""

from __future__ import annotations

import asyncio
import contextlib

import aaa
from aaa import echo, tool, tool_call

from helpers import WAIT_S, Proxy, collect, next_item


def double_tool(uid: str, gated: bool = False) -> aaa.Tool:
    """An ungated (or gated) tool that doubles a number."""

    @tool(name=f"double_{uid}", requires_approval=gated)
    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    return double


async def test_events_resume_from_a_cursor(client, uid):
    double = double_tool(uid)
    async with client.worker(tools=[double]):
        run = await client.start_run("double 21", model=[tool_call(double, x=21), echo()], tools=[double])
        events = await collect(run)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type == "aaa.run.started" and events[-1].type == "aaa.run.completed"
    assert events[-1].data == {"value": {"text": "42"}}
    assert all(e.run_id == run.id for e in events)
    assert [e.position for e in events] == sorted(e.position for e in events)

    key = lambda e: (e.seq, e.id, e.type, e.data_json)  # noqa: E731
    assert [key(e) for e in await collect(run, after_seq=3)] == [key(e) for e in events[3:]]
    assert [key(e) for e in await collect(run, follow=False)] == [key(e) for e in events]
    assert await collect(run, after_seq=len(events)) == []
    tool_events = await collect(run, type_prefix="aaa.tool.")
    assert [e.type for e in tool_events] == [e.type for e in events if e.type.startswith("aaa.tool.")]
    started = next(e for e in tool_events if e.type == "aaa.tool.started")
    assert started.data["attempt"] == 1 and started.actor.kind in ("engine", "worker")


async def test_events_resume_mid_run_from_the_last_seq(client, uid):
    double = double_tool(uid, gated=True)
    async with client.worker(tools=[double]):
        run = await client.start_run("double 21", model=[tool_call(double, x=21), echo()], tools=[double])
        seen = []
        async with contextlib.aclosing(run.events()) as stream:
            async for event in stream:
                seen.append(event)
                if event.type == "aaa.approval.requested":
                    break
        await run.approve(seen[-1].data["call_id"])
        rest = await collect(run, after_seq=seen[-1].seq)
    seqs = [e.seq for e in seen + rest]
    assert seqs == list(range(1, len(seqs) + 1))
    assert rest[-1].type == "aaa.run.completed"


async def test_events_survive_a_dropped_connection(server, client, uid):
    double = double_tool(uid, gated=True)
    proxy = await Proxy(server.address).start()
    follower = await aaa.connect(proxy.address)
    try:
        async with client.worker(tools=[double]):
            run = await client.start_run("double 21", model=[tool_call(double, x=21), echo()], tools=[double])
            seen = []
            async with contextlib.aclosing(follower.run(run.id).events()) as stream:
                while not seen or seen[-1].type != "aaa.approval.requested":
                    seen.append(await next_item(stream))
                assert proxy.drop() > 0  # the stream is cut while it waits for live events
                await run.approve(seen[-1].data["call_id"])
                seen.append(await next_item(stream))
                assert proxy.drop() > 0  # and cut again after the reconnect
                async for event in stream:
                    seen.append(event)
        seqs = [e.seq for e in seen]
        assert seqs == list(range(1, len(seqs) + 1)), seqs
        assert seen[-1].type == "aaa.run.completed"
        assert [e.seq for e in await collect(run)] == seqs

        outcome = await asyncio.wait_for(follower.run(run.id).result(), WAIT_S)
        assert outcome.value == {"text": "42"}
    finally:
        await follower.close()
        await proxy.close()
