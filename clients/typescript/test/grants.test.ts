/**
 * Standing grants: a grant made in advance lets matching calls run (actor kind "grant"), counts
 * its uses, stops when used up or revoked, and refuses bad input by field.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { GrantNotFound, InvalidField, isEvent, type Client } from "../src/index.js";
import { WAIT_MS, collect, ofType, paymentSetup, setUp, uid } from "./helpers.js";

let client: Client;
let tearDown: () => Promise<void>;
before(async () => {
  ({ client, stop: tearDown } = await setUp());
});
after(() => tearDown());

test("a grant lets matching calls run until it is used up", async () => {
  const id = uid();
  const { wire, model, ran } = paymentSetup(id);
  const labels = { test: id };
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    await assert.rejects(
      client.createGrant(wire, { reason: "x", condition: "args.amount <" }),
      (err: unknown) => err instanceof InvalidField && err.field === "condition",
    );
    const grant = await client.createGrant(wire, {
      reason: "payroll day",
      labels,
      condition: "args.amount < 1000",
      expiresInS: 3600,
      maxUses: 1,
      requestId: `grant-${id}`,
    });
    assert.deepEqual([grant.active, grant.uses, grant.usesLeft, grant.scope.labels], [true, 0, 1, labels]);
    assert.deepEqual([grant.tool, grant.maxUses, grant.reason, grant.condition], [wire.name, 1, "payroll day", "args.amount < 1000"]);
    assert.ok(grant.expiresAt instanceof Date && grant.expiresAt.getTime() > Date.now());
    assert.ok(grant.createdAt instanceof Date);

    const run = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels });
    await run.result({ timeoutMs: WAIT_MS });
    assert.deepEqual(ran, [[250, "ACME"]]);
    const [granted] = ofType(await collect(run), "aaa.approval.granted");
    assert.deepEqual([granted.actor.kind, granted.actor.name], ["grant", grant.id]);
    assert.ok(isEvent(granted, "aaa.approval.granted"));
    assert.equal(granted.data.grant?.reason, "payroll day");

    // Used up: the next call waits for a person.
    assert.deepEqual((await client.listGrants({ tool: wire.name })).map((g) => g.id), []);
    const [used] = (await client.listGrants({ includeRevoked: true })).filter((g) => g.id === grant.id);
    assert.deepEqual([used.active, used.uses, used.usesLeft], [false, 1, 0]);
    // Sent again with its requestId (its answer lost): no second grant, the first as it is now.
    const again = await client.createGrant(wire, { reason: "payroll day", labels, maxUses: 1, requestId: `grant-${id}` });
    assert.deepEqual([again.id, again.uses], [grant.id, 1]);
    const second = await client.startRun("Pay ACME $250", { model: `m-${id}`, tools: [wire], labels });
    await second.waitFor("aaa.approval.requested", { timeoutMs: WAIT_MS });
    await second.cancel("done");

    const revoked = await client.revokeGrant(grant.id, { reason: "payroll is over" });
    assert.deepEqual([revoked.revokeReason, revoked.revokedAt instanceof Date, revoked.active], ["payroll is over", true, false]);
    await assert.rejects(client.revokeGrant("no-such-grant", { reason: "x" }), GrantNotFound);
  } finally {
    await worker.stop();
  }
});

test("an unlimited grant has no usesLeft and lists until revoked", async () => {
  const id = uid();
  const { wire, model } = paymentSetup(id);
  const worker = client.worker({ tools: [wire], models: { [`m-${id}`]: model } });
  await worker.start();
  try {
    await assert.rejects(
      client.createGrant(wire, { reason: "x", runId: "no-such-run" }),
      (err: unknown) => err instanceof InvalidField && err.field === "scope.run_id",
    );
    const grant = await client.createGrant(wire.name, { reason: "standing", startedBy: "nobody" });
    assert.deepEqual([grant.usesLeft, grant.maxUses, grant.expiresAt, grant.scope.startedBy], [undefined, 0, undefined, "nobody"]);
    assert.deepEqual((await client.listGrants({ tool: wire.name })).map((g) => g.id), [grant.id]);
    await client.revokeGrant(grant.id, { reason: "over" });
    assert.deepEqual(await client.listGrants({ tool: wire.name }), []);
    const [listed] = await client.listGrants({ tool: wire.name, includeRevoked: true });
    assert.deepEqual([listed.id, listed.active, listed.revokeReason], [grant.id, false, "over"]);
    await assert.rejects(
      client.createGrant(wire, { reason: "" }),
      (err: unknown) => err instanceof InvalidField && err.field === "reason",
    );
  } finally {
    await worker.stop();
  }
});
