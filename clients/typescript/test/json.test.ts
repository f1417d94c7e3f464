/** Integers and nested JSON round-trip exactly: model -> approval -> tool -> output -> model -> result, and signals. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { echo, parse, stringify, text, tool, toolCall, type Client, type JsonObject, type ModelHandler, type Run } from "../src/index.js";
import { WAIT_MS, collect, ofType, setUp, uid } from "./helpers.js";

const PAYLOAD = {
  amount: 250,
  big: 2n ** 63n + 1n,
  huge: -(2n ** 70n) - 3n,
  max_safe: Number.MAX_SAFE_INTEGER,
  just_past_safe: 9007199254740993n,
  price: 1.5,
  tiny: 1e-7,
  nested: [1, [2, { x: 2n ** 64n, y: [null, true, false, "s"] }], { z: { w: 9007199254740993n } }],
  text: 'caf\u00e9 \u2603 "quoted" \\ \n \u0001 \ud83d\ude00',
} satisfies JsonObject;
// The server's canonical JSON: sorted keys, no spaces, non-ASCII as is.
const CANONICAL =
  '{"amount":250,"big":9223372036854775809,"huge":-1180591620717411303427,"just_past_safe":9007199254740993,' +
  '"max_safe":9007199254740991,"nested":[1,[2,{"x":18446744073709551616,"y":[null,true,false,"s"]}],' +
  '{"z":{"w":9007199254740993}}],"price":1.5,"text":"caf\u00e9 \u2603 \\"quoted\\" \\\\ \\n \\u0001 \ud83d\ude00","tiny":1e-7}';

describe("json", () => {
  test("parse keeps integers beyond 2^53 as bigints, and others as numbers", () => {
    assert.deepEqual(parse(stringify(PAYLOAD)), PAYLOAD);
    assert.equal(parse("9007199254740991"), 9007199254740991);
    assert.equal(parse("9007199254740992"), 9007199254740992n);
    assert.equal(parse("-9007199254740993"), -9007199254740993n);
    assert.equal(parse("250"), 250);
    assert.equal(parse("2.0"), 2);
    assert.equal(parse("1e3"), 1000);
    assert.equal(parse("12345678901234567890.5"), 12345678901234567890.5);
    assert.deepEqual(parse(' { "a" : [ 1 , { } , [ ] ] , "b" : "\\u00e9\\n" } '), { a: [1, {}, []], b: "\u00e9\n" });
    const proto = parse('{"__proto__": {"polluted": 1}}') as JsonObject;
    assert.equal(Object.getPrototypeOf(proto), Object.prototype);
    assert.deepEqual(Object.keys(proto), ["__proto__"]);
  });

  test("parse rejects malformed JSON", () => {
    for (const bad of ["", "01", "1.", "-", "[1,]", '{"a":1,}', '{"a" 1}', '"unterminated', '"\u0001"', "tru", "[1] 2", "{a:1}"]) {
      assert.throws(() => parse(bad), SyntaxError, bad);
    }
  });

  test("stringify writes bigints as integers and refuses what JSON cannot carry", () => {
    assert.equal(stringify({ a: 2n ** 64n, b: [1, undefined, "x"], c: undefined, d: new Date(0) }),
      '{"a":18446744073709551616,"b":[1,null,"x"],"d":"1970-01-01T00:00:00.000Z"}');
    assert.throws(() => stringify(NaN), TypeError);
    assert.throws(() => stringify({ x: Infinity }), TypeError);
    assert.throws(() => stringify(undefined), TypeError);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    assert.throws(() => stringify(cyclic), TypeError);
    const shared = { n: 1 };
    assert.equal(stringify([shared, shared]), '[{"n":1},{"n":1}]');
  });
});

describe("exact numbers through the server", () => {
  let client: Client;
  let tearDown: () => Promise<void>;
  before(async () => {
    ({ client, stop: tearDown } = await setUp());
  });
  after(() => tearDown());

  /** A gated tool that returns its argument, and a log of what it received. */
  function echoTool(id: string, received: [unknown, string][]) {
    return tool({
      name: `echo_${id}`,
      requiresApproval: true,
      handler: ({ value }: { value: unknown }, task) => {
        received.push([value, task.callId]);
        return value;
      },
    });
  }

  /** Approves the one call, then checks every copy of the payload along the way. */
  async function checkRoundTrip(run: Run, received: [unknown, string][]): Promise<void> {
    const request = await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    assert.deepEqual(request.data.arguments, { value: PAYLOAD });
    const [pending] = await client.approvals.list({ runId: run.id });
    assert.deepEqual(pending.arguments, { value: PAYLOAD });
    assert.equal(pending.argumentsJson, `{"value":${CANONICAL}}`);
    await run.approve(pending.callId, { argumentsSha256: pending.argumentsSha256 });
    const outcome = await run.result({ timeoutMs: WAIT_MS });

    assert.deepEqual(received.map(([, callId]) => callId), [pending.callId]);
    assert.deepEqual(received[0][0], PAYLOAD);
    assert.equal((received[0][0] as JsonObject).amount, 250);
    assert.equal((received[0][0] as JsonObject).big, 9223372036854775809n);
    const events = await collect(run);
    assert.deepEqual(ofType(events, "aaa.tool.requested").map((e) => e.data.arguments), [{ value: PAYLOAD }]);
    assert.deepEqual(ofType(events, "aaa.tool.completed").map((e) => e.data.output), [PAYLOAD]);
    assert.deepEqual(parse(outcome.text), PAYLOAD);
    assert.equal(outcome.text, CANONICAL);
  }

  test("with a worker-served model", async () => {
    const id = uid();
    const received: [unknown, string][] = [];
    const echoValue = echoTool(id, received);
    const seenByModel: unknown[] = [];
    const model: ModelHandler = (request) => {
      const last = request.messages[request.messages.length - 1];
      if (last.role === "user") return toolCall(echoValue, { value: PAYLOAD });
      seenByModel.push(request.messages[request.messages.length - 2].toolCalls[0].arguments);
      return text(last.content);
    };
    const worker = client.worker({ tools: [echoValue], models: { [`m-${id}`]: model } });
    await worker.start();
    try {
      const run = await client.startRun("echo", { model: `m-${id}`, tools: [echoValue] });
      await checkRoundTrip(run, received);
    } finally {
      await worker.stop();
    }
    assert.deepEqual(seenByModel, [{ value: PAYLOAD }]);
  });

  test("with the scripted model", async () => {
    const received: [unknown, string][] = [];
    const echoValue = echoTool(uid(), received);
    const worker = client.worker({ tools: [echoValue] });
    await worker.start();
    try {
      const run = await client.startRun("echo", { model: [toolCall(echoValue, { value: PAYLOAD }), echo()], tools: [echoValue] });
      await checkRoundTrip(run, received);
    } finally {
      await worker.stop();
    }
  });

  test("in signal data", async () => {
    const received: [unknown, string][] = [];
    const echoValue = echoTool(uid(), received);
    const worker = client.worker({ tools: [echoValue] });
    await worker.start();
    try {
      const run = await client.startRun("wait", { model: [toolCall(echoValue, { value: {} }), echo()], tools: [echoValue] });
      await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
      const sent = await run.signal("app.note", { payload: PAYLOAD });
      assert.ok(sent.seq > 0 && !sent.alreadyDecided);
      const note = await run.waitFor("app.note", { afterSeq: sent.seq - 1, timeoutMs: WAIT_MS });
      assert.equal(note.seq, sent.seq);
      assert.equal(note.actor.kind, "client");
      assert.deepEqual(note.data, { payload: PAYLOAD });
      await run.cancel("done");
    } finally {
      await worker.stop();
    }
    assert.deepEqual(received, []);
  });
});
