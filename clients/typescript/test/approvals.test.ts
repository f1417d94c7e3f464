/**
 * Approvals: granted from another client while a third watches, denied, cancelled, expired; duplicates harmless;
 * a watch resumes with its resume token, also across a server restart.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { rmSync } from "node:fs";
import { connect, text, tool, toolCall, type ApprovalWatchItem, type Client, type Run } from "../src/index.js";
import { WAIT_MS, collect, next, ofType, paymentSetup, setUp, startServer, uid, type Server } from "./helpers.js";

let server: Server;
let client: Client;
let tearDown: () => Promise<void>;
before(async () => {
  ({ server, client, stop: tearDown } = await setUp());
});
after(() => tearDown());

test("a second client approves while a third watches", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const labels = { test: id };
  const approver = await connect(server.address);
  const watcher = await connect(server.address);
  const watch = watcher.approvals.watch({ labels });
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  try {
    const snapshot = await next(watch);
    assert.equal(snapshot.kind, "snapshot_complete");
    assert.equal(snapshot.kind === "snapshot_complete" && snapshot.pending, 0);

    await worker.start();
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels });

    const requested = await next(watch);
    assert.ok(requested.kind === "requested");
    const approval = requested.approval;
    assert.equal(requested.snapshot, false);
    assert.deepEqual([approval.runId, approval.tool, approval.labels], [run.id, wire.name, labels]);
    assert.equal(approval.task, "Pay ACME $250");
    assert.deepEqual(approval.arguments, { amount: 250, to: "ACME" });
    assert.equal(approval.argumentsJson, '{"amount":250,"to":"ACME"}');

    const listed = await approver.approvals.list({ labels });
    assert.deepEqual(listed.map((a) => [a.runId, a.callId]), [[run.id, approval.callId]]);
    const info = await approver.getRun(run.id);
    assert.equal(info.status, "waiting_for_approval");
    assert.deepEqual(info.pendingApprovals.map((a) => a.callId), [approval.callId]);
    assert.deepEqual(ran, []);

    const granted = await approver
      .run(run.id)
      .approve(approval.callId, { argumentsSha256: approval.argumentsSha256, comment: "ok by test" });
    assert.deepEqual([granted.alreadyDecided, granted.decision], [false, "aaa.approval.granted"]);
    assert.ok(granted.seq > approval.seq);

    const resolved = await next(watch);
    assert.ok(resolved.kind === "resolved");
    assert.deepEqual(
      [resolved.resolution.runId, resolved.resolution.callId, resolved.resolution.outcome, resolved.resolution.reason],
      [run.id, approval.callId, "granted", "ok by test"],
    );

    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.ok(outcome.ok);
    assert.equal(outcome.text, "sent $250 to ACME");
    assert.deepEqual(outcome.value, { text: "sent $250 to ACME" });
    await worker.stop();

    // Duplicates are harmless, also once the run has finished.
    const again = await approver.run(run.id).approve(approval.callId);
    assert.deepEqual([again.alreadyDecided, again.decision, again.seq], [true, "aaa.approval.granted", 0]);
    const lateDeny = await approver.run(run.id).deny(approval.callId, "too late");
    assert.deepEqual([lateDeny.alreadyDecided, lateDeny.decision], [true, "aaa.approval.granted"]);
    assert.deepEqual(ran, [[250, "ACME"]]);
    assert.deepEqual(await approver.approvals.list({ labels }), []);
    assert.equal((await approver.getRun(run.id)).status, "completed");

    // Resuming the watch from the snapshot's position replays the changes since.
    const resumed = watcher.approvals.watch({ labels, afterPosition: snapshot.position });
    try {
      const first = await next(resumed);
      const second = await next(resumed);
      assert.ok(first.kind === "requested" && first.approval.callId === approval.callId && !first.snapshot);
      assert.ok(second.kind === "resolved" && second.position === resolved.position);
    } finally {
      await resumed.return();
    }
  } finally {
    await worker.stop();
    await watch.return();
    approver.close();
    watcher.close();
  }
});

test("a watch started while a request waits lists it in its snapshot", async () => {
  const id = uid();
  const { wire, model } = paymentSetup(id);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels: { test: id } });
    const request = await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    const watch = client.approvals.watch({ labels: { test: id } });
    try {
      const first = await next(watch);
      assert.ok(first.kind === "requested" && first.snapshot);
      assert.deepEqual([first.approval.runId, first.approval.callId], [run.id, request.data.call_id]);
      assert.equal(first.approval.seq, request.seq);
      const complete = await next(watch);
      assert.ok(complete.kind === "snapshot_complete" && complete.pending === 1);
      await run.deny(request.data.call_id, "no");
      const resolved = await next(watch);
      assert.ok(resolved.kind === "resolved" && resolved.resolution.outcome === "denied");
      assert.equal(resolved.resolution.reason, "no");
    } finally {
      await watch.return();
    }
    await run.result({ timeoutMs: WAIT_MS });
  } finally {
    await worker.stop();
  }
});

test("a denied call never runs and the model reads why", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire] });
    const request = await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    const denied = await run.deny(request.data.call_id, "over the limit");
    assert.deepEqual([denied.alreadyDecided, denied.decision], [false, "aaa.approval.denied"]);
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.text, "refused: ApprovalDenied: over the limit");
    assert.deepEqual(ran, []);
    const events = await collect(run);
    assert.deepEqual(ofType(events, "aaa.tool.started"), []);
    const failed = ofType(events, "aaa.tool.failed");
    assert.deepEqual(failed.map((e) => e.data.error), [{ type: "ApprovalDenied", message: "over the limit" }]);
    assert.equal(failed[0].data.call_id, request.data.call_id);
    // A grant after the denial changes nothing.
    const late = await run.approve(request.data.call_id);
    assert.deepEqual([late.alreadyDecided, late.decision], [true, "aaa.approval.denied"]);
  } finally {
    await worker.stop();
  }
});

test("cancelling a run expires its pending approval", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels: { test: id } });
    const request = await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    assert.ok((await run.cancel("changed my mind")) > 0);
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.status, "cancelled");
    assert.deepEqual(outcome.error, { type: "Cancelled", message: "changed my mind" });
    const expired = ofType(await collect(run), "aaa.approval.expired");
    assert.deepEqual(expired.map((e) => e.data.call_id), [request.data.call_id]);
    assert.deepEqual(await client.approvals.list({ labels: { test: id } }), []);
    const late = await run.approve(request.data.call_id);
    assert.deepEqual([late.alreadyDecided, late.decision], [true, "aaa.approval.expired"]);
    assert.deepEqual(ran, []);
    const runs = await client.listRuns({ labels: { test: id } });
    assert.deepEqual(runs.map((r) => [r.runId, r.status]), [[run.id, "cancelled"]]);
    assert.deepEqual(await client.listRuns({ labels: { test: id }, status: "completed" }), []);
  } finally {
    await worker.stop();
  }
});

test("a run's deadline expires its pending approval", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], budget: { deadlineS: 1 } });
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.status, "failed");
    assert.equal(outcome.error?.type, "DeadlineExceeded");
    const expired = ofType(await collect(run), "aaa.approval.expired");
    assert.deepEqual(expired.map((e) => e.data.reason), ["deadline"]);
    assert.deepEqual(ran, []);
  } finally {
    await worker.stop();
  }
});

test("an approval timeout becomes a denial", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    const run = await client.startRun("Pay ACME $250", {
      model: `m-${id}`,
      tools: [{ name: wire.name, approvalTimeoutS: 0.5 }],
    });
    const outcome = await run.result({ timeoutMs: WAIT_MS });
    assert.equal(outcome.text, "refused: ApprovalDenied: timeout");
    assert.deepEqual(ran, []);
  } finally {
    await worker.stop();
  }
});

test("listRuns pages through every run, newest first", async () => {
  const id = uid();
  const ids: string[] = [];
  for (let i = 0; i < 5; i++) {
    const run = await client.startRun(`run ${i}`, { model: [text(`done ${i}`)], labels: { test: id } });
    await run.result({ timeoutMs: WAIT_MS });
    ids.push(run.id);
  }
  const all = await client.listRuns({ labels: { test: id } });
  assert.deepEqual(all.map((r) => r.runId), [...ids].reverse());
  assert.deepEqual(all.map((r) => r.result), [4, 3, 2, 1, 0].map((i) => ({ text: `done ${i}` })));
  const paged = await client.listRuns({ labels: { test: id }, pageSize: 2 });
  assert.deepEqual(paged.map((r) => r.runId), [...ids].reverse());
  const limited = await client.listRuns({ labels: { test: id }, limit: 3, pageSize: 2 });
  assert.deepEqual(limited.map((r) => r.runId), [...ids].reverse().slice(0, 3));
});

/** A gated tool (a worker must offer it for a run to ask for it). */
function gatedWire(id: string) {
  return tool({
    name: `wire_${id}`,
    requiresApproval: true,
    handler: ({ amount }: { amount: number }) => `sent $${amount}`,
  });
}

