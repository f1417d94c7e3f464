/** Decisions beyond a single grant or denial: edits, calls that need several approvers, batches, races. */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, test } from "node:test";
import {
  AaaError,
  AlreadyVoted,
  ArgumentsMismatch,
  FailedPrecondition,
  InvalidArgument,
  InvalidField,
  connect,
  type Client,
} from "../src/index.js";
import { WAIT_MS, collect, next, ofType, paymentSetup, setUp, uid, type Server } from "./helpers.js";

let server: Server;
let client: Client;
let tearDown: () => Promise<void>;
before(async () => {
  ({ server, client, stop: tearDown } = await setUp());
});
after(() => tearDown());

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

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

test("an edited call runs with the new arguments once they are granted, and the model reads the edit", async () => {
  const id = uid();
  const { wire, model, ran, toolMessages } = paymentSetup(id);
  const labels = { test: id };
  const watch = client.approvals.watch({ labels });
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  try {
    assert.equal((await next(watch)).kind, "snapshot_complete");
    await worker.start();
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels });
    const requested = await next(watch);
    assert.ok(requested.kind === "requested");
    const original = requested.approval;
    assert.deepEqual([original.approvalsRequired, original.votes, original.editedFrom], [1, [], ""]);

    // Refused edits record nothing: arguments the schema does not allow, or those requested.
    const misfit = await failure(run.edit(original.callId, { amount: "lots", to: "ACME" }));
    assert.ok(misfit instanceof InvalidField && misfit.field === "data_json.arguments", `${misfit}`);
    const same = await failure(run.edit(original.callId, original.arguments));
    assert.ok(same instanceof InvalidField && same.field === "data_json.arguments", `${same}`);

    const edited = await run.edit(
      original.callId,
      { amount: 200, to: "ACME" },
      { argumentsSha256: original.argumentsSha256, reason: "over budget" },
    );
    assert.deepEqual([edited.decision, edited.alreadyDecided, edited.votes], ["aaa.approval.edited", false, 0]);
    assert.ok(edited.newCallId !== "" && edited.newCallId !== original.callId);
    assert.equal(edited.newArgumentsSha256, sha256('{"amount":200,"to":"ACME"}'));

    // Watchers see the old call resolved as edited, then the new call requested in its place.
    const resolved = await next(watch);
    assert.ok(resolved.kind === "resolved");
    assert.deepEqual(
      [resolved.resolution.callId, resolved.resolution.outcome, resolved.resolution.replacedBy],
      [original.callId, "edited", edited.newCallId],
    );
    const replacement = await next(watch);
    assert.ok(replacement.kind === "requested");
    const { callId, editedFrom, arguments: args, argumentsSha256 } = replacement.approval;
    assert.deepEqual(
      [callId, editedFrom, args, argumentsSha256],
      [edited.newCallId, original.callId, { amount: 200, to: "ACME" }, edited.newArgumentsSha256],
    );
    assert.deepEqual(ran, []);

    // The old call is decided for good; the new call's grant is bound to the new digest.
    const late = await run.approve(original.callId);
    assert.deepEqual([late.alreadyDecided, late.decision], [true, "aaa.approval.edited"]);
    const reEdit = await run.edit(original.callId, { amount: 1, to: "ACME" });
    assert.deepEqual([reEdit.alreadyDecided, reEdit.decision, reEdit.seq], [true, "aaa.approval.edited", 0]);
    const stale = await failure(run.approve(edited.newCallId, { argumentsSha256: original.argumentsSha256 }));
    assert.ok(stale instanceof ArgumentsMismatch, `${stale}`);
    const granted = await run.approve(edited.newCallId, { argumentsSha256: edited.newArgumentsSha256 });
    assert.deepEqual([granted.alreadyDecided, granted.decision], [false, "aaa.approval.granted"]);

    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.deepEqual(ran, [[200, "ACME"]]);
    // The model reads the result under the call id it gave, after a note of the edit.
    const message = toolMessages[toolMessages.length - 1];
    assert.equal(message.callId, original.callId);
    assert.match(message.content, /reviewer changed the arguments to \{"amount":200,"to":"ACME"\} \(reason: over budget\)/);
    assert.ok(message.content.endsWith("sent $200 to ACME"), message.content);
    assert.equal(outcome.text, message.content);

    const editEvents = ofType(await collect(run), "aaa.approval.edited");
    assert.deepEqual(
      editEvents.map((e) => [e.data.call_id, e.data.new_call_id, e.data.reason]),
      [[original.callId, edited.newCallId, "over budget"]],
    );
  } finally {
    await worker.stop();
    await watch.return();
  }
});

