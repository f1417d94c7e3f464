/** OpenTelemetry: startRun sends the active span's traceparent, the worker's span is a child of the server's span of the attempt (Task.traceparent), and without OpenTelemetry nothing changes. */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import path from "node:path";
import { after, before, beforeEach, test } from "node:test";
import { promisify } from "node:util";
import { SpanKind, SpanStatusCode, context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { NonRetryable, echo, text, tool, toolCall, type Client, type ModelHandler, type TaskContext } from "../src/index.js";
import { traceparent } from "../src/otel.js";
import { PACKAGE_DIR, WAIT_MS, setUp, uid, type Server } from "./helpers.js";

// This file runs in a process of its own: its global provider and context manager touch no other test.
const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const tracer = trace.getTracer("test");

let server: Server;
let client: Client;
let tearDown: () => Promise<void>;
before(async () => {
  ({ server, client, stop: tearDown } = await setUp());
});
after(() => tearDown());
beforeEach(() => exporter.reset());

/** [trace id, span id] of a `00-TRACE-SPAN-FLAGS` value. */
function parse(value: string): [string, string] {
  const [version, traceId, spanId] = value.split("-");
  assert.equal(version, "00");
  return [traceId, spanId];
}

test("the worker's span is a child of the server's span, in the caller's trace", async () => {
  const id = uid();
  const seen: TaskContext[] = [];
  const wireMoney = tool({
    name: `wire_money_${id}`,
    handler: ({ amount, to }: { amount: number; to: string }, task) =>
      tracer.startActiveSpan("bank.transfer", (span) => {
        seen.push(task);
        span.end();
        return `sent $${amount} to ${to}`;
      }),
  });
  const worker = client.worker({ tools: [wireMoney] });
  await worker.start();
  let caller;
  try {
    const run = await tracer.startActiveSpan("checkout", async (span) => {
      caller = span.spanContext();
      try {
        return await client.startRun("Pay ACME $250", {
          model: [toolCall(wireMoney, { amount: 250, to: "ACME" }), echo()],
          tools: [wireMoney],
        });
      } finally {
        span.end();
      }
    });
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.text, "sent $250 to ACME");

    assert.equal(seen.length, 1);
    const [taskTrace, serverSpan] = parse(seen[0].traceparent);
    assert.equal(taskTrace, caller!.traceId); // the run joined the caller's trace
    assert.notEqual(serverSpan, caller!.spanId); // the task names the server's attempt span

    const spans = new Map(exporter.getFinishedSpans().map((s) => [s.name, s]));
    const span = spans.get(`execute_tool ${wireMoney.name}`);
    assert.ok(span, `no worker span among ${[...spans.keys()]}`);
    assert.equal(span.kind, SpanKind.INTERNAL);
    assert.equal(span.spanContext().traceId, caller!.traceId);
    assert.equal(span.parentSpanContext?.spanId, serverSpan);
    assert.equal(span.parentSpanContext?.isRemote, true);
    assert.deepEqual(span.attributes, {
      "gen_ai.operation.name": "execute_tool",
      "gen_ai.tool.name": wireMoney.name,
      "aaa.run_id": run.id,
      "aaa.call_id": seen[0].callId,
      "aaa.attempt": 1,
    });
    assert.equal(span.status.code, SpanStatusCode.UNSET);
    // The tool's own span nests under the worker's.
    assert.equal(spans.get("bank.transfer")?.parentSpanContext?.spanId, span.spanContext().spanId);
  } finally {
    await worker.stop();
  }
});

test("model tasks get a chat span, and a failure marks the span", async () => {
  const id = uid();
  const wireMoney = tool({
    name: `wire_money_${id}`,
    handler: () => {
      throw new NonRetryable("bank closed");
    },
  });
  const model: ModelHandler = (request) =>
    request.messages[request.messages.length - 1].role === "user" ? toolCall(wireMoney, { amount: 250 }) : text("gave up");
  const worker = client.worker({ tools: [wireMoney], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const [run, traceId] = await tracer.startActiveSpan("checkout", async (span) => {
      try {
        return [await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wireMoney] }), span.spanContext().traceId] as const;
      } finally {
        span.end();
      }
    });
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "gave up");
    const spans = exporter.getFinishedSpans();
    const chats = spans.filter((s) => s.name === `chat m-${id}`);
    assert.equal(chats.length, 2);
    for (const chat of chats) {
      assert.equal(chat.kind, SpanKind.CLIENT);
      assert.equal(chat.spanContext().traceId, traceId);
      assert.equal(chat.attributes["gen_ai.operation.name"], "chat");
      assert.equal(chat.attributes["gen_ai.request.model"], `m-${id}`);
      assert.equal(chat.attributes["aaa.run_id"], run.id);
    }
    const failed = spans.filter((s) => s.name === `execute_tool ${wireMoney.name}`);
    assert.equal(failed.length, 1);
    assert.equal(failed[0].status.code, SpanStatusCode.ERROR);
    assert.equal(failed[0].attributes["error.type"], "NonRetryable");
    assert.deepEqual(failed[0].events.map((e) => e.name), ["exception"]);
  } finally {
    await worker.stop();
  }
});

test("no active span: no traceparent is sent", async () => {
  assert.equal(await traceparent(), undefined);
  await tracer.startActiveSpan("checkout", async (span) => {
    const { traceId, spanId, traceFlags } = span.spanContext();
    assert.equal(await traceparent(), `00-${traceId}-${spanId}-${traceFlags.toString(16).padStart(2, "0")}`);
    span.end();
  });
});

test("without the @opentelemetry/api package, runs and workers work as before", async () => {
  // A resolve hook that fails every @opentelemetry import, as when the peer dependency is not installed.
  const hook = `export async function resolve(specifier, context, next) {
    if (specifier.startsWith("@opentelemetry/")) throw new Error("not installed: " + specifier);
    return next(specifier, context);
  }`;
  const register = `import { register } from "node:module"; register(${JSON.stringify("data:text/javascript," + encodeURIComponent(hook))});`;
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ["--import", "data:text/javascript," + encodeURIComponent(register), "--import", "tsx", path.join(PACKAGE_DIR, "test/untraced-run.ts"), `wire_money_${uid()}`],
    { env: { ...process.env, AAA_SERVER: server.address }, timeout: WAIT_MS },
  );
  const [output, taskTraceparent] = stdout.trim().split(" ");
  assert.equal(output, "5");
  assert.match(taskTraceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/); // the run's own trace
});