/** A run that asks to call `wire` (offered by a worker for the while) and waits for the decision. */
async function requestApproval(
  client: Client,
  wire: ReturnType<typeof gatedWire>,
  labels: Record<string, string>,
  amount: number,
): Promise<Run> {
  const worker = client.worker({ tools: [wire] });
  await worker.start();
  try {
    const run = await client.startRun("pay", { model: [toolCall(wire, { amount }), text("done")], tools: [wire], labels });
    await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    return run;
  } finally {
    await worker.stop();
  }
}

/** What a watch item says, without its resume token (a resumed stream may encode the same place differently). */
function change(item: ApprovalWatchItem): [string, string, number] {
  switch (item.kind) {
    case "requested":
      return [item.kind, item.approval.runId, item.position];
    case "voted":
      return [item.kind, item.voted.runId, item.position];
    case "resolved":
      return [item.kind, item.resolution.runId, item.position];
    case "snapshot_complete":
      return [item.kind, "", item.position];
  }
}

test("a watch resumed with a token gets exactly the changes after it", async () => {
  const id = uid();
  const wire = gatedWire(id);
  const labels = { test: id };
  const watch = client.approvals.watch({ labels });
  let snapshot: ApprovalWatchItem;
  const changes: ApprovalWatchItem[] = [];
  try {
    snapshot = await next(watch);
    assert.ok(snapshot.kind === "snapshot_complete" && snapshot.resumeToken, "the snapshot's end carries a resume token");
    const first = await requestApproval(client, wire, labels, 1);
    const second = await requestApproval(client, wire, labels, 2);
    await first.cancel("no");
    await second.cancel("no");
    for (let i = 0; i < 4; i++) changes.push(await next(watch));
  } finally {
    await watch.return();
  }
  assert.deepEqual(changes.map((c) => c.kind), ["requested", "requested", "resolved", "resolved"]);
  assert.ok(changes.every((c) => c.resumeToken), "every change carries a resume token");

  // From the snapshot's token and from each change's: exactly the changes after it, in order.
  const marks = [snapshot.resumeToken, ...changes.map((c) => c.resumeToken)];
  for (let k = 0; k < marks.length; k++) {
    const resumed = client.approvals.watch({ labels, resumeToken: marks[k] });
    try {
      const got: ApprovalWatchItem[] = [];
      for (let i = k; i < changes.length; i++) got.push(await next(resumed));
      assert.deepEqual(got.map(change), changes.slice(k).map(change));
      // Nothing repeated after them: the next item is a new change.
      const third = await requestApproval(client, wire, labels, 3 + k);
      const requested = await next(resumed);
      assert.ok(requested.kind === "requested" && requested.approval.runId === third.id, "the next item is the new request");
      await third.cancel("no");
      const resolved = await next(resumed);
      assert.ok(resolved.kind === "resolved" && resolved.resolution.runId === third.id, "then its resolution");
      // This round's changes come after every token: the later rounds get them too.
      changes.push(requested, resolved);
    } finally {
      await resumed.return();
    }
  }
});