test("an edit with grant runs the edited call at once", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire] });
    const request = await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    const edited = await run.edit(request.data.call_id, { amount: 100, to: "ACME" }, { grant: true });
    assert.deepEqual([edited.decision, edited.votes, edited.approvalsRequired], ["aaa.approval.edited", 1, 1]);
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.deepEqual(ran, [[100, "ACME"]]);
    assert.ok(outcome.text.endsWith("sent $100 to ACME"), outcome.text);
  } finally {
    await worker.stop();
  }
});

test("a call that needs two approvers runs at the second grant; the same approver cannot vote twice", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id, { approvalsRequired: 2 });
  const labels = { test: id };
  const watch = client.approvals.watch({ labels });
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  try {
    assert.equal((await next(watch)).kind, "snapshot_complete");
    await worker.start();
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels });
    const requested = await next(watch);
    assert.ok(requested.kind === "requested");
    const { callId, argumentsSha256, approvalsRequired, votes } = requested.approval;
    assert.deepEqual([approvalsRequired, votes], [2, []]);

    const first = await run.approve(callId, { argumentsSha256, approver: "alice", comment: "looks right" });
    assert.deepEqual(
      [first.decision, first.alreadyDecided, first.votes, first.approvalsRequired],
      ["aaa.approval.voted", false, 1, 2],
    );
    const voted = await next(watch);
    assert.ok(voted.kind === "voted");
    const { vote, ...counts } = voted.voted;
    assert.deepEqual([vote.approver, vote.comment], ["alice", "looks right"]);
    assert.deepEqual(counts, { runId: run.id, callId, tool: wire.name, votes: 1, approvalsRequired: 2, seq: first.seq });
    const [pending] = await client.approvals.list({ labels });
    assert.deepEqual(pending.votes.map((v) => [v.approver, v.comment]), [["alice", "looks right"]]);
    assert.ok(pending.votes[0].time instanceof Date);

    const twice = await failure(run.approve(callId, { approver: "alice" }));
    assert.ok(twice instanceof AlreadyVoted && twice instanceof FailedPrecondition, `${twice}`);
    assert.deepEqual([twice.reason, twice.metadata.approver, twice.metadata.call_id], ["ALREADY_VOTED", "alice", callId]);
    const [again] = await client.decideApprovals([requested.approval], { decision: "grant", approver: "alice" });
    assert.deepEqual([again.status, again.errorReason, again.seq], ["already_decided", "ALREADY_VOTED", 0]);
    assert.deepEqual(ran, []);

    const second = await run.approve(callId, { argumentsSha256, approver: "bob" });
    assert.deepEqual([second.decision, second.votes, second.approvalsRequired], ["aaa.approval.granted", 2, 2]);
    const resolved = await next(watch);
    assert.ok(resolved.kind === "resolved" && resolved.resolution.outcome === "granted");

    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.text, "sent $250 to ACME");
    assert.deepEqual(ran, [[250, "ACME"]]);
    const grants = ofType(await collect(run), "aaa.approval.granted");
    assert.deepEqual(grants.map((e) => e.data.approvers), [["alice", "bob"]]);
  } finally {
    await worker.stop();
    await watch.return();
  }
});

