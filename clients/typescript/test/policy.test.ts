/**
 * Approver groups and the approval policy: a server with an auth config whose principals have
 * groups, and a policy file (`--policy`). A tool's `approvers` decide who may decide its calls; a
 * policy rule may grant a call itself (actor kind "policy"); the policy can be read and reloaded.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import {
  AaaError,
  InvalidField,
  NotAnApproverForCall,
  PermissionDenied,
  connect,
  echo,
  tool,
  toolCall,
  type Client,
} from "../src/index.js";
import { WAIT_MS, collect, next, ofType, setUp, startServer, uid, type Server } from "./helpers.js";

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

// Tool names are fixed: the policy file names them.
const POLICY = `
[[rule]]
name = "small-refunds"
when = 'tool == "refund" && args.amount < 100'
decide = "allow"
`;

/** [name, roles, groups]: admin serves the tools and starts the runs; alice is a finance approver, carol an approver in no group. */
const PRINCIPALS: [string, string[], string[]][] = [
  ["admin", ["admin"], []],
  ["alice", ["approver"], ["finance"]],
  ["carol", ["approver"], []],
];

/** A server with auth (token NAME-token for each principal) and DIR/policy.toml. */
async function startPolicyServer(): Promise<{ server: Server; dir: string }> {
  const dir = mkdtempSync(path.join(tmpdir(), "aaa-ts-policy-"));
  const list = (items: string[]) => JSON.stringify(items); // a TOML array of strings is JSON too
  const auth = PRINCIPALS.map(
    ([name, roles, groups]) =>
      `[[principal]]\nname = "${name}"\nroles = ${list(roles)}\ngroups = ${list(groups)}\ntoken_sha256 = "${sha256(`${name}-token`)}"\n`,
  ).join("\n");
  writeFileSync(path.join(dir, "auth.toml"), auth);
  writeFileSync(path.join(dir, "policy.toml"), POLICY);
  const server = await startServer({
    args: ["--auth-config", path.join(dir, "auth.toml"), "--policy", path.join(dir, "policy.toml")],
  });
  return { server, dir };
}

const cleanups: (() => Promise<void> | void)[] = [];
let server: Server;
let admin: Client;
let alice: Client;
let carol: Client;

async function connectAs(to: Server, name: string): Promise<Client> {
  const client = await connect(to.address, { token: `${name}-token` });
  cleanups.push(() => client.close());
  return client;
}

before(async () => {
  const started = await startPolicyServer();
  server = started.server;
  cleanups.push(() => rmSync(started.dir, { recursive: true, force: true }), () => server.stop());
  [admin, alice, carol] = await Promise.all(["admin", "alice", "carol"].map((name) => connectAs(server, name)));
});

