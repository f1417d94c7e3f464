/**
 * A run and its worker in a process where `@opentelemetry/api` cannot be
 * imported, as when the optional peer dependency is not installed: for
 * tracing.test.ts.
 *
 * Usage: node --import HOOK --import tsx test/untraced-run.ts TOOL_NAME   (server address in env AAA_SERVER)
 * Prints the run's text and the task's traceparent, then exits.
 */

import { connect, echo, tool, toolCall } from "../src/index.js";

let traceparent = "";
const wireMoney = tool({
  name: process.argv[2],
  handler: ({ amount }: { amount: number }, task) => {
    traceparent = task.traceparent;
    return amount;
  },
});

const client = await connect(process.env.AAA_SERVER);
const worker = client.worker({ tools: [wireMoney] });
await worker.start();
const run = await client.startRun("pay", { model: [toolCall(wireMoney, { amount: 5 }), echo()], tools: [wireMoney] });
const outcome = await run.result({ timeoutMs: 20_000 });
await worker.stop();
client.close();
console.log(outcome.text, traceparent);
