/**
 * The reference scenario, denied: the tool never runs and the model explains the refusal.
 *
 * Start a server (`cargo run --release -- serve` in the repository), then run
 * `npx tsx examples/deny.ts` in clients/typescript (address from env
 * AAA_SERVER, default 127.0.0.1:50051). It prints:
 *
 *     waiting for approval of: wire_money {"amount":250,"to":"ACME"}
 *     I did not pay ACME: the transfer was refused (over the daily limit).
 *
 * A denial reaches the model as the tool's result: a tool message whose
 * `error` has type "ApprovalDenied" and the reason as message.
 */

import { connect, stringify, text, tool, toolCall, type ModelHandler } from "../src/index.js";

const wireMoney = tool({
  name: "wire_money",
  description: "Send money.",
  parameters: {
    type: "object",
    properties: { amount: { type: "integer" }, to: { type: "string" } },
    required: ["amount", "to"],
  },
  requiresApproval: true,
  handler: ({ amount, to }: { amount: number; to: string }) => `sent $${amount} to ${to}`,
});

// A fake LLM that explains a refused tool call.
const seed: ModelHandler = (request) => {
  const last = request.messages[request.messages.length - 1];
  if (last.role === "user") return toolCall(wireMoney, { amount: 250, to: "ACME" });
  if (last.error?.type === "ApprovalDenied") {
    return text(`I did not pay ACME: the transfer was refused (${last.error.message}).`);
  }
  return text(last.content);
};

const client = await connect(process.env.AAA_SERVER);
const worker = client.worker({ tools: [wireMoney], models: { seed } });
await worker.start();
try {
  const run = await client.startRun("Pay ACME $250", { model: "seed", tools: [wireMoney] });
  const request = await run.waitFor("aaa.approval.requested");
  console.log("waiting for approval of:", request.data.name, stringify(request.data.arguments));
  await run.deny(request.data.call_id, "over the daily limit");
  const outcome = await run.result();
  console.log(outcome.text);
} finally {
  await worker.stop();
  client.close();
}
