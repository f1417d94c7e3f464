/** The worker: failover after a killed worker, fenced attempts, results sent again after a lost reply, heartbeats, failures, cancellation, concurrency, stop. */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { ConnectError, type CallOptions } from "@connectrpc/connect";
import {
  Code,
  InvalidArgument,
  NonRetryable,
  StaleAttempt,
  FailedPrecondition,
  connect,
  echo,
  text,
  toAaaError,
  tool,
  toolCall,
  type Client,
  type ModelHandler,
  type pb,
} from "../src/index.js";
import { PACKAGE_DIR, WAIT_MS, collect, deferred, lineReader, next, ofType, setUp, stopProcess, uid, within, type Server } from "./helpers.js";

let server: Server;
let client: Client;
let tearDown: () => Promise<void>;
before(async () => {
  ({ server, client, stop: tearDown } = await setUp());
});
after(() => tearDown());

test("a second worker takes the retry of a killed one", async () => {
  const name = `flaky_${uid()}`;
  const doomed = spawn(process.execPath, ["--import", "tsx", path.join(PACKAGE_DIR, "test/doomed-worker.ts"), name], {
    env: { ...process.env, AAA_SERVER: server.address },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines = lineReader(doomed);
  const rescuer = client.worker({
    identity: "rescuer",
    tools: [tool({ name, retries: 1, retryBackoffS: 0.1, heartbeatTimeoutS: 1, handler: ({ x }: { x: number }) => 2 * x })],
  });
  try {
    assert.equal(await next(lines), "ready");
    const run = await client.startRun("double 21", { model: [toolCall(name, { x: 21 }), echo()], tools: [name] });
    const started = await run.waitFor("aaa.tool.started", { timeoutMs: WAIT_MS });
    assert.deepEqual([started.data.attempt, started.data.worker], [1, "doomed"]);
    assert.equal(await next(lines), "started 1");
    doomed.kill("SIGKILL"); // mid-attempt: no result, no more heartbeats
    await stopProcess(doomed);

    await rescuer.start();
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.text, "42");
    const events = await collect(run);
    assert.deepEqual(
      ofType(events, "aaa.tool.started").map((e) => [e.data.attempt, e.data.worker]),
      [[1, "doomed"], [2, "rescuer"]],
    );
    assert.deepEqual(ofType(events, "aaa.tool.completed").map((e) => [e.data.attempt, e.data.output]), [[2, 42]]);
  } finally {
    await rescuer.stop();
    await stopProcess(doomed);
  }
});

/** PollTask (raw generated client) until a task of tool `name` comes. */
async function pollTask(name: string): Promise<pb.worker.Task> {
  for (;;) {
    const response = await within(client.services.worker.pollTask({ identity: "raw", tools: [name], waitS: 5 }));
    if (response.task) return response.task;
  }
}

test("a superseded attempt is refused with StaleAttempt", async () => {
  const name = `lease_${uid()}`;
  const lease = tool({ name, retries: 1, retryBackoffS: 0.1, heartbeatTimeoutS: 0.5, handler: ({ x }: { x: number }) => x });
  await client.worker({ tools: [lease] }).register();
  const run = await client.startRun("go", { model: [toolCall(lease, { x: 1 }), echo()], tools: [lease] });
  const first = await pollTask(name);
  assert.equal(first.attempt, 1);
  const second = await pollTask(name); // no heartbeat: the lease ran out, this is the retry
  assert.deepEqual([second.attempt, second.callId], [2, first.callId]);

  const worker = client.services.worker;
  const refused = await worker.completeTask({ token: first.token, result: { case: "outputJson", value: "1" } }).then(
    () => assert.fail("a stale result was accepted"),
    toAaaError,
  );
  assert.ok(refused instanceof StaleAttempt && refused instanceof FailedPrecondition);
  assert.equal(refused.reason, "STALE_ATTEMPT");
  await assert.rejects(
    client.call((o) => worker.heartbeatTask({ token: first.token }, o)),
    StaleAttempt,
  );
  await client.call((o) => worker.completeTask({ token: second.token, result: { case: "outputJson", value: "1" } }, o));
  assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "1");
});

