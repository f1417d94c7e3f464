/** The shipped examples print exactly what the README promises, against the real server. */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import path from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";
import { PACKAGE_DIR, startServer, type Server } from "./helpers.js";

let server: Server;
before(async () => {
  server = await startServer();
});
after(() => server.stop());

/** Runs examples/NAME with tsx and AAA_SERVER set; returns its stdout. */
async function runExample(name: string): Promise<string> {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ["--import", "tsx", path.join(PACKAGE_DIR, "examples", name)],
    { env: { ...process.env, AAA_SERVER: server.address }, cwd: PACKAGE_DIR, timeout: 60_000 },
  );
  return stdout;
}

test("the approval example prints the request, then the tool's result", async () => {
  assert.equal(
    await runExample("approval.ts"),
    'waiting for approval of: wire_money {"amount":250,"to":"ACME"}\nsent $250 to ACME\n',
  );
});

test("the deny example prints the request, then the model's explanation", async () => {
  assert.equal(
    await runExample("deny.ts"),
    'waiting for approval of: wire_money {"amount":250,"to":"ACME"}\n' +
      "I did not pay ACME: the transfer was refused (over the daily limit).\n",
  );
});
