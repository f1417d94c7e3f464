/** Server errors surface as typed error classes carrying the ErrorInfo reason. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { ConnectError } from "@connectrpc/connect";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import {
  AaaError,
  ArgumentsMismatch,
  CallNotFound,
  Cancelled,
  Code,
  FailedPrecondition,
  InvalidArgument,
  InvalidField,
  MalformedRequest,
  NotFound,
  OwnerUnavailable,
  OwnershipLost,
  ReservedEventType,
  RunFinished,
  RunNotFound,
  StorageUnavailable,
  ToolNotRegistered,
  Unavailable,
  connect,
  decodeErrorInfo,
  echo,
  pb,
  text,
  tool,
  toAaaError,
  toolCall,
  type Client,
} from "../src/index.js";
import { WAIT_MS, setUp, uid } from "./helpers.js";

let client: Client;
let tearDown: () => Promise<void>;
before(async () => {
  ({ client, stop: tearDown } = await setUp());
});
after(() => tearDown());

/** The error a promise rejects with (fails if it resolves). */
async function failure(promise: Promise<unknown>): Promise<AaaError> {
  return promise.then(
    () => assert.fail("the call succeeded"),
    (err: unknown) => {
      assert.ok(err instanceof AaaError, `not an AaaError: ${err}`);
      return err;
    },
  );
}

test("an unknown run is RunNotFound", async () => {
  const err = await failure(client.getRun("no-such-run"));
  assert.ok(err instanceof RunNotFound && err instanceof NotFound);
  assert.deepEqual([err.code, err.reason, err.name], [Code.NotFound, "RUN_NOT_FOUND", "RunNotFound"]);
  assert.match(String(err), /^RunNotFound: RUN_NOT_FOUND: /);
  assert.ok(await failure(client.run("no-such-run").signal("app.ping")) instanceof RunNotFound);
  assert.ok(await failure(client.run("no-such-run").result({ timeoutMs: WAIT_MS })) instanceof RunNotFound);
  assert.ok(await failure(client.run("no-such-run").cancel()) instanceof RunNotFound);
});

test("bad StartRun requests are ToolNotRegistered and InvalidField with the field", async () => {
  const unknown = await failure(client.startRun("go", { model: [text("hi")], tools: [`never_registered_${uid()}`] }));
  assert.ok(unknown instanceof ToolNotRegistered && unknown instanceof InvalidArgument);
  assert.equal(unknown.code, Code.InvalidArgument);
  const empty = await failure(client.startRun("", { model: [text("hi")] }));
  assert.ok(empty instanceof InvalidField);
  assert.equal(empty.field, "task");
  assert.equal(empty.metadata.field, "task");
});

test("signal rules: reserved types, unknown calls, mismatched hashes, finished runs", async () => {
  const id = uid();
  const gate = tool({ name: `gate_${id}`, requiresApproval: true, handler: ({ x }: { x: number }) => x });
  const worker = client.worker({ tools: [gate] });
  await worker.start();
  let run;
  try {
    run = await client.startRun("go", { model: [toolCall(gate, { x: 1 }), echo()], tools: [gate] });
    const request = await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    const callId = request.data.call_id;
    for (const reserved of ["aaa.tool.completed", "aaa.run.completed", "aaa.approval.requested"]) {
      const err = await failure(run.signal(reserved, { call_id: callId, output: 1 }));
      assert.ok(err instanceof ReservedEventType && err instanceof InvalidArgument, reserved);
    }
    assert.ok((await failure(run.approve("no-such-call"))) instanceof CallNotFound);
    const mismatch = await failure(run.approve(callId, { argumentsSha256: "0".repeat(64) }));
    assert.ok(mismatch instanceof ArgumentsMismatch && mismatch instanceof FailedPrecondition);
    assert.equal((await run.get()).status, "waiting_for_approval");
    const note = await run.signal("app.note", { n: 1 }, { requestId: `note-${id}` });
    const retried = await run.signal("app.note", { n: 1 }, { requestId: `note-${id}` });
    assert.ok(note.seq > 0);
    assert.equal(retried.seq, note.seq);
    await run.approve(callId);
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "1");
  } finally {
    await worker.stop();
  }
  const finished = await failure(run.signal("app.ping"));
  assert.ok(finished instanceof RunFinished && finished instanceof FailedPrecondition);
  assert.equal(finished.code, Code.FailedPrecondition);
});

test("a StartRun retried with its requestId returns the first run", async () => {
  const id = uid();
  const first = await client.startRun("once", { model: [text("ok")], requestId: `start-${id}` });
  const again = await client.startRun("once", { model: [text("ok")], requestId: `start-${id}` });
  assert.ok(first.created && !again.created);
  assert.equal(again.id, first.id);
  assert.equal((await first.result({ timeoutMs: WAIT_MS })).text, "ok");
});

test("no server is Unavailable", async () => {
  const err = await failure(connect("127.0.0.1:1", { timeoutMs: 300 }));
  assert.ok(err instanceof Unavailable);
  assert.equal(err.code, Code.Unavailable);
});

