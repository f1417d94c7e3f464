/**
 * A worker process for worker.test.ts: serves a tool whose attempts never
 * finish, until it is killed.
 *
 * Usage: node --import tsx test/doomed-worker.ts TOOL_NAME   (server address in env AAA_SERVER)
 * Prints "ready" once registered and polling, and "started ATTEMPT" when a call starts.
 */

import { connect, tool } from "../src/index.js";

const flaky = tool({
  name: process.argv[2],
  retries: 1,
  retryBackoffS: 0.1,
  heartbeatTimeoutS: 1,
  handler: async (_args, task) => {
    console.log("started", task.attempt);
    await new Promise(() => {}); // hangs until the process is killed
  },
});

const client = await connect(process.env.AAA_SERVER);
await client.worker({ tools: [flaky], identity: "doomed" }).start();
console.log("ready");
