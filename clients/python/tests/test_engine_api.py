"""The in-process-style names (aaa.runtime, aaa.tools, aaa.llm, aaa.algos) against the real server:
the reference program, a denial, one delivery per group across two engines, a deadline."""

from __future__ import annotations

import asyncio

import pytest

import aaa
from aaa.algos import ToolLoop
from aaa.llm import FakeLLMClient, LLMHandler, fake
from aaa.runtime import Budget, Engine
from aaa.tools import ToolHandler, ToolRegistry, tool

from helpers import WAIT_S, closed_port, same
from test_examples import run_example


def payment(uid: str) -> tuple[aaa.Tool, list[dict]]:
    """A gated tool of this test, and the calls it ran."""
    ran: list[dict] = []

    @tool(name=f"wire_money_{uid}", requires_approval=True)
    def wire_money(amount: int, to: str) -> str:
        """Send money."""
        ran.append({"amount": amount, "to": to})
        return f"sent ${amount} to {to}"

    return wire_money, ran


def paying_llm(wire_money: aaa.Tool, uid: str) -> FakeLLMClient:
    """A fake model that calls the tool on the user's message and echoes anything else."""

    def llm(request: aaa.ModelRequest) -> aaa.Reply:
        last = request.messages[-1]
        if last.role == "user":
            return fake.tool_call(wire_money.name, amount=250, to="ACME")
        return fake.text(last.content)

    return FakeLLMClient(llm, model=f"fake-{uid}")


def test_the_reference_program_prints_exactly(server):
    done = run_example("engine_approval.py", server.address)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "waiting for approval of: wire_money {'amount': 250, 'to': 'ACME'}\n"
        "sent $250 to ACME\n"
    )


async def test_a_denial_reaches_the_fake_model(server, uid):
    wire_money, ran = payment(uid)

    async def llm(request: aaa.ModelRequest) -> aaa.Reply:  # an async model this time
        last = request.messages[-1]
        if last.role == "user":
            return fake.tool_call(wire_money.name, amount=250, to="ACME")
        return fake.text(f"I did not pay ACME ({last.role} said: {last.content})")

    registry = ToolRegistry([wire_money])
    async with Engine(server.address) as engine:
        LLMHandler(FakeLLMClient(llm), model=f"fake-{uid}").attach(engine)
        ToolHandler(registry).attach(engine)
        run = await engine.start(ToolLoop(registry), {"task": "Pay ACME $250"})
        request = await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
        assert request.run_id == run.run_id and request.data["name"] == wire_money.name
        assert same(request.data["arguments"], {"amount": 250, "to": "ACME"})  # 250 stays an int
        await run.signal("aaa.approval.denied", {"call_id": request.data["call_id"], "reason": "over the daily limit"})
        outcome = await run.result(timeout=WAIT_S)
        events = await engine.store.read(run.run_id)
    assert outcome.ok
    assert outcome.value == {"text": "I did not pay ACME (tool said: ApprovalDenied: over the daily limit)"}
    assert ran == []
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert {e.run_id for e in events} == {run.run_id}
    denied = [e for e in events if e.type == "aaa.approval.denied"]
    assert len(denied) == 1 and denied[0].data["reason"] == "over the daily limit"
    assert events[-1].type == "aaa.run.completed"


async def test_two_engines_in_one_group_get_each_request_once(server, uid):
    wire_money, _ = payment(uid)
    client = paying_llm(wire_money, uid)
    registry = ToolRegistry([wire_money])
    labels = {"test": uid}
    group = f"acme.notify.{uid}"
    runs_count = 6
    seen: list[tuple[str, str, int]] = []
    all_seen = asyncio.Event()

    def record(engine_name: str, event: aaa.Event) -> None:
        seen.append((engine_name, event.run_id, event.seq))
        if len(seen) >= runs_count:
            all_seen.set()

    def notify_a(event: aaa.Event) -> None:  # one sync handler, one async: both are run
        record("a", event)

    async def notify_b(event: aaa.Event) -> None:
        record("b", event)

    # start_from="beginning" with the test's labels: every request of this test reaches the
    # group, whichever engine joins first, with no need to know when the joins happen.
    async with Engine(server.address) as a, Engine(server.address) as b:
        for engine, notify in ((a, notify_a), (b, notify_b)):
            engine.subscribe("aaa.approval.requested", notify, group=group, labels=labels, start_from="beginning")
        LLMHandler(client).attach(a)
        ToolHandler(registry).attach(a)
        runs = [
            await a.start(ToolLoop(registry), {"task": "Pay ACME $250", "labels": labels}) for _ in range(runs_count)
        ]
        await asyncio.wait_for(all_seen.wait(), WAIT_S)
        for run in runs:
            await run.cancel("test done")
    assert {name for name, _, _ in seen} <= {"a", "b"}
    assert sorted(run_id for _, run_id, _ in seen) == sorted(run.run_id for run in runs)
    assert len({(run_id, seq) for _, run_id, seq in seen}) == runs_count


