// The built-in OpenAI-compatible model's helper, without a server.
import assert from "node:assert/strict";
import { test } from "node:test";

import { modelSpec } from "../src/client.js";
import { openai } from "../src/index.js";

test("openai(...) asks StartRun for the server's built-in model", () => {
  assert.deepEqual(modelSpec(openai("gpt-4.1-mini", { provider: "openai", temperature: 0.2 })), {
    kind: { case: "openai", value: { model: "gpt-4.1-mini", provider: "openai", temperature: 0.2, maxTokens: 0 } },
  });
  assert.deepEqual(modelSpec(openai()), {
    kind: { case: "openai", value: { model: "", provider: "", temperature: undefined, maxTokens: 0 } },
  });
});
