// aaa as an MCP gateway, end to end with the official MCP TypeScript SDK
// (@modelcontextprotocol/sdk) as the client. aaa (AAA_BIN, default
// target/debug/aaa) runs with an auth config and an --mcp file of two stdio
// upstreams: tests/mcp/upstream.py (MCPServer, logging each execution; run
// by AAA_MCP_PYTHON, the venv tests/mcp/run.sh made) and
// @modelcontextprotocol/server-everything (from this package's node_modules).
// Approvals are decided with the aaa CLI, as an approver would.
// Run by tests/mcp/run.sh (npm ci, then `node --test`).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { createInterface } from "node:readline";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, createWriteStream } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const REPO = resolve(HERE, "..", "..", "..");
const AAA = process.env.AAA_BIN ?? join(REPO, "target", "debug", "aaa");
const PYTHON = process.env.AAA_MCP_PYTHON ?? join(HERE, "..", ".venv", "bin", "python");
const EVERYTHING = join(HERE, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js");
const TOKENS = { runner: "mcp-runner-token", approver: "alice-token" };
const WAIT_MS = 20_000;
// A gated call waits for a person: the SDK's 60 s request timeout restarts
// with each of aaa's progress notifications.
const WAITING = { timeout: 120_000, resetTimeoutOnProgress: true };

const sha256 = (text) => createHash("sha256").update(text).digest("hex");

let root;
let aaa;
let address;
let log;

before(async () => {
  root = mkdtempSync(join(tmpdir(), "aaa-mcp-ts-"));
  log = join(root, "executions.jsonl");
  writeFileSync(log, "");
  writeFileSync(
    join(root, "auth.toml"),
    `
[[principal]]
name = "mcp-runner"
roles = ["runner"]
token_sha256 = "${sha256(TOKENS.runner)}"

[[principal]]
name = "alice"
roles = ["approver", "reader"]
token_sha256 = "${sha256(TOKENS.approver)}"
`,
  );
  writeFileSync(
    join(root, "mcp.toml"),
    `
[[upstream]]
name = "bank"
command = ${JSON.stringify(PYTHON)}
args = [${JSON.stringify(join(HERE, "..", "upstream.py"))}]
env = { AAA_MCP_TEST_LOG = ${JSON.stringify(log)} }

[[upstream.tool]]
name = "echo"

[[upstream.tool]]
name = "wire_money"
requires_approval = true

[[upstream]]
name = "everything"
command = ${JSON.stringify(process.execPath)}
args = [${JSON.stringify(EVERYTHING)}, "stdio"]

[[upstream.tool]]
name = "echo"
expose_as = "everything_echo"

[[upstream.tool]]
name = "get-sum"
expose_as = "everything_sum"
requires_approval = true
`,
  );
  const args = ["serve", "--listen", "127.0.0.1:0", "--data-dir", join(root, "data"),
    "--auth-config", join(root, "auth.toml"), "--mcp", join(root, "mcp.toml")];
  if (process.env.AAA_TEST_STORE === "postgres") {
    const base = process.env.AAA_TEST_POSTGRES;
    const schema = `aaa_test_${createHash("sha256").update(root).digest("hex").slice(0, 24)}`;
    args.push("--store", `${base}${base.includes("?") ? "&" : "?"}options=-csearch_path%3D${schema}`);
  }
  const stderr = createWriteStream(join(root, "aaa.log"));
  aaa = spawn(AAA, args, { stdio: ["ignore", "pipe", "pipe"] });
  aaa.stderr.pipe(stderr);
  const first = await new Promise((done, fail) => {
    const lines = createInterface({ input: aaa.stdout });
    lines.once("line", done);
    aaa.once("exit", (code) => fail(new Error(`aaa exited with ${code}: ${tail(join(root, "aaa.log"))}`)));
  });
  const found = /serving on (\S+:\d+)/.exec(first);
  assert.ok(found, `aaa did not start: ${first}`);
  address = found[1];
});

after(async () => {
  if (aaa && aaa.exitCode === null) {
    const exited = new Promise((done) => aaa.once("exit", done));
    aaa.kill("SIGTERM");
    await exited;
  }
  if (root) rmSync(root, { recursive: true, force: true });
});

function tail(path) {
  try {
    return readFileSync(path, "utf8").slice(-2000);
  } catch {
    return "";
  }
}

/** A client of aaa's /mcp over Streamable HTTP, as the runner. */
async function connect(name = "ts-test") {
  const client = new Client({ name, version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(`http://${address}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${TOKENS.runner}` } },
  });
  await client.connect(transport);
  return client;
}

/** The aaa CLI, as the approver alice. */
function cli(...args) {
  return execFileSync(AAA, [...args, "--server", address, "--token", TOKENS.approver], {
    encoding: "utf8",
    timeout: 30_000,
  });
}

/** The one pending approval of `tool`, once aaa shows it to approvers. */
async function pending(tool) {
  const deadline = Date.now() + WAIT_MS;
  while (Date.now() < deadline) {
    const listed = JSON.parse(cli("approvals", "ls", "--json")).approvals.filter((a) => a.tool === tool);
    if (listed.length > 0) {
      assert.equal(listed.length, 1, JSON.stringify(listed));
      return listed[0];
    }
    await sleep(50);
  }
  assert.fail(`no pending approval of ${tool} within ${WAIT_MS} ms`);
}