test("a watch resumes with its last token across a server restart", async () => {
  const id = uid();
  const wire = gatedWire(id);
  const labels = { test: id };
  const first = await startServer({ keep: true });
  const dir = first.dir;
  let second: Server | undefined;
  const watcher = await connect(first.address);
  const starter = await connect(first.address);
  // Records each WatchApprovals request the watcher sends.
  const services = watcher.services.approval;
  const real = services.watchApprovals.bind(services);
  const sent: Parameters<typeof real>[0][] = [];
  services.watchApprovals = (request, options) => {
    sent.push({ ...request });
    return real(request, options);
  };
  const watch = watcher.approvals.watch({ labels });
  try {
    const snapshot = await next(watch);
    const one = await requestApproval(starter, wire, labels, 1);
    const two = await requestApproval(starter, wire, labels, 2);
    const requested = [await next(watch), await next(watch)];
    assert.deepEqual(requested.map(change).map(([kind, runId]) => [kind, runId]), [["requested", one.id], ["requested", two.id]]);
    await one.cancel("no");
    const resolved = await next(watch);
    assert.ok(resolved.kind === "resolved" && resolved.resolution.runId === one.id && resolved.resumeToken, "the resolution carries a resume token");

    await first.stop(); // SIGTERM: the stream ends with UNAVAILABLE
    second = await startServer({ listen: first.address, dir });
    await two.cancel("no");
    // Only the change made while the stream was down: none of the earlier ones again.
    const afterRestart = await next(watch);
    assert.ok(afterRestart.kind === "resolved" && afterRestart.resolution.runId === two.id, "after the restart only the new change comes");

    // The first stream started with a snapshot; each try after it (some may have found the
    // server down) resumed with the token of the last item seen.
    const [opening, ...retries] = sent;
    assert.deepEqual([opening.resumeToken, opening.afterPosition], [undefined, undefined]);
    assert.ok(retries.length > 0, "the watch tried again");
    for (const retry of retries) {
      assert.deepEqual([retry.resumeToken, retry.afterPosition], [resolved.resumeToken, undefined]);
    }
    assert.notEqual(snapshot.resumeToken, resolved.resumeToken);
  } finally {
    await watch.return();
    watcher.close();
    starter.close();
    await first.stop();
    await second?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
