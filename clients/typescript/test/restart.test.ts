/** A server restart: the waiting run survives, and the SDK's streams, calls and worker carry on by themselves. */

import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { test } from "node:test";
import { connect, echo, tool, toolCall, type Event } from "../src/index.js";
import { WAIT_MS, next, startServer, uid, within } from "./helpers.js";

test("a run waiting for approval survives a server restart, and its followers resume", async () => {
  const first = await startServer({ keep: true });
  const dir = first.dir;
  let second: Awaited<ReturnType<typeof startServer>> | undefined;
  const client = await connect(first.address);
  const ran: number[] = [];
  const double = tool({
    name: `double_${uid()}`,
    requiresApproval: true,
    handler: ({ x }: { x: number }) => {
      ran.push(x);
      return 2 * x;
    },
  });
  const quiet = { info: () => {}, warn: () => {} }; // polls fail while the server is down
  const worker = client.worker({ tools: [double], logger: quiet });
  await worker.start();
  try {
    const run = await client.startRun("double 21", { model: [toolCall(double, { x: 21 }), echo()], tools: [double] });
    const stream = run.events();
    const seen: Event[] = [];
    while (seen.length === 0 || seen[seen.length - 1].type !== "aaa.approval.requested") seen.push(await next(stream));
    const pending = next(stream); // waits across the restart

    await first.stop(); // SIGTERM: graceful; streams and polls end with UNAVAILABLE
    second = await startServer({ listen: first.address, dir });
    assert.equal(second.address, first.address);

    const [approval] = await client.approvals.list({ runId: run.id });
    assert.equal(approval.callId, seen[seen.length - 1].data.call_id);
    await run.approve(approval.callId);
    seen.push(await pending);
    for (;;) {
      const item = await within(stream.next(), WAIT_MS, "the stream");
      if (item.done) break;
      seen.push(item.value);
    }
    const seqs = seen.map((e) => e.seq);
    assert.deepEqual(seqs, seqs.map((_, i) => i + 1));
    assert.equal(seen[seen.length - 1].type, "aaa.run.completed");
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "42");
    assert.deepEqual(ran, [21]);
  } finally {
    await worker.stop();
    client.close();
    await first.stop();
    await second?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