/** The upstream.py executions of `tool`, in order. */
function executions(tool) {
  return readFileSync(log, "utf8")
    .split("\n")
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line))
    .filter((line) => line.tool === tool);
}

test("lists the exposed tools of both upstreams", async () => {
  const client = await connect();
  try {
    const { tools } = await client.listTools();
    const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
    assert.deepEqual(Object.keys(byName).sort(), ["echo", "everything_echo", "everything_sum", "wire_money"]);
    assert.equal(byName.wire_money.inputSchema.properties.amount.type, "integer");
    assert.equal(byName.everything_sum.inputSchema.properties.a.type, "number");
  } finally {
    await client.close();
  }
});

test("an ungated call goes straight through", async () => {
  const client = await connect();
  try {
    const result = await client.callTool({ name: "echo", arguments: { text: "hello from ts" } });
    assert.ok(!result.isError, JSON.stringify(result));
    assert.equal(result.content[0].text, "echo: hello from ts");
    const done = executions("echo").filter((d) => d.arguments.text === "hello from ts");
    assert.equal(done.length, 1);
    assert.equal(done[0].meta["aaa/call_id"], result._meta["aaa/call_id"]);

    const everything = await client.callTool({ name: "everything_echo", arguments: { message: "hi" } });
    assert.ok(!everything.isError, JSON.stringify(everything));
    assert.equal(everything.content[0].text, "Echo: hi");
  } finally {
    await client.close();
  }
});

test("a gated call waits for aaa approve and returns the upstream's result, run once", async () => {
  const client = await connect();
  try {
    const progress = [];
    const call = client.callTool({ name: "wire_money", arguments: { to: "TS-ACME", amount: 250 } }, undefined, {
      ...WAITING,
      onprogress: (p) => progress.push(p.message ?? ""),
    });
    let settled = false;
    call.finally(() => (settled = true)).catch(() => {});
    const waiting = await pending("wire_money");
    assert.deepEqual(waiting.arguments, { to: "TS-ACME", amount: 250 });
    // Nothing ran before the grant.
    assert.deepEqual(executions("wire_money"), []);
    assert.equal(settled, false);
    cli("approve", waiting.run_id, waiting.call_id, "--comment", "checked");
    const result = await call;
    assert.ok(!result.isError, JSON.stringify(result));
    assert.equal(result.content[0].text, "sent 250 to TS-ACME");
    const done = executions("wire_money");
    assert.equal(done.length, 1);
    assert.deepEqual(done[0].arguments, { to: "TS-ACME", amount: 250 });
    assert.equal(done[0].meta["aaa/call_id"], waiting.call_id);
    assert.ok(
      progress.some((p) => p.includes(`${waiting.call_id} of run ${waiting.run_id} waits for approval`)),
      JSON.stringify(progress),
    );
  } finally {
    await client.close();
  }
});

test("a gated server-everything tool runs with the edited and granted arguments", async () => {
  const client = await connect();
  try {
    const call = client.callTool({ name: "everything_sum", arguments: { a: 2, b: 3 } }, undefined, WAITING);
    const waiting = await pending("everything_sum");
    assert.deepEqual(waiting.arguments, { a: 2, b: 3 });
    cli("edit", waiting.run_id, waiting.call_id, "--arguments", '{"a": 20, "b": 3}', "--reason", "check", "--grant");
    const result = await call;
    assert.ok(!result.isError, JSON.stringify(result));
    assert.equal(result.content[0].text, "The sum of 20 and 3 is 23.");
  } finally {
    await client.close();
  }
});

test("a denied call is a tool error whose text is the reason", async () => {
  const client = await connect();
  try {
    const before = executions("wire_money").length;
    const call = client.callTool({ name: "wire_money", arguments: { to: "EVIL", amount: 1000 } }, undefined, WAITING);
    const waiting = await pending("wire_money");
    cli("deny", waiting.run_id, waiting.call_id, "--reason", "not this vendor");
    const result = await call;
    assert.equal(result.isError, true);
    assert.match(result.content[0].text, /not this vendor/);
    assert.equal(result._meta["aaa/error_type"], "ApprovalDenied");
    assert.equal(executions("wire_money").length, before);
  } finally {
    await client.close();
  }
});

test("aaa mcp --server relays over stdio", async () => {
  const client = new Client({ name: "ts-stdio", version: "1.0.0" });
  await client.connect(
    new StdioClientTransport({
      command: AAA,
      args: ["mcp", "--server", address],
      env: { ...process.env, AAA_TOKEN: TOKENS.runner },
    }),
  );
  try {
    const { tools } = await client.listTools();
    assert.ok(tools.some((t) => t.name === "everything_sum"));
    const call = client.callTool({ name: "everything_sum", arguments: { a: 1, b: 41 } }, undefined, WAITING);
    const waiting = await pending("everything_sum");
    cli("approve", waiting.run_id, waiting.call_id);
    const result = await call;
    assert.equal(result.content[0].text, "The sum of 1 and 41 is 42.");
  } finally {
    await client.close();
  }
});
