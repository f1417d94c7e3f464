"""OpenTelemetry, when the optional ``opentelemetry-api`` package is installed (``pip install aaa-sdk[otel]``).

StartRun sends the current span's W3C ``traceparent`` so the run's spans join
the caller's trace; a worker runs each task's handler in a span that is a child
of the server's span for the attempt (``Task.traceparent``). Without the
package, or without an SDK registered (the API alone records nothing), this
module does nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # OpenTelemetry is optional
    trace = None  # type: ignore[assignment]

# The server reads only W3C `traceparent`, so we use that propagator rather than
# the global one, which the user may have set to another format.
_propagator = TraceContextTextMapPropagator() if trace is not None else None


def traceparent() -> str | None:
    """The current span's ``traceparent``, or None without OpenTelemetry or a valid current span."""
    if _propagator is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)  # injects nothing when the current span is invalid
    return carrier.get("traceparent")


@contextlib.contextmanager
def task_span(kind: str, name: str, task: Any) -> Iterator[Any]:
    """The worker's span for one task (None when there is none to make), current while it is open.

    ``execute_tool NAME`` (INTERNAL) for a tool, ``chat MODEL`` (CLIENT) for a
    model, a child of the server's span named by ``task.traceparent``.
    """
    if _propagator is None or not task.traceparent:
        yield None
        return
    parent = _propagator.extract({"traceparent": task.traceparent})
    if kind == "tool":
        operation, span_kind, name_key = "execute_tool", trace.SpanKind.INTERNAL, "gen_ai.tool.name"
    else:
        operation, span_kind, name_key = "chat", trace.SpanKind.CLIENT, "gen_ai.request.model"
    attributes = {
        "gen_ai.operation.name": operation,
        name_key: name,
        "aaa.run_id": task.run_id,
        "aaa.call_id": task.call_id,
        "aaa.attempt": task.attempt,
    }
    tracer = trace.get_tracer("aaa")
    # The worker turns the handler's exceptions into a FailTask report, so it marks
    # the failure itself (fail); an exception out of here is cancellation.
    with tracer.start_as_current_span(
        f"{operation} {name}", context=parent, kind=span_kind, attributes=attributes
    ) as span:
        yield span


def fail(span: Any, exc: BaseException) -> None:
    """Mark ``span`` (from task_span; None is fine) failed by ``exc``: error status and ``error.type``."""
    if span is None:
        return
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