test("heartbeats keep a long attempt alive", async () => {
  const longJob = tool({
    name: `long_${uid()}`,
    retries: 0,
    heartbeatTimeoutS: 0.5,
    handler: async ({ x }: { x: number }) => {
      await sleep(2000); // the work itself: four heartbeat timeouts
      return x;
    },
  });
  const worker = client.worker({ tools: [longJob] });
  await worker.start();
  try {
    const run = await client.startRun("go", { model: [toolCall(longJob, { x: 5 }), echo()], tools: [longJob] });
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "5");
    assert.deepEqual(ofType(await collect(run), "aaa.tool.started").map((e) => e.data.attempt), [1]);
  } finally {
    await worker.stop();
  }
});

test("tool errors become failures the model reads; retries and NonRetryable apply", async () => {
  const id = uid();
  class ValueError extends Error {}
  const boom = tool({
    name: `boom_${id}`,
    retries: 0,
    handler: ({ x }: { x: number }) => {
      throw new ValueError(`bad x: ${x}`);
    },
  });
  const secondTry = tool({
    name: `second_try_${id}`,
    retries: 2,
    retryBackoffS: 0.1,
    handler: ({ x }: { x: number }, task) => {
      if (task.attempt === 1) throw new TypeError("transient");
      return x;
    },
  });
  const fatal = tool({
    name: `fatal_${id}`,
    retries: 3,
    retryBackoffS: 0.1,
    handler: async () => {
      throw new NonRetryable("no way");
    },
  });
  const model: ModelHandler = async (request) => {
    const last = request.messages[request.messages.length - 1];
    if (last.role === "user") return [toolCall(boom, { x: 3 }), toolCall(secondTry, { x: 4 }), toolCall(fatal, { x: 5 })];
    const results = request.messages.filter((m) => m.role === "tool");
    return text(results.map((m) => `${m.name}=${m.error ? m.error.type : m.content}`).join(" | "));
  };
  const worker = client.worker({ tools: [boom, secondTry, fatal], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("go", { model: `m-${id}`, tools: [boom, secondTry, fatal] });
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.deepEqual(outcome.text.split(" | ").sort(), [`${boom.name}=ValueError`, `${fatal.name}=NonRetryable`, `${secondTry.name}=4`].sort());
    const events = await collect(run);
    const errors = ofType(events, "aaa.tool.failed").map((e) => e.data.error as { type: string });
    assert.deepEqual(errors.sort((a, b) => a.type.localeCompare(b.type)), [
      { type: "NonRetryable", message: "no way" },
      { type: "ValueError", message: "bad x: 3" },
    ]);
    const retrying = ofType(events, "aaa.tool.retrying");
    assert.deepEqual(retrying.map((e) => e.data.error), [{ type: "TypeError", message: "transient" }]);
    const attempts = new Map(ofType(events, "aaa.tool.started").map((e) => [e.data.call_id, e.data.attempt]));
    assert.deepEqual([...attempts.values()].sort(), [1, 1, 2]);
  } finally {
    await worker.stop();
  }
});

test("cancelling a run aborts the running handler's signal and nothing is reported", async () => {
  const entered = deferred();
  const aborted = deferred<unknown>();
  const held = tool({
    name: `held_${uid()}`,
    heartbeatTimeoutS: 0.6,
    handler: async (_args, task) => {
      entered.resolve();
      task.signal.addEventListener("abort", () => aborted.resolve(task.signal.reason));
      await new Promise(() => {}); // ignores the signal on purpose: the worker must not wait for it
    },
  });
  const worker = client.worker({ tools: [held] });
  await worker.start();
  try {
    const run = await client.startRun("go", { model: [toolCall(held, {}), echo()], tools: [held] });
    await within(entered.promise);
    await run.cancel("stop it");
    assert.ok((await within(aborted.promise)) instanceof Error);
    const events = await collect(run);
    assert.equal(events[events.length - 1].type, "aaa.run.cancelled");
    assert.deepEqual(ofType(events, "aaa.tool.completed"), []);
  } finally {
    await worker.stop({ graceMs: 0 });
  }
});

test("the concurrency limit holds", async () => {
  let running = 0;
  let peak = 0;
  const busy = tool({
    name: `busy_${uid()}`,
    handler: async ({ i }: { i: number }) => {
      running += 1;
      peak = Math.max(peak, running);
      await sleep(200); // the work itself
      running -= 1;
      return i;
    },
  });
  const calls = toolCall(busy, { i: 1 }).and(toolCall(busy, { i: 2 }), toolCall(busy, { i: 3 }));
  const worker = client.worker({ tools: [busy], concurrency: 1 });
  await worker.start();
  try {
    const run = await client.startRun("go", { model: [calls, text("done")], tools: [busy] });
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "done");
    assert.equal(peak, 1);
    const outputs = ofType(await collect(run), "aaa.tool.completed").map((e) => e.data.output as number);
    assert.deepEqual(outputs.sort(), [1, 2, 3]);
  } finally {
    await worker.stop();
  }
});