test("ErrorInfo is decoded from its protobuf bytes", () => {
  // reason=1 "RUN_NOT_FOUND", domain=2 "aaa.v1", metadata=3 {"field": "run_id"}, and an unknown varint field 9.
  const bytes = Buffer.concat([
    Buffer.from([0x0a, 13]), Buffer.from("RUN_NOT_FOUND"),
    Buffer.from([0x12, 6]), Buffer.from("aaa.v1"),
    Buffer.from([0x1a, 15, 0x0a, 5]), Buffer.from("field"), Buffer.from([0x12, 6]), Buffer.from("run_id"),
    Buffer.from([0x48, 1]),
  ]);
  assert.deepEqual(decodeErrorInfo(bytes), { reason: "RUN_NOT_FOUND", domain: "aaa.v1", metadata: { field: "run_id" } });
});

/** A failed call as connect reports it: a code and an aaa ErrorInfo with this reason (and metadata). */
function refusal(code: Code, reason: string, metadata: Record<string, string> = {}): ConnectError {
  const writer = new BinaryWriter()
    .tag(1, WireType.LengthDelimited).string(reason)
    .tag(2, WireType.LengthDelimited).string("aaa.v1");
  for (const [key, value] of Object.entries(metadata)) {
    writer.tag(3, WireType.LengthDelimited).fork()
      .tag(1, WireType.LengthDelimited).string(key)
      .tag(2, WireType.LengthDelimited).string(value)
      .join();
  }
  const info = writer.finish();
  const err = new ConnectError("refused", code);
  err.details.push({ type: "google.rpc.ErrorInfo", value: info }); // as parsed from the trailer
  return err;
}

test("every ErrorReason of the proto has its error class", () => {
  const names = Object.keys(pb.types.ErrorReason).filter((k) => Number.isNaN(Number(k)) && k !== "ERROR_REASON_UNSPECIFIED");
  assert.ok(names.includes("STORAGE_UNAVAILABLE") && names.includes("MALFORMED_REQUEST"));
  for (const reason of names) {
    // Code.Unknown has no class of its own: only the reason can choose one.
    const err = toAaaError(refusal(Code.Unknown, reason));
    assert.notEqual(err.constructor, AaaError, `${reason} has no class`);
    assert.equal(err.reason, reason);
  }
  const storage = toAaaError(refusal(Code.Unavailable, "STORAGE_UNAVAILABLE"));
  assert.ok(storage instanceof StorageUnavailable && storage instanceof Unavailable);
  const lost = toAaaError(refusal(Code.Unavailable, "OWNERSHIP_LOST"));
  assert.ok(lost instanceof OwnershipLost && lost instanceof Unavailable);
  const noOwner = toAaaError(refusal(Code.Unavailable, "OWNER_UNAVAILABLE", { owner: "aaa-2" }));
  assert.ok(noOwner instanceof OwnerUnavailable && noOwner instanceof Unavailable);
  assert.deepEqual([noOwner.code, noOwner.name, noOwner.metadata], [Code.Unavailable, "OwnerUnavailable", { owner: "aaa-2" }]);
  const malformed = toAaaError(refusal(Code.InvalidArgument, "MALFORMED_REQUEST"));
  assert.ok(malformed instanceof MalformedRequest && malformed instanceof InvalidArgument);
  // A reason newer than the SDK gets the class of its status code.
  const newer = toAaaError(refusal(Code.NotFound, "SOMETHING_NEW"));
  assert.equal(newer.constructor, NotFound);
  assert.equal(newer.reason, "SOMETHING_NEW");
});

test("a stream closed under a call nobody cancelled is a lost connection, retried", async () => {
  // What @connectrpc/connect-node throws when the server's connection goes away under the call
  // (a killed server's HTTP/2 session closes its streams with CANCEL): code Canceled, no reason.
  const reset = () => new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled);
  let tries = 0;
  const cutOffOnce = async () => {
    tries += 1;
    if (tries < 2) throw reset();
    return "answered";
  };
  assert.equal(await client.call(cutOffOnce), "answered");
  assert.equal(tries, 2);
  tries = 0;
  const err = await failure(client.call(cutOffOnce, { retry: false }));
  assert.ok(err instanceof Unavailable, `${err}`);
  assert.equal(err.code, Code.Unavailable);
  // Cancelled by its caller, it stays Cancelled and is not tried again.
  const caller = new AbortController();
  tries = 0;
  const cancelled = await failure(
    client.call(async () => {
      tries += 1;
      caller.abort();
      throw reset();
    }, { signal: caller.signal }),
  );
  assert.ok(cancelled instanceof Cancelled && !(cancelled instanceof Unavailable), `${cancelled}`);
  assert.equal(tries, 1);
});

test("OwnerUnavailable is retried like any Unavailable", async () => {
  // A server of a cluster whose owner does not answer yet: the call is retried until it does.
  let tries = 0;
  const forwarded = async () => {
    tries += 1;
    if (tries < 3) throw refusal(Code.Unavailable, "OWNER_UNAVAILABLE", { owner: "aaa-2" });
    return "answered";
  };
  assert.equal(await client.call(forwarded), "answered");
  assert.equal(tries, 3);
  tries = 0;
  const err = await failure(client.call(forwarded, { retry: false }));
  assert.ok(err instanceof OwnerUnavailable, `${err}`);
  assert.deepEqual([tries, err.reason, err.metadata.owner], [1, "OWNER_UNAVAILABLE", "aaa-2"]);
});
