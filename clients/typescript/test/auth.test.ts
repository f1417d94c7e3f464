/**
 * Tokens and TLS: a server with an auth config, reached over TLS with a bearer token or a client
 * certificate; refusals surface as Unauthenticated and PermissionDenied (and its kinds, such as
 * the worker's NotAllowedToServe and IdentityTaken).
 */

import assert from "node:assert/strict";
import { createHash, X509Certificate } from "node:crypto";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import {
  AaaError,
  IdentityTaken,
  NotAllowedToServe,
  PermissionDenied,
  Unauthenticated,
  connect,
  echo,
  text,
  tool,
  toolCall,
  type Client,
  type ConnectOptions,
} from "../src/index.js";
import { WAIT_MS, closedPort, startServer, type Server } from "./helpers.js";

function hasOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

const skip = hasOpenssl() ? false : "needs the openssl command";
const sha256 = (data: string | Buffer) => createHash("sha256").update(data).digest("hex");

let pki: string;
let server: Server;
const clients: Client[] = [];

/** A P-256 key and a certificate for `name` signed by ca.pem: NAME.key, NAME.pem. */
function sign(name: string, extensions: string): void {
  const run = (...args: string[]) => execFileSync("openssl", args, { cwd: pki, stdio: "ignore" });
  run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", `/CN=${name}`,
    "-keyout", `${name}.key`, "-out", `${name}.csr`);
  writeFileSync(path.join(pki, `${name}.ext`), extensions);
  run("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
    "-extfile", `${name}.ext`, "-out", `${name}.pem`);
}

