"""The worker: retries after a killed worker, fenced attempts, results sent again after a lost reply,
heartbeats, failures, concurrency, stop."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

import aaa
from aaa import echo, text, tool, tool_call
from aaa.pb import worker_pb2

from helpers import WAIT_S, collect, of_type

DOOMED = Path(__file__).with_name("doomed_worker.py")


async def read_line(process: subprocess.Popen) -> str:
    """The next stdout line of a subprocess, waiting at most WAIT_S."""
    return await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), WAIT_S)


async def test_a_second_worker_takes_the_retry_of_a_killed_one(server, client, uid):
    name = f"flaky_{uid}"
    env = {**os.environ, "AAA_SERVER": server.address}
    doomed = subprocess.Popen([sys.executable, str(DOOMED), name], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert await read_line(doomed) == "ready\n"
        run = await client.start_run("double 21", model=[tool_call(name, x=21), echo()], tools=[name])
        started = await asyncio.wait_for(run.wait_for("aaa.tool.started"), WAIT_S)
        assert (started.data["attempt"], started.data["worker"]) == (1, "doomed")
        assert await read_line(doomed) == "started 1\n"
        doomed.kill()  # mid-attempt: no result, no more heartbeats
        doomed.wait()

        @tool(name=name, retries=1, retry_backoff_s=0.1, heartbeat_timeout_s=1.0)
        def flaky(x: int) -> int:
            """Doubles x."""
            return 2 * x

        async with client.worker(tools=[flaky], identity="rescuer"):
            outcome = await run.result(timeout=WAIT_S)
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait()
    assert outcome.value == {"text": "42"}
    events = await collect(run)
    starts = [(e.data["attempt"], e.data["worker"]) for e in of_type(events, "aaa.tool.started")]
    assert starts == [(1, "doomed"), (2, "rescuer")]
    assert [(e.data["attempt"], e.data["output"]) for e in of_type(events, "aaa.tool.completed")] == [(2, 42)]


async def poll_task(client: aaa.Client, name: str) -> worker_pb2.Task:
    """PollTask (raw stub) until a task of tool ``name`` comes."""
    request = worker_pb2.PollTaskRequest(identity="raw", tools=[name], wait_s=5)
    while True:
        response = await asyncio.wait_for(client.stubs.worker.PollTask(request), WAIT_S)
        if response.HasField("task"):
            return response.task


async def test_a_superseded_attempt_is_refused(client, uid):
    name = f"lease_{uid}"

    @tool(name=name, retries=1, retry_backoff_s=0.1, heartbeat_timeout_s=0.5)
    def lease(x: int) -> int:
        """Never called: the test answers the tasks itself."""
        return x

    await client.worker(tools=[lease]).register()
    run = await client.start_run("go", model=[tool_call(name, x=1), echo()], tools=[name])
    first = await poll_task(client, name)
    assert first.attempt == 1 and first.tool.name == name
    second = await poll_task(client, name)  # no heartbeat: the lease ran out, this is the retry
    assert (second.attempt, second.call_id) == (2, first.call_id)

    stub = client.stubs.worker
    with pytest.raises(aaa.StaleAttempt) as refused:
        await client._call(stub.CompleteTask, worker_pb2.CompleteTaskRequest(token=first.token, output_json="1"))
    assert isinstance(refused.value, aaa.SupersededAttempt) and isinstance(refused.value, aaa.FailedPrecondition)
    assert refused.value.reason == "STALE_ATTEMPT"
    with pytest.raises(aaa.StaleAttempt):
        await client._call(stub.HeartbeatTask, worker_pb2.HeartbeatTaskRequest(token=first.token))
    await client._call(stub.CompleteTask, worker_pb2.CompleteTaskRequest(token=second.token, output_json="1"))
    outcome = await run.result(timeout=WAIT_S)
    assert outcome.value == {"text": "1"}


async def test_heartbeats_keep_a_long_attempt_alive(client, uid):
    @tool(name=f"long_{uid}", retries=0, heartbeat_timeout_s=0.5)
    async def long_job(x: int) -> int:
        """Works for four heartbeat timeouts."""
        await asyncio.sleep(2.0)  # the work itself, not a wait for state
        return x

    async with client.worker(tools=[long_job]):
        run = await client.start_run("go", model=[tool_call(long_job, x=5), echo()], tools=[long_job])
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.value == {"text": "5"}
    assert [e.data["attempt"] for e in of_type(await collect(run), "aaa.tool.started")] == [1]


async def test_tool_exceptions_become_failures_the_model_reads(client, uid):
    @tool(name=f"boom_{uid}", retries=0)
    def boom(x: int) -> int:
        """Always fails."""
        raise ValueError(f"bad x: {x}")

    @tool(name=f"second_try_{uid}", retries=2, retry_backoff_s=0.1)
    async def second_try(x: int) -> int:
        """Fails once, then works."""
        if aaa.current_task().attempt == 1:
            raise RuntimeError("transient")
        return x

    @tool(name=f"fatal_{uid}", retries=3, retry_backoff_s=0.1)
    def fatal(x: int) -> int:
        """Fails for good."""
        raise aaa.NonRetryable("no way")

    async def model(request: aaa.ModelRequest) -> aaa.Reply:
        last = request.messages[-1]
        if last.role == "user":
            return tool_call(boom, x=3) + tool_call(second_try, x=4) + tool_call(fatal, x=5)
        tool_messages = [m for m in request.messages if m.role == "tool"]
        return text(" | ".join(f"{m.name}={m.error.type if m.error else m.content}" for m in tool_messages))

    async with client.worker(tools=[boom, second_try, fatal], models={f"m-{uid}": model}):
        run = await client.start_run("go", model=f"m-{uid}", tools=[boom, second_try, fatal])
        outcome = await run.result(timeout=WAIT_S)
    parts = sorted(outcome.value["text"].split(" | "))
    assert parts == sorted([f"{boom.name}=ValueError", f"{second_try.name}=4", f"{fatal.name}=NonRetryable"])
    events = await collect(run)
    errors = {e.data["call_id"]: e.data["error"] for e in of_type(events, "aaa.tool.failed")}
    assert sorted(errors.values(), key=lambda e: e["type"]) == [
        {"type": "NonRetryable", "message": "no way"},
        {"type": "ValueError", "message": "bad x: 3"},
    ]
    attempts = {}
    for e in of_type(events, "aaa.tool.started"):
        attempts[e.data["call_id"]] = e.data["attempt"]
    assert sorted(attempts.values()) == [1, 1, 2]


async def test_concurrency_limit(client, uid):
    running, peak = 0, 0

    @tool(name=f"busy_{uid}")
    async def busy(i: int) -> int:
        """Takes a moment."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.2)  # the work itself
        running -= 1
        return i

    calls = tool_call(busy, i=1) + tool_call(busy, i=2) + tool_call(busy, i=3)
    async with client.worker(tools=[busy], concurrency=1):
        run = await client.start_run("go", model=[calls, text("done")], tools=[busy])
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.value == {"text": "done"}
    assert peak == 1
    assert sorted(e.data["output"] for e in of_type(await collect(run), "aaa.tool.completed")) == [1, 2, 3]