test("a graceful stop lets the running task finish", async () => {
  const entered = deferred();
  const release = deferred();
  const held = tool({
    name: `held_${uid()}`,
    handler: async ({ x }: { x: number }) => {
      entered.resolve();
      await release.promise;
      return x;
    },
  });
  const worker = client.worker({ tools: [held] });
  await worker.start();
  const run = await client.startRun("go", { model: [toolCall(held, { x: 7 }), echo()], tools: [held] });
  await within(entered.promise);
  let stopped = false;
  const stopping = worker.stop().then(() => (stopped = true));
  await sleep(50);
  assert.equal(stopped, false, "stop() returned while a task was running");
  release.resolve();
  await within(stopping);
  assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "7");
});

test("a stop past its grace period reports WorkerStopped", async () => {
  const entered = deferred();
  const held = tool({
    name: `stuck_${uid()}`,
    retries: 0,
    handler: async () => {
      entered.resolve();
      await new Promise(() => {});
    },
  });
  const worker = client.worker({ tools: [held] });
  await worker.start();
  const run = await client.startRun("go", { model: [toolCall(held, {}), echo()], tools: [held] });
  await within(entered.promise);
  await within(worker.stop({ graceMs: 100 }));
  const outcome = await run.result({ timeoutMs: WAIT_MS });
  assert.match(outcome.text, /^WorkerStopped: worker .* stopped$/);
});

test("a forged token is InvalidToken", async () => {
  const err = await client.call((o) => client.services.worker.heartbeatTask({ token: "forged" }, o)).then(
    () => assert.fail("a forged token was accepted"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof InvalidArgument);
  assert.equal((err as InvalidArgument).reason, "INVALID_TOKEN");
});

/** `call` that reaches the server, but whose first reply is lost (it fails with `code`); `answers` gets each reply's alreadyRecorded. */
function losesFirstReply<Q, R extends { alreadyRecorded: boolean }>(
  call: (request: Q, options?: CallOptions) => Promise<R>,
  code: Code,
  answers: boolean[],
): (request: Q, options?: CallOptions) => Promise<R> {
  return async (request, options) => {
    const response = await call(request, options);
    answers.push(response.alreadyRecorded);
    if (answers.length === 1) throw new ConnectError("reply lost", code);
    return response;
  };
}

test("a result whose reply was lost is sent again", async () => {
  const id = uid();
  const works = tool({ name: `works_${id}`, handler: ({ x }: { x: number }) => x });
  const refuses = tool({
    name: `refuses_${id}`,
    handler: ({ x }: { x: number }) => {
      throw new NonRetryable(`not ${x}`);
    },
  });
  const workerClient = await connect(server.address);
  const services = workerClient.services.worker;
  const completed: boolean[] = [];
  const failed: boolean[] = [];
  services.completeTask = losesFirstReply(services.completeTask.bind(services), Code.DeadlineExceeded, completed);
  services.failTask = losesFirstReply(services.failTask.bind(services), Code.Unavailable, failed);
  const debug: string[] = [];
  const worker = workerClient.worker({ tools: [works, refuses], logger: { debug: (m) => debug.push(m), info: () => {}, warn: () => {} } });
  await worker.start();
  let run;
  try {
    run = await client.startRun("go", { model: [toolCall(works, { x: 1 }).and(toolCall(refuses, { x: 2 })), text("done")], tools: [works, refuses] });
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "done");
  } finally {
    await worker.stop(); // waits for the reports, which may still be sending again
    workerClient.close();
  }
  // Sent again with the same token and result: the server had it, and says so.
  assert.deepEqual(completed, [false, true]);
  assert.deepEqual(failed, [false, true]);
  const events = await collect(run);
  assert.deepEqual(ofType(events, "aaa.tool.completed").map((e) => [e.data.attempt, e.data.output]), [[1, 1]]);
  assert.deepEqual(ofType(events, "aaa.tool.failed").map((e) => (e.data.error as { message: string }).message), ["not 2"]);
  assert.equal(debug.filter((m) => m.includes("recorded already")).length, 2);
});