before(async () => {
  if (skip) return;
  pki = mkdtempSync(path.join(tmpdir(), "aaa-ts-pki-"));
  execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
    "-days", "2", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem"], { cwd: pki, stdio: "ignore" });
  sign("localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  sign("robot", "extendedKeyUsage=clientAuth\n");
  const robotDer = new X509Certificate(readFileSync(path.join(pki, "robot.pem"))).raw;
  writeFileSync(path.join(pki, "auth.toml"), [
    '[tls]\ncert = "localhost.pem"\nkey = "localhost.key"\nclient_ca = "ca.pem"\n',
    `[[principal]]\nname = "runner"\nroles = ["runner"]\ntoken_sha256 = "${sha256("runner-token")}"\n`,
    `[[principal]]\nname = "approver"\nroles = ["approver"]\ntoken_sha256 = "${sha256("approver-token")}"\n`,
    `[[principal]]\nname = "robot"\nroles = ["runner"]\ncert_sha256 = "${sha256(robotDer)}"\n`,
    `[[principal]]\nname = "payments"\nroles = ["worker"]\ntools = ["wire_money"]\ntoken_sha256 = "${sha256("payments-token")}"\n`,
    `[[principal]]\nname = "intruder"\nroles = ["worker"]\ntools = ["wire_money"]\ntoken_sha256 = "${sha256("intruder-token")}"\n`,
  ].join("\n"));
  server = await startServer({ args: ["--auth-config", path.join(pki, "auth.toml")] });
});

after(async () => {
  for (const client of clients) client.close();
  await server?.stop();
  if (pki) rmSync(pki, { recursive: true, force: true });
});

async function dial(options: ConnectOptions, address: string | string[] = server.address): Promise<Client> {
  const client = await connect(address, {
    ...options,
    tls: { ca: readFileSync(path.join(pki, "ca.pem")), servername: "localhost", ...options.tls },
  });
  clients.push(client);
  return client;
}

async function startedBy(client: Client): Promise<string> {
  const run = await client.startRun("hello", { model: [text("done")] });
  const started = await run.waitFor("aaa.run.started");
  return started.actor.name;
}

test("a token over TLS names the caller in the events", { skip }, async () => {
  assert.equal(await startedBy(await dial({ token: "runner-token" })), "runner");
});

test("TLS and a token work the same with a list of addresses", { skip }, async () => {
  const port = server.address.slice(server.address.lastIndexOf(":") + 1);
  // The certificate's names: with servername, then each address's own host name.
  assert.equal(await startedBy(await dial({ token: "runner-token" }, [`127.0.0.1:${await closedPort()}`, server.address])), "runner");
  const byName = await dial({ token: "runner-token", tls: { servername: undefined } }, [`localhost:${await closedPort()}`, `localhost:${port}`]);
  assert.equal(await startedBy(byName), "runner");
});

test("a client certificate authenticates without a token", { skip }, async () => {
  const cert = readFileSync(path.join(pki, "robot.pem"));
  const key = readFileSync(path.join(pki, "robot.key"));
  assert.equal(await startedBy(await dial({ tls: { cert, key } })), "robot");
});

test("missing or unknown credentials are Unauthenticated; a missing role is PermissionDenied", { skip }, async () => {
  for (const token of ["", "wrong-token"]) {
    const client = await dial({ token });
    const err = await client.startRun("hello", { model: [text("done")] }).then(
      () => assert.fail("the call succeeded"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof Unauthenticated, `${err}`);
    assert.equal(err.reason, "UNAUTHENTICATED");
  }
  const approver = await dial({ token: "approver-token" });
  const err = await approver.startRun("hello", { model: [text("done")] }).then(
    () => assert.fail("the call succeeded"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof PermissionDenied && err instanceof AaaError, `${err}`);
  assert.equal(err.metadata.roles, "runner,admin");
});

/** The rejection of `promise` (failing the test if it resolves). */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => assert.fail("the call succeeded"),
    (e: unknown) => e,
  );
}

test("a worker principal serves only its tools, under an identity it owns", { skip }, async () => {
  const payments = await dial({ token: "payments-token" });
  const intruder = await dial({ token: "intruder-token" });
  const runner = await dial({ token: "runner-token" });
  const wireMoney = tool({ name: "wire_money", handler: ({ amount }: { amount: number }) => ({ sent: amount }) });
  const sendEmail = tool({ name: "send_email", handler: ({ to }: { to: string }) => to });

  // A tool the principal's `tools` do not list.
  const refused = await rejection(payments.worker({ tools: [sendEmail], identity: "payments-1" }).register());
  assert.ok(refused instanceof NotAllowedToServe && refused instanceof PermissionDenied, `${refused}`);
  assert.equal(refused.reason, "NOT_ALLOWED_TO_SERVE");
  assert.equal(refused.metadata.tool, "send_email");

  // payments-1 is payments' from its first use on: intruder may not register or poll as it,
  // even for a tool intruder may serve.
  const worker = payments.worker({ tools: [wireMoney], identity: "payments-1" });
  await worker.start();
  try {
    const taken = await rejection(intruder.worker({ tools: [wireMoney], identity: "payments-1" }).register());
    assert.ok(taken instanceof IdentityTaken && taken instanceof PermissionDenied, `${taken}`);
    assert.equal(taken.reason, "IDENTITY_TAKEN");
    assert.equal(taken.metadata.identity, "payments-1");
    const poll = { identity: "payments-1", tools: ["wire_money"], waitS: 0.1 };
    const polled = await rejection(intruder.call((o) => intruder.services.worker.pollTask(poll, o)));
    assert.ok(polled instanceof IdentityTaken, `${polled}`);
    assert.equal(polled.metadata.identity, "payments-1");

    // The owner serves a run; the events name its identity and its principal.
    const run = await runner.startRun("pay", { model: [toolCall(wireMoney, { amount: 5 }), echo()], tools: [wireMoney] });
    assert.equal((await run.result({ timeoutMs: WAIT_MS })).status, "completed");
    const completed = await run.waitFor("aaa.tool.completed", { timeoutMs: WAIT_MS });
    assert.deepEqual(completed.actor, { kind: "worker", name: "payments-1", principal: "payments" });
    const started = await run.waitFor("aaa.run.started", { timeoutMs: WAIT_MS });
    assert.deepEqual(started.actor, { kind: "client", name: "runner", principal: "" });
  } finally {
    await worker.stop();
  }
});