async def test_graceful_stop_lets_the_running_task_finish(client, uid):
    entered, release = asyncio.Event(), asyncio.Event()

    @tool(name=f"held_{uid}")
    async def held(x: int) -> int:
        """Waits for the test to let it go."""
        entered.set()
        await release.wait()
        return x

    worker = client.worker(tools=[held])
    await worker.start()
    run = await client.start_run("go", model=[tool_call(held, x=7), echo()], tools=[held])
    await asyncio.wait_for(entered.wait(), WAIT_S)
    stopping = asyncio.create_task(worker.stop())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, WAIT_S)
    outcome = await run.result(timeout=WAIT_S)
    assert outcome.value == {"text": "7"}


class LosesFirstReplies:
    """A WorkerService stub that sends the first CompleteTask and the first FailTask to the
    server, then fails them as if the reply were lost (``lost`` gives the code of each);
    it keeps the server's answers."""

    def __init__(self, real, lost: dict[str, grpc.StatusCode]) -> None:
        self.real = real
        self.lost = lost
        self.answers: dict[str, list] = {name: [] for name in lost}

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def CompleteTask(self, request, **kwargs):
        return self._send("CompleteTask", request, **kwargs)

    def FailTask(self, request, **kwargs):
        return self._send("FailTask", request, **kwargs)

    async def _send(self, name: str, request, **kwargs):
        response = await getattr(self.real, name)(request, **kwargs)
        self.answers[name].append(response)
        if len(self.answers[name]) == 1:
            raise grpc.aio.AioRpcError(self.lost[name], grpc.aio.Metadata(), grpc.aio.Metadata(), "reply lost")
        return response


async def test_a_result_whose_reply_was_lost_is_sent_again(server, client, uid, caplog):
    @tool(name=f"works_{uid}")
    def works(x: int) -> int:
        """Returns x."""
        return x

    @tool(name=f"refuses_{uid}")
    def refuses(x: int) -> int:
        """Fails for good."""
        raise aaa.NonRetryable(f"not {x}")

    caplog.set_level(logging.DEBUG, logger="aaa.worker")
    worker_client = await aaa.connect(server.address)
    stub = LosesFirstReplies(
        worker_client.stubs.worker,
        {"CompleteTask": grpc.StatusCode.DEADLINE_EXCEEDED, "FailTask": grpc.StatusCode.UNAVAILABLE},
    )
    worker_client.stubs.worker = stub
    try:
        async with worker_client.worker(tools=[works, refuses]):
            calls = tool_call(works, x=1) + tool_call(refuses, x=2)
            run = await client.start_run("go", model=[calls, text("done")], tools=[works, refuses])
            outcome = await run.result(timeout=WAIT_S)
    finally:
        await worker_client.close()
    assert outcome.value == {"text": "done"}
    # Sent again with the same token and result: the server had it, and says so.
    assert [a.already_recorded for a in stub.answers["CompleteTask"]] == [False, True]
    assert [a.already_recorded for a in stub.answers["FailTask"]] == [False, True]
    events = await collect(run)
    assert [(e.data["attempt"], e.data["output"]) for e in of_type(events, "aaa.tool.completed")] == [(1, 1)]
    assert [e.data["error"]["message"] for e in of_type(events, "aaa.tool.failed")] == ["not 2"]
    assert sum("recorded already" in r.getMessage() for r in caplog.records) == 2
