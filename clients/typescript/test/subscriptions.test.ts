/** Consumer groups: a subscriber reacts to approval requests (the seed's notify), a failing handler gets the event again, a subscriber joins again after its stream ends. */

import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, test } from "node:test";
import {
  Cancelled,
  GroupMismatch,
  InvalidField,
  connect,
  text,
  tool,
  toolCall,
  type Client,
  type Delivery,
  type ModelHandler,
} from "../src/index.js";
import { WAIT_MS, setUp, startServer, uid, within, type Server } from "./helpers.js";

let client: Client;
let tearDown: () => Promise<void>;
before(async () => {
  ({ client, stop: tearDown } = await setUp());
});
after(() => tearDown());

/** A gated tool and a model that calls it once, then echoes its result. */
function gatedSetup(id: string) {
  const wire = tool({
    name: `wire_${id}`,
    description: "Send money.",
    parameters: { type: "object", properties: { amount: { type: "integer" }, to: { type: "string" } } },
    requiresApproval: true,
    handler: ({ amount, to }: { amount: number; to: string }) => `sent $${amount} to ${to}`,
  });
  const model: ModelHandler = (request) => {
    const last = request.messages[request.messages.length - 1];
    if (last.role === "user") return toolCall(wire, { amount: 250, to: "ACME" });
    return text(last.content);
  };
  return { wire, model };
}

/** Runs client.subscribe until the returned stop() is called. */
function subscribed(...args: Parameters<Client["subscribe"]>): { stop(): Promise<void> } {
  const leave = new AbortController();
  const running = client.subscribe(args[0], args[1], { ...args[2], signal: leave.signal });
  return {
    async stop() {
      leave.abort();
      await assert.rejects(running, Cancelled);
    },
  };
}

test("a subscriber approves each request once", async () => {
  const id = uid();
  const { wire, model } = gatedSetup(id);
  const labels = { test: id };
  const seen: [string, number][] = [];
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  const subscription = subscribed(
    "aaa.approval.requested",
    async (delivery: Delivery) => {
      seen.push([delivery.event.runId, delivery.attempt]);
      const callId = (delivery.event.data as { call_id: string }).call_id;
      await client.run(delivery.event.runId).approve(callId);
    },
    { group: `notify-${id}`, labels, startFrom: "beginning" },
  );
  try {
    const runs = [];
    for (let i = 0; i < 3; i++) runs.push(await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels }));
    for (const run of runs) {
      const outcome = await run.result({ timeoutMs: WAIT_MS });
      assert.deepEqual(outcome.value, { text: "sent $250 to ACME" });
    }
    assert.deepEqual(seen.map(([r]) => r).sort(), runs.map((r) => r.id).sort());
    assert.ok(seen.every(([, attempt]) => attempt === 1));
  } finally {
    await subscription.stop();
    await worker.stop();
  }
});

test("a failing handler gets the event again", async () => {
  const id = uid();
  const { wire, model } = gatedSetup(id);
  const labels = { test: id };
  const attempts: number[] = [];
  let done!: () => void;
  const handled = new Promise<void>((resolve) => (done = resolve));
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  const subscription = subscribed(
    "aaa.approval.requested",
    (delivery: Delivery) => {
      attempts.push(delivery.attempt);
      if (delivery.attempt === 1) throw new Error("mail server down");
      done();
    },
    { group: `flaky-${id}`, labels, startFrom: "beginning" },
  );
  try {
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels });
    await handled;
    await run.cancel("done");
    assert.deepEqual(attempts, [1, 2]);
  } finally {
    await subscription.stop();
    await worker.stop();
  }
});

test("bad subscriptions are refused", async () => {
  const id = uid();
  await assert.rejects(client.subscribe("app.*.x", () => undefined, { group: `g-${id}` }), (err: unknown) => {
    assert.ok(err instanceof InvalidField);
    assert.equal(err.metadata.field, "open.event_types[0]");
    return true;
  });
  // A first member creates the group; its first answer says it joined.
  const first = new AbortController();
  const stream = client.services.subscription.subscribe(
    (async function* () {
      yield { kind: { case: "open" as const, value: { group: `g-${id}`, eventTypes: ["app.one"] } } };
      await new Promise((resolve) => first.signal.addEventListener("abort", resolve));
    })(),
    { signal: first.signal },
  );
  try {
    const joined = await stream[Symbol.asyncIterator]().next();
    assert.equal(joined.value?.item.case, "subscribed");
    await assert.rejects(client.subscribe("app.two", () => undefined, { group: `g-${id}` }), GroupMismatch);
  } finally {
    first.abort();
  }
});

test("a subscriber joins again after the server ends its stream", async () => {
  const id = uid();
  const first = await startServer({ keep: true });
  let second: Server | undefined;
  // retryMs 0: calls do not retry, but a subscription joins again all the same.
  const subscriber = await connect(first.address, { retryMs: 0 });
  const starter = await connect(first.address);
  // The first Subscribe stream ends cleanly after its first delivery, as when the server ends it.
  const services = subscriber.services.subscription;
  const real = services.subscribe.bind(services);
  let streams = 0;
  services.subscribe = (requests, options) => {
    const stream = real(requests, options);
    streams += 1;
    if (streams > 1) return stream;
    return (async function* () {
      for await (const response of stream) {
        yield response;
        if (response.item.case === "delivery") return;
      }
    })();
  };
  const labels = { test: id };
  const started: string[] = [];
  let arrived = () => {};
  const leave = new AbortController();
  const running = subscriber.subscribe("aaa.run.started", (d: Delivery) => {
    started.push(d.event.runId);
    arrived();
  }, { group: `restart-${id}`, labels, startFrom: "beginning", signal: leave.signal });
  running.catch(() => {}); // awaited by delivered() and at the end
  /** Waits for the delivery of this run's aaa.run.started; fails if subscribe ends first. */
  const delivered = (runId: string) => {
    const arrival = new Promise<void>((resolve) => {
      arrived = () => started.includes(runId) && resolve();
      arrived();
    });
    const ended = running.then(() => assert.fail("subscribe returned"));
    return within(Promise.race([arrival, ended]), WAIT_MS, `the delivery of ${runId}`);
  };
  const run = async (task: string) => (await starter.startRun(task, { model: [text(task)], labels })).id;
  try {
    await delivered(await run("one")); // and the first stream ends
    await delivered(await run("two"));
    assert.ok(streams >= 2, `${streams} Subscribe streams`);
    await first.stop(); // SIGTERM: the stream ends with UNAVAILABLE (SHUTTING_DOWN)
    second = await startServer({ listen: first.address, dir: first.dir });
    await delivered(await run("three"));
    leave.abort();
    await assert.rejects(running, Cancelled);
  } finally {
    leave.abort();
    subscriber.close();
    starter.close();
    await first.stop();
    await second?.stop();
    rmSync(first.dir, { recursive: true, force: true });
  }
});
