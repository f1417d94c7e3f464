/** Event streams: resuming from a cursor, filtering, typed data, and surviving a dropped connection. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Cancelled, Timeout, connect, echo, isEvent, tool, toolCall, type Client, type Event, type Tool } from "../src/index.js";
import { Proxy, WAIT_MS, collect, next, ofType, setUp, uid, within, type Server } from "./helpers.js";

let server: Server;
let client: Client;
let tearDown: () => Promise<void>;
before(async () => {
  ({ server, client, stop: tearDown } = await setUp());
});
after(() => tearDown());

/** A tool that doubles a number, gated or not. */
function doubleTool(id: string, gated = false): Tool<{ x: number }> {
  return tool({ name: `double_${id}`, requiresApproval: gated, handler: ({ x }: { x: number }) => 2 * x });
}

const key = (e: Event) => [e.seq, e.id, e.type, e.dataJson];

test("events resume from a cursor, filter by prefix, and carry typed data", async () => {
  const double = doubleTool(uid());
  const worker = client.worker({ tools: [double] });
  await worker.start();
  let events: Event[];
  const run = await client.startRun("double 21", { model: [toolCall(double, { x: 21 }), echo()], tools: [double] });
  try {
    events = await collect(run);
  } finally {
    await worker.stop();
  }
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i + 1));
  assert.equal(events[0].type, "aaa.run.started");
  assert.equal(events[events.length - 1].type, "aaa.run.completed");
  assert.deepEqual(events[events.length - 1].data, { value: { text: "42" } });
  assert.ok(events.every((e) => e.runId === run.id));
  const positions = events.map((e) => e.position);
  assert.deepEqual(positions, [...positions].sort((a, b) => a - b));

  assert.deepEqual((await collect(run, { afterSeq: 3 })).map(key), events.slice(3).map(key));
  assert.deepEqual((await collect(run, { follow: false })).map(key), events.map(key));
  assert.deepEqual(await collect(run, { afterSeq: events.length }), []);
  const toolEvents = await collect(run, { typePrefix: "aaa.tool." });
  assert.deepEqual(toolEvents.map((e) => e.type), events.filter((e) => e.type.startsWith("aaa.tool.")).map((e) => e.type));

  const started = toolEvents.find((e) => isEvent(e, "aaa.tool.started"));
  assert.ok(started && isEvent(started, "aaa.tool.started"));
  assert.equal(started.data.attempt, 1);
  assert.equal(started.actor.kind === "engine" || started.actor.kind === "worker", true);
  const completed = ofType(events, "aaa.tool.completed")[0];
  assert.ok(isEvent(completed, "aaa.tool.completed"));
  assert.equal(completed.data.output, 42);
  assert.ok(completed.time instanceof Date && completed.time.getTime() > 0);
});

test("events resume mid-run from the last seq with no gap and no duplicate", async () => {
  const double = doubleTool(uid(), true);
  const worker = client.worker({ tools: [double] });
  await worker.start();
  try {
    const run = await client.startRun("double 21", { model: [toolCall(double, { x: 21 }), echo()], tools: [double] });
    const seen: Event[] = [];
    for await (const event of run.events({ signal: AbortSignal.timeout(WAIT_MS) })) {
      seen.push(event);
      if (event.type === "aaa.approval.requested") break; // closes the stream
    }
    await run.approve(String(seen[seen.length - 1].data.call_id));
    const rest = await collect(run, { afterSeq: seen[seen.length - 1].seq });
    const seqs = [...seen, ...rest].map((e) => e.seq);
    assert.deepEqual(seqs, seqs.map((_, i) => i + 1));
    assert.equal(rest[rest.length - 1].type, "aaa.run.completed");
  } finally {
    await worker.stop();
  }
});

test("events survive a dropped connection", async () => {
  const double = doubleTool(uid(), true);
  const proxy = await new Proxy(server.address).start();
  const follower = await connect(proxy.address);
  const worker = client.worker({ tools: [double] });
  await worker.start();
  try {
    const run = await client.startRun("double 21", { model: [toolCall(double, { x: 21 }), echo()], tools: [double] });
    const seen: Event[] = [];
    const stream = follower.run(run.id).events();
    while (seen.length === 0 || seen[seen.length - 1].type !== "aaa.approval.requested") seen.push(await next(stream));
    assert.ok(proxy.drop() > 0); // cut while the stream waits for live events
    await run.approve(String(seen[seen.length - 1].data.call_id));
    seen.push(await next(stream));
    assert.ok(proxy.drop() > 0); // and cut again after the reconnect
    for (;;) {
      const item = await within(stream.next(), WAIT_MS, "the stream");
      if (item.done) break;
      seen.push(item.value);
    }
    const seqs = seen.map((e) => e.seq);
    assert.deepEqual(seqs, seqs.map((_, i) => i + 1));
    assert.equal(seen[seen.length - 1].type, "aaa.run.completed");
    assert.deepEqual((await collect(run)).map((e) => e.seq), seqs);
    const outcome = await follower.run(run.id).result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.text, "42");
  } finally {
    await worker.stop();
    follower.close();
    await proxy.close();
  }
});

test("an aborted stream throws Cancelled, and waitFor gives up after timeoutMs", async () => {
  const double = doubleTool(uid(), true);
  const worker = client.worker({ tools: [double] });
  await worker.start();
  try {
    const run = await client.startRun("double 21", { model: [toolCall(double, { x: 21 }), echo()], tools: [double] });
    await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    const controller = new AbortController();
    const stream = run.events({ signal: controller.signal });
    await next(stream);
    const pending = (async () => {
      for (;;) if ((await stream.next()).done) return;
    })();
    controller.abort();
    await assert.rejects(pending, Cancelled);
    await assert.rejects(run.waitFor("app.never", { timeoutMs: 200 }), Timeout);
    await run.cancel("done");
  } finally {
    await worker.stop();
  }
});
