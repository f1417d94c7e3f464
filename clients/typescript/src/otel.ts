/**
 * OpenTelemetry, when the optional peer dependency `@opentelemetry/api` is
 * installed: `startRun` sends the active span's W3C `traceparent`, so the
 * run's spans join the caller's trace, and a worker runs each handler in a
 * span that is a child of the server's span of the attempt
 * (`Task.traceparent`). Without the package, or without an SDK registered
 * (the API alone is a no-op), nothing happens.
 *
 * @module
 */

import type * as Api from "@opentelemetry/api";
import type { Task } from "./gen/aaa/v1/worker_pb.js";

let loading: Promise<typeof Api | undefined> | undefined;

/** `@opentelemetry/api` if it is installed, loaded once and lazily, so the SDK works without it. */
function api(): Promise<typeof Api | undefined> {
  loading ??= import("@opentelemetry/api").then(
    (m) => m,
    () => undefined,
  );
  return loading;
}

// The server reads W3C `traceparent` only, so it is written and read here
// with the API's span context functions, as the W3C TraceContext propagator
// does: the global propagator may be unset (the API's default is a no-op) or
// another format, and the propagator class lives in @opentelemetry/core, an
// SDK package the SDK should not require.
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** The active span's `traceparent`, or undefined without OpenTelemetry or a valid active span. */
export async function traceparent(): Promise<string | undefined> {
  const otel = await api();
  if (otel === undefined) return undefined;
  const span = otel.trace.getSpanContext(otel.context.active());
  if (span === undefined || !otel.isSpanContextValid(span)) return undefined;
  const flags = (span.traceFlags & 0xff).toString(16).padStart(2, "0");
  return `00-${span.traceId}-${span.spanId}-${flags}`;
}

/** The context whose (remote) span is the one `value` names, or undefined when `value` is not a valid traceparent. */
function parentContext(otel: typeof Api, value: string): Api.Context | undefined {
  const match = TRACEPARENT.exec(value.trim());
  if (match === null || match[1] === "ff" || (match[1] === "00" && match[5] !== undefined)) return undefined;
  const span = { traceId: match[2], spanId: match[3], traceFlags: parseInt(match[4], 16), isRemote: true };
  if (!otel.isSpanContextValid(span)) return undefined;
  return otel.trace.setSpanContext(otel.context.active(), span);
}

/** Marks the task's span failed: error status and `error.type`. */
export type FailSpan = (err: unknown, type: string) => void;

/**
 * Runs `work` in the worker's span of `task` when there is one to make:
 * `execute_tool NAME` (INTERNAL) for a tool, `chat MODEL` (CLIENT) for a
 * model, a child of the server's span named by `task.traceparent`, active
 * while `work` runs so the handler's spans nest under it. The worker turns a
 * handler's error into a report, so `work` marks the failure with `fail`.
 */
export async function inTaskSpan<T>(task: Task, name: string, work: (fail: FailSpan) => Promise<T>): Promise<T> {
  const otel = task.traceparent ? await api() : undefined;
  const parent = otel === undefined ? undefined : parentContext(otel, task.traceparent);
  if (otel === undefined || parent === undefined) return work(() => {});
  const tool = task.kind.case === "tool";
  const operation = tool ? "execute_tool" : "chat";
  const options: Api.SpanOptions = {
    kind: tool ? otel.SpanKind.INTERNAL : otel.SpanKind.CLIENT,
    attributes: {
      "gen_ai.operation.name": operation,
      [tool ? "gen_ai.tool.name" : "gen_ai.request.model"]: name,
      "aaa.run_id": task.runId,
      "aaa.call_id": task.callId,
      "aaa.attempt": task.attempt,
    },
  };
  return otel.trace.getTracer("aaa").startActiveSpan(`${operation} ${name}`, options, parent, async (span) => {
    try {
      return await work((err, type) => {
        if (err instanceof Error) span.recordException(err);
        span.setAttribute("error.type", type);
        span.setStatus({ code: otel.SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
      });
    } finally {
      span.end();
    }
  });
}