async def test_a_deadline_ends_a_waiting_run(server, uid):
    wire_money, ran = payment(uid)
    registry = ToolRegistry([wire_money])
    async with Engine(server.address) as engine:
        LLMHandler(paying_llm(wire_money, uid)).attach(engine)
        ToolHandler(registry).attach(engine)
        run = await engine.start(ToolLoop(registry), {"task": "Pay ACME $250", "budget": Budget(deadline_s=1)})
        await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.status == aaa.RunStatus.FAILED and outcome.value is None
    assert outcome.error is not None and outcome.error.type == "DeadlineExceeded"
    assert ran == []


async def test_engine_takes_its_address_from_the_environment(server, uid, monkeypatch):
    monkeypatch.setenv("AAA_SERVER", server.address)
    async with Engine() as engine:
        assert engine.client.address == server.address
        run = await engine.start(ToolLoop(model=f"none-{uid}"), {"task": "hello"})
        assert (await engine.store.read(run.run_id))[0].type == "aaa.run.started"
        await run.cancel("test done")


async def test_no_server_is_a_clear_error_naming_the_address():
    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(aaa.Unavailable) as err:
        async with Engine(address, timeout=0.5):
            pass
    assert address in str(err.value)


async def test_leaving_the_engine_stops_its_handlers(server, uid):
    wire_money, _ = payment(uid)
    client = paying_llm(wire_money, uid)
    async with Engine(server.address) as engine:
        workers = [LLMHandler(client).attach(engine), ToolHandler([wire_money]).attach(engine)]
        await engine.ready()
        assert engine.models == [client.model]
        assert all(w._poller is not None for w in workers)  # polling
    assert all(w._poller is None for w in workers)  # stopped
    with pytest.raises(RuntimeError, match="not open"):
        engine.store


async def test_failures_in_the_background_are_not_lost(server, uid):
    # A subscription the server refuses ends with its error when the engine closes.
    with pytest.raises(aaa.InvalidField):
        async with Engine(server.address) as engine:
            task = engine.subscribe("app.*.x", lambda event: None, group=f"bad-{uid}")
            await asyncio.wait({task}, timeout=WAIT_S)
    # A tool the server refuses to register fails the next start.
    async with Engine(server.address) as engine:
        ToolHandler([tool(lambda: None, name="not a name")]).attach(engine)
        with pytest.raises(aaa.InvalidField):
            await engine.start(ToolLoop(model=f"none-{uid}"), {"task": "hello"})


async def test_bad_input_is_named(server, uid):
    wire_money, _ = payment(uid)
    client = paying_llm(wire_money, uid)
    with pytest.raises(ValueError, match="already"):
        ToolRegistry([wire_money, wire_money])
    with pytest.raises(TypeError, match="list of tools"):
        ToolRegistry(wire_money)
    with pytest.raises(TypeError, match="complete"):
        LLMHandler(42)
    with pytest.raises(RuntimeError, match="not open"):
        ToolHandler([wire_money]).attach(Engine(server.address))
    loop = ToolLoop([wire_money])
    async with Engine(server.address) as engine:
        with pytest.raises(ValueError, match="attach an LLMHandler"):
            await engine.start(loop, {"task": "hello"})
        LLMHandler(client).attach(engine)
        LLMHandler(client, model=f"other-{uid}").attach(engine)
        with pytest.raises(ValueError, match="several models"):
            await engine.start(loop, {"task": "hello"})
        loop = ToolLoop([wire_money], model=client.model)
        with pytest.raises(TypeError, match="ToolLoop"):
            await engine.start("tool loop", {"task": "hello"})
        with pytest.raises(ValueError, match=r"input\['task'\]"):
            await engine.start(loop, {"task": ""})
        with pytest.raises(ValueError, match="unknown input keys \\['prompt'\\]"):
            await engine.start(loop, {"task": "hello", "prompt": "hello"})
        with pytest.raises(TypeError, match="Budget"):
            await engine.start(loop, {"task": "hello", "budget": {"deadline_s": 1}})
        with pytest.raises(ValueError, match="group"):
            engine.subscribe("aaa.approval.requested", print, group="")
        with pytest.raises(ValueError, match="run id"):
            await engine.store.read("")
        with pytest.raises(aaa.RunNotFound):
            await engine.store.read(f"no-such-run-{uid}")
