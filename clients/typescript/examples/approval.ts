/**
 * The reference scenario: a gated tool waits for a human's grant, then runs.
 *
 * Start a server (`cargo run --release -- serve` in the repository), then run
 * `npx tsx examples/approval.ts` in clients/typescript (address from env
 * AAA_SERVER, default 127.0.0.1:50051). It prints:
 *
 *     waiting for approval of: wire_money {"amount":250,"to":"ACME"}
 *     sent $250 to ACME
 *
 * The arguments are printed as the exact JSON the tool will get (250 is an
 * integer). The worker and the client share this process here; they could be
 * separate programs on separate machines, and the grant could come from any
 * process, any time later: the run waits durably on the server.
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

// A fake LLM: asked to pay, it calls wire_money; given the tool's result, it repeats it.
const seed: ModelHandler = (request) => {
  const last = request.messages[request.messages.length - 1];
  if (last.role === "user") return toolCall(wireMoney, { amount: 250, to: "ACME" });
  return text(last.content);
};

const client = await connect(process.env.AAA_SERVER);
const worker = client.worker({ tools: [wireMoney], models: { seed } });
await worker.start();
try {
  const run = await client.startRun("Pay ACME $250", { model: "seed", tools: [wireMoney] });
  const request = await run.waitFor("aaa.approval.requested");
  console.log("waiting for approval of:", request.data.name, stringify(request.data.arguments));
  await run.approve(request.data.call_id);
  const outcome = await run.result();
  console.log(outcome.text);
} finally {
  await worker.stop();
  client.close();
}