after(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

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

const pay = tool({
  name: "pay",
  description: "Pay; only finance may decide.",
  requiresApproval: true,
  approvers: ["finance"],
  handler: ({ amount }: { amount: number }) => `paid ${amount}`,
});
const lookup = tool({
  name: "lookup",
  description: "Read a key; any approver may decide.",
  requiresApproval: true,
  handler: ({ key }: { key: string }) => `value of ${key}`,
});
const refund = tool({
  name: "refund",
  description: "Refund; the policy allows small ones.",
  requiresApproval: true,
  handler: ({ amount }: { amount: number }) => `refunded ${amount}`,
});

test("approvers go into the tool's definition", () => {
  assert.deepEqual(pay.definition().approvers, ["finance"]);
  assert.deepEqual(lookup.definition().approvers, []);
});

test("only the approver groups of a tool decide its calls", async () => {
  const labels = { test: uid() };
  const worker = admin.worker({ tools: [pay, lookup] });
  await worker.start();
  try {
    const paying = await admin.startRun("pay", { model: [toolCall(pay, { amount: 5 }), echo()], tools: [pay], labels });
    const looking = await admin.startRun("look", { model: [toolCall(lookup, { key: "motd" }), echo()], tools: [lookup], labels });
    for (const run of [paying, looking]) await run.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });

    // Everyone sees both; decidable keeps those the caller may decide.
    const shown = Object.fromEntries((await carol.approvals.list({ labels })).map((a) => [a.tool, a]));
    assert.deepEqual([shown.pay.approvers, shown.lookup.approvers], [["finance"], []]);
    assert.deepEqual((await carol.approvals.list({ labels, decidable: true })).map((a) => a.tool), ["lookup"]);
    assert.deepEqual((await alice.approvals.list({ labels, decidable: true })).map((a) => a.tool).sort(), ["lookup", "pay"]);
    const watch = carol.approvals.watch({ labels, decidable: true });
    try {
      const first = await next(watch);
      assert.ok(first.kind === "requested" && first.approval.tool === "lookup", JSON.stringify(first));
      const snapshot = await next(watch);
      assert.ok(snapshot.kind === "snapshot_complete" && snapshot.pending === 1, JSON.stringify(snapshot));
    } finally {
      await watch.return();
    }

    // Carol is not in finance: refused, alone or in a batch.
    const payment = shown.pay;
    const refused = await failure(carol.run(paying.id).approve(payment.callId, { argumentsSha256: payment.argumentsSha256 }));
    assert.ok(refused instanceof NotAnApproverForCall && refused instanceof PermissionDenied, `${refused}`);
    assert.equal(refused.reason, "NOT_AN_APPROVER_FOR_CALL");
    assert.deepEqual([refused.groups, refused.metadata.call_id], [["finance"], payment.callId]);
    assert.ok((await failure(carol.run(paying.id).edit(payment.callId, { amount: 4 }))) instanceof NotAnApproverForCall);
    const [result] = await carol.decideApprovals([payment], { decision: "grant" });
    assert.deepEqual([result.status, result.errorReason], ["refused", "NOT_AN_APPROVER_FOR_CALL"]);

    // Alice is: her grant runs the call; carol may grant the call that names no group.
    const granted = await alice.run(paying.id).approve(payment.callId, { argumentsSha256: payment.argumentsSha256 });
    assert.deepEqual([granted.decision, granted.alreadyDecided], ["aaa.approval.granted", false]);
    await carol.run(looking.id).approve(shown.lookup.callId);
    assert.equal((await paying.result({ timeoutMs: WAIT_MS })).text, "paid 5");
    assert.equal((await looking.result({ timeoutMs: WAIT_MS })).text, "value of motd");
  } finally {
    await worker.stop();
  }
});

test("a policy rule grants a call, as actor kind policy", async () => {
  const worker = admin.worker({ tools: [refund] });
  await worker.start();
  try {
    const run = await admin.startRun("refund", { model: [toolCall(refund, { amount: 50 }), echo()], tools: [refund] });
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "refunded 50");
    const events = await collect(run);
    assert.deepEqual(ofType(events, "aaa.approval.requested"), []);
    const [granted] = ofType(events, "aaa.approval.granted");
    assert.deepEqual(granted.actor, { kind: "policy", name: "small-refunds", principal: "" });
    assert.deepEqual(granted.data.policy, { rule: "small-refunds", sha256: sha256(POLICY) });
  } finally {
    await worker.stop();
  }
});

test("getPolicy describes the policy; reloadPolicy reads the file again, and a bad file changes nothing", async () => {
  // A server of its own: this test changes its policy file.
  const { server: own, dir } = await startPolicyServer();
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }), () => own.stop());
  const file = path.join(dir, "policy.toml");
  const [ownAdmin, ownCarol] = [await connectAs(own, "admin"), await connectAs(own, "carol")];

  const policy = await ownCarol.getPolicy();
  assert.deepEqual(policy, { loaded: true, sha256: sha256(POLICY), rules: ["small-refunds"], file });
  assert.ok((await failure(ownCarol.reloadPolicy())) instanceof PermissionDenied);

  // A file that does not check is refused; the policy in force stays.
  writeFileSync(file, `[[rule]]\nname = "r"\nwhen = 'amount > 1'\ndecide = "allow"\n`);
  const refused = await failure(ownAdmin.reloadPolicy());
  assert.ok(refused instanceof InvalidField, `${refused}`);
  assert.match(refused.message, /rule 1 \('r'\)/);
  assert.equal((await ownCarol.getPolicy()).sha256, policy.sha256);

  const changed = `[[rule]]\nname = "refunds"\nwhen = 'tool == "refund"'\ndecide = "allow"\n`;
  writeFileSync(file, changed);
  const reloaded = await ownAdmin.reloadPolicy();
  assert.deepEqual([reloaded.loaded, reloaded.sha256, reloaded.rules], [true, sha256(changed), ["refunds"]]);
  assert.deepEqual(await ownCarol.getPolicy(), reloaded);
});

test("a server without a policy says so, and refuses a reload", async () => {
  const { client, stop } = await setUp();
  try {
    assert.deepEqual(await client.getPolicy(), { loaded: false, sha256: "", rules: [], file: "" });
    assert.ok((await failure(client.reloadPolicy())) instanceof InvalidField);
  } finally {
    await stop();
  }
});
