/** Connecting to the servers of a cluster: a list of addresses, calls spread over those that answer. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Unavailable, connect, text, type Client } from "../src/index.js";
import { WAIT_MS, closedPort, setUp, startServer, type Server } from "./helpers.js";

let server: Server;
let tearDown: () => Promise<void>;
before(async () => {
  ({ server, stop: tearDown } = await setUp());
});
after(() => tearDown());

/** Starts runs and reads each back: every call would meet the closed port in turn. */
async function startAndReadBack(client: Client, times = 4): Promise<void> {
  for (let i = 0; i < times; i++) {
    const run = await client.startRun("hello", { model: [text("done")] });
    assert.equal((await client.getRun(run.id)).task, "hello");
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).text, "done");
  }
}

test("a list of addresses skips the server that is down", async () => {
  const port = server.address.slice(server.address.lastIndexOf(":") + 1);
  for (const addresses of [
    [`127.0.0.1:${await closedPort()}`, server.address],
    [`localhost:${await closedPort()}`, `localhost:${port}`],
  ]) {
    const client = await connect(addresses, { timeoutMs: WAIT_MS });
    try {
      assert.deepEqual([client.addresses, client.address], [addresses, addresses.join(",")]);
      await startAndReadBack(client);
      // Streams too.
      const run = await client.startRun("stream", { model: [text("done")] });
      const types = [];
      for await (const event of run.events({ signal: AbortSignal.timeout(WAIT_MS) })) types.push(event.type);
      assert.equal(types.at(-1), "aaa.run.completed");
    } finally {
      client.close();
    }
  }
});

test("calls are spread over the servers of the list", async () => {
  // A second server that shares nothing: each run stays where it was started, so each server's
  // list shows how many of the calls it got.
  const other = await startServer();
  try {
    const client = await connect([server.address, other.address], { timeoutMs: WAIT_MS });
    const labels = { spread: `${Date.now()}` };
    try {
      for (let i = 0; i < 10; i++) await client.startRun("hello", { model: [text("done")], labels });
    } finally {
      client.close();
    }
    const counts = [];
    for (const address of [server.address, other.address]) {
      const alone = await connect(address);
      try {
        counts.push((await alone.listRuns({ labels })).length);
      } finally {
        alone.close();
      }
    }
    // Evenly once both connections are up; the first calls may all go to the first one up.
    assert.equal(counts[0] + counts[1], 10, `${counts}`);
    assert.ok(counts[0] > 0 && counts[1] > 0, `${counts}`);
  } finally {
    await other.stop();
  }
});

test("a list of addresses none of which answers is Unavailable", async () => {
  const err = await connect([`127.0.0.1:${await closedPort()}`, `127.0.0.1:${await closedPort()}`], { timeoutMs: 300 }).then(
    () => assert.fail("connected"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof Unavailable, `${err}`);
  await assert.rejects(connect([]), TypeError);
});
