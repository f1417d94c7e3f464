"""OpenTelemetry: StartRun sends the caller's traceparent, the worker's span is a child of the server's span
of the attempt (named by Task.traceparent), and without OpenTelemetry nothing changes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import aaa
from aaa import _otel, echo, tool, tool_call

from helpers import WAIT_S

# A process has one global tracer provider, set once: this module's, for the whole session.
_exporter = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_exporter))


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(_provider)
    _exporter.clear()
    return _exporter


def parse(traceparent: str) -> tuple[int, int]:
    """(trace id, span id) of a ``00-TRACE-SPAN-FLAGS`` value."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    return int(trace_id, 16), int(span_id, 16)


async def test_the_worker_span_is_a_child_of_the_servers_span_in_the_callers_trace(client, uid, exporter):
    seen: list[tuple[aaa.TaskInfo, trace.SpanContext]] = []

    @tool(name=f"wire_money_{uid}")
    def wire_money(amount: int, to: str) -> str:
        """Send money."""
        with trace.get_tracer("test").start_as_current_span("bank.transfer"):
            seen.append((aaa.current_task(), trace.get_current_span().get_span_context()))
        return f"sent ${amount} to {to}"

    async with client.worker(tools=[wire_money]):
        with trace.get_tracer("test").start_as_current_span("checkout") as parent:
            run = await client.start_run(
                "Pay ACME $250", model=[tool_call(wire_money, amount=250, to="ACME"), echo()], tools=[wire_money]
            )
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.ok, outcome

    caller = parent.get_span_context()
    [(task, inner)] = seen
    task_trace, server_span = parse(task.traceparent)
    assert task_trace == caller.trace_id  # the run joined the caller's trace
    assert server_span != caller.span_id  # the task names the server's attempt span, not the caller's

    spans = {s.name: s for s in exporter.get_finished_spans()}
    worker_span = spans[f"execute_tool {wire_money.name}"]
    assert worker_span.kind == trace.SpanKind.INTERNAL
    assert worker_span.context.trace_id == caller.trace_id
    assert worker_span.parent is not None and worker_span.parent.span_id == server_span
    assert worker_span.parent.is_remote
    assert dict(worker_span.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": wire_money.name,
        "aaa.run_id": run.id,
        "aaa.call_id": task.call_id,
        "aaa.attempt": 1,
    }
    assert worker_span.status.status_code == trace.StatusCode.UNSET
    # The tool's own span nests under the worker's.
    assert spans["bank.transfer"].parent.span_id == worker_span.context.span_id
    assert inner.trace_id == caller.trace_id


async def test_model_tasks_get_a_chat_span_and_failures_are_marked(client, uid, exporter):
    @tool(name=f"wire_money_{uid}")
    def wire_money(amount: int, to: str) -> str:
        """Send money."""
        raise aaa.NonRetryable("bank closed")

    def model(request: aaa.ModelRequest) -> aaa.Reply:
        if request.messages[-1].role == "user":
            return tool_call(wire_money, amount=250, to="ACME")
        return aaa.text("gave up")

    async with client.worker(tools=[wire_money], models={f"m-{uid}": model}):
        with trace.get_tracer("test").start_as_current_span("checkout") as parent:
            run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire_money])
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.ok and outcome.value == {"text": "gave up"}

    spans = exporter.get_finished_spans()
    chats = [s for s in spans if s.name == f"chat m-{uid}"]
    assert len(chats) == 2
    for chat in chats:
        assert chat.kind == trace.SpanKind.CLIENT
        assert chat.context.trace_id == parent.get_span_context().trace_id
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == f"m-{uid}"
        assert chat.attributes["aaa.run_id"] == run.id
    [failed] = [s for s in spans if s.name == f"execute_tool {wire_money.name}"]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.attributes["error.type"] == "NonRetryable"
    assert [e.name for e in failed.events] == ["exception"]


async def test_no_current_span_sends_no_traceparent(exporter):
    assert _otel.traceparent() is None
    with trace.get_tracer("test").start_as_current_span("checkout") as span:
        context = span.get_span_context()
        assert _otel.traceparent() == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


async def test_without_opentelemetry_runs_and_workers_work_as_before(client, uid, monkeypatch):
    # As if opentelemetry-api were not installed.
    monkeypatch.setattr(_otel, "_propagator", None)
    seen: list[aaa.TaskInfo] = []

    @tool(name=f"wire_money_{uid}")
    def wire_money(amount: int) -> int:
        """Send money."""
        seen.append(aaa.current_task())
        return amount

    async with client.worker(tools=[wire_money]):
        with trace.get_tracer("test").start_as_current_span("checkout"):
            run = await client.start_run("pay", model=[tool_call(wire_money, amount=5), echo()], tools=[wire_money])
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.ok
    assert seen[0].traceparent  # the server's own trace: the task still names its span


def test_the_sdk_imports_and_runs_without_the_opentelemetry_package():
    # A process where `import opentelemetry` fails, as when the otel extra is not installed.
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import aaa, aaa._otel as o\n"
        "assert o.traceparent() is None\n"
        "with o.task_span('tool', 't', None) as span: assert span is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