test("a run can raise the approvers a tool needs, and one denial denies", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [{ name: wire.name, approvalsRequired: 3 }] });
    const request = await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    assert.equal(request.data.approvals_required, 3);
    const [pending] = (await run.get()).pendingApprovals;
    assert.equal(pending.approvalsRequired, 3);
    const first = await run.approve(request.data.call_id, { approver: "alice" });
    assert.deepEqual([first.decision, first.votes, first.approvalsRequired], ["aaa.approval.voted", 1, 3]);
    const denied = await run.deny(request.data.call_id, "not this one", { approver: "bob" });
    assert.deepEqual([denied.alreadyDecided, denied.decision], [false, "aaa.approval.denied"]);
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.text, "refused: ApprovalDenied: not this one");
    assert.deepEqual(ran, []);
  } finally {
    await worker.stop();
  }
});

test("decide grants and denies a batch, each item bound to the digest shown", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const labels = { test: id };
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const runs = [];
    for (let i = 0; i < 3; i++) {
      const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels });
      await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
      runs.push(run);
    }
    const listed = await client.approvals.list({ labels });
    const [a, b, c] = runs.map((run) => listed.find((approval) => approval.runId === run.id)!);
    const wrong = "0".repeat(64);

    const batch = [a, { ...b, argumentsSha256: wrong }];
    const options = { decision: "grant", comment: "batch ok", requestId: `batch-${id}` } as const;
    const first = await client.decideApprovals(batch, options);
    // A retry with the request id (its reply lost) gets the first reply again.
    const again = await client.decideApprovals(batch, options);
    assert.deepEqual(again, first);
    assert.deepEqual(
      first.map((r) => [r.runId, r.callId, r.status]),
      [
        [a.runId, a.callId, "decided"],
        [b.runId, b.callId, "mismatch"],
      ],
    );
    assert.equal(first[0].decision, "aaa.approval.granted");
    assert.ok(first[0].seq > 0);
    assert.deepEqual([first[1].seq, first[1].errorReason], [0, "ARGUMENTS_MISMATCH"]);

    // All or nothing: b would be decided, c would not, so neither is.
    const held = await client.decideApprovals([b, { ...c, argumentsSha256: wrong }], {
      decision: "deny",
      reason: "no",
      allOrNothing: true,
    });
    assert.deepEqual(held.map((r) => [r.status, r.seq]), [["not_applied", 0], ["mismatch", 0]]);
    assert.deepEqual(
      (await client.approvals.list({ labels })).map((p) => p.callId).sort(),
      [b.callId, c.callId].sort(),
    );

    const denied = await client.decideApprovals([b, c, a], { decision: "deny", reason: "not today" });
    assert.deepEqual(
      denied.map((r) => [r.status, r.decision]),
      [
        ["decided", "aaa.approval.denied"],
        ["decided", "aaa.approval.denied"],
        ["already_decided", "aaa.approval.granted"],
      ],
    );
    const texts = await Promise.all(runs.map(async (run) => (await run.result({ timeoutMs: WAIT_MS })).text));
    assert.deepEqual(texts, ["sent $250 to ACME", "refused: ApprovalDenied: not today", "refused: ApprovalDenied: not today"]);
    assert.deepEqual(ran, [[250, "ACME"]]);

    // A batch naming no call, or one call twice, is refused whole.
    assert.ok((await failure(client.decideApprovals([], { decision: "grant" }))) instanceof InvalidArgument);
    assert.ok((await failure(client.decideApprovals([a, a], { decision: "grant" }))) instanceof InvalidArgument);
  } finally {
    await worker.stop();
  }
});

test("two grants at once: one decides, the other finds the call decided", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const other = await connect(server.address);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire] });
    const request = await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    const callId = request.data.call_id;
    const results = await Promise.all([
      run.approve(callId, { approver: "alice" }),
      other.run(run.id).approve(callId, { approver: "bob" }),
    ]);
    assert.deepEqual(results.map((r) => r.alreadyDecided).sort(), [false, true]);
    assert.deepEqual(results.map((r) => r.decision), ["aaa.approval.granted", "aaa.approval.granted"]);
    await run.result({ timeoutMs: WAIT_MS });
    assert.deepEqual(ran, [[250, "ACME"]]);
    assert.equal(ofType(await collect(run), "aaa.approval.granted").length, 1);
  } finally {
    await worker.stop();
    other.close();
  }
});
