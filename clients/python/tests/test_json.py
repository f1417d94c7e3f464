"""Integers and nested JSON round-trip exactly: model -> approval -> tool -> output -> model -> result."""

from __future__ import annotations

import asyncio
import json

import aaa
from aaa import echo, text, tool, tool_call

from helpers import WAIT_S, collect, of_type, same

PAYLOAD = {
    "amount": 250,
    "big": 2**63 + 1,
    "huge": -(2**70) - 3,
    "price": 1.5,
    "whole_float": 2.0,
    "nested": [1, [2, {"x": 2**64, "y": [None, True, False, "s"]}], {"z": {"w": 9007199254740993}}],
    "text": "caf\u00e9 \u2603 \"quoted\"",
}


def echo_tool(uid: str, received: list):
    """A gated sync tool that returns its argument, checking it runs inside a task."""

    @tool(name=f"echo_{uid}", requires_approval=True)
    def echo_value(value: dict) -> dict:
        """Returns value."""
        received.append((value, aaa.current_task().call_id))
        return value

    return echo_value


async def check_round_trip(run: aaa.Run, client: aaa.Client, received: list) -> None:
    """Approve the one call, then check every copy of the payload along the way."""
    request = await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
    assert same(request.data["arguments"], {"value": PAYLOAD})
    [pending] = await client.approvals.list(run_id=run.id)
    assert same(pending.arguments, {"value": PAYLOAD})
    canonical = json.dumps({"value": PAYLOAD}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert pending.arguments_json == canonical
    await run.approve(pending.call_id, arguments_sha256=pending.arguments_sha256)
    outcome = await run.result(timeout=WAIT_S)

    assert [call_id for _, call_id in received] == [pending.call_id]
    assert same(received[0][0], PAYLOAD)
    assert type(received[0][0]["amount"]) is int and received[0][0]["big"] == 9223372036854775809
    events = await collect(run)
    [requested] = of_type(events, "aaa.tool.requested")
    assert same(requested.data["arguments"], {"value": PAYLOAD})
    [completed] = of_type(events, "aaa.tool.completed")
    assert same(completed.data["output"], PAYLOAD)
    assert same(json.loads(outcome.value["text"]), PAYLOAD)


async def test_exact_json_with_a_worker_model(client, uid):
    received: list = []
    echo_value = echo_tool(uid, received)
    seen_by_model: list = []

    def model(request: aaa.ModelRequest) -> aaa.Reply:
        last = request.messages[-1]
        if last.role == "user":
            return tool_call(echo_value, value=PAYLOAD)
        seen_by_model.append(request.messages[-2].tool_calls[0].arguments)
        return text(last.content)

    async with client.worker(tools=[echo_value], models={f"m-{uid}": model}):
        run = await client.start_run("echo", model=f"m-{uid}", tools=[echo_value])
        await check_round_trip(run, client, received)
    assert same(seen_by_model, [{"value": PAYLOAD}])


async def test_exact_json_with_the_scripted_model(client, uid):
    received: list = []
    echo_value = echo_tool(uid, received)
    async with client.worker(tools=[echo_value]):
        run = await client.start_run("echo", model=[tool_call(echo_value, value=PAYLOAD), echo()], tools=[echo_value])
        await check_round_trip(run, client, received)


async def test_signal_data_is_exact(client, uid):
    received: list = []
    echo_value = echo_tool(uid, received)
    async with client.worker(tools=[echo_value]):
        run = await client.start_run("wait", model=[tool_call(echo_value, value={}), echo()], tools=[echo_value])
        await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
        sent = await run.signal("app.note", {"payload": PAYLOAD})
        assert sent.seq > 0 and not sent.already_decided
        note = await asyncio.wait_for(run.wait_for("app.note", after_seq=sent.seq - 1), WAIT_S)
        assert note.seq == sent.seq and note.actor.kind == "client"
        assert same(note.data, {"payload": PAYLOAD})
        await run.cancel("done")
    assert received == []
