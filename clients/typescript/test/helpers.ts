/**
 * Test helpers: the real aaa server binary on a free port, event collection,
 * timeouts, a closed port, and a TCP proxy whose connections can be cut.
 *
 * The binary is env AAA_BIN, by default ../../target/debug/aaa relative to
 * clients/typescript (run `cargo build` in the repository first). Each test
 * file starts one server with a temporary data dir and stops it (SIGTERM,
 * then SIGKILL) at the end.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import {
  connect,
  text,
  tool,
  toolCall,
  type Client,
  type Event,
  type EventsOptions,
  type Message,
  type ModelHandler,
  type Run,
  type Tool,
} from "../src/index.js";

/** clients/typescript. */
export const PACKAGE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
/** The repository root. */
export const REPO_DIR = path.resolve(PACKAGE_DIR, "../..");
/** How long a test waits for something that should happen soon. */
export const WAIT_MS = 20_000;

/** The server binary under test. */
export function binaryPath(): string {
  return process.env.AAA_BIN ? path.resolve(process.env.AAA_BIN) : path.join(REPO_DIR, "target/debug/aaa");
}

/** A running aaa server process. */
export interface Server {
  /** "127.0.0.1:PORT". */
  address: string;
  /** The process. */
  process: ChildProcess;
  /** Its temporary directory (data dir and log). */
  dir: string;
  /** The last lines of its stderr log. */
  logTail(lines?: number): string;
  /** SIGTERM, then SIGKILL if it does not exit within 10 s; removes the temporary directory (unless kept). */
  stop(): Promise<void>;
}

/** Resolves when the process has exited (at once if it already has). */
export function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

/** SIGTERM, then SIGKILL if the process does not exit within `graceMs`. */
export async function stopProcess(child: ChildProcess, graceMs = 10_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
  await exited(child);
  clearTimeout(timer);
}

/** Whether the suite runs on PostgreSQL (AAA_TEST_STORE=postgres) rather than the embedded store. */
export const ON_POSTGRES = process.env.AAA_TEST_STORE === "postgres";

/**
 * `--store URL` when the suite runs on PostgreSQL (AAA_TEST_STORE=postgres): a fresh schema of
 * AAA_TEST_POSTGRES per server directory, remembered in it so a restart finds the same data;
 * or the schema of `storeOf` (a server of the same cluster).
 */
function storeArgs(dir: string, storeOf?: Server): string[] {
  if (!ON_POSTGRES) return [];
  const remembered = path.join(dir, "store-url");
  if (storeOf !== undefined) {
    writeFileSync(remembered, readFileSync(path.join(storeOf.dir, "store-url"), "utf8"));
  } else if (!existsSync(remembered)) {
    const base = process.env.AAA_TEST_POSTGRES ?? "";
    const separator = base.includes("?") ? "&" : "?";
    const schema = `aaa_test_${randomUUID().replaceAll("-", "")}`;
    writeFileSync(remembered, `${base}${separator}options=-csearch_path%3D${schema}`);
  }
  return [`--store=${readFileSync(remembered, "utf8")}`];
}

/**
 * Starts the binary (by default on 127.0.0.1:0 with a new temporary
 * directory; `args` are more `aaa serve` flags) and waits for its "serving on HOST:PORT" line. `stop()` removes
 * the directory unless `keep` is set (to restart on the same data). On PostgreSQL, `storeOf` puts it on
 * the schema of that server (to make a cluster), and `embedded` keeps it on the embedded store.
 */
export async function startServer(
  options: { listen?: string; dir?: string; keep?: boolean; args?: string[]; storeOf?: Server; embedded?: boolean } = {},
): Promise<Server> {
  const binary = binaryPath();
  if (!existsSync(binary)) {
    throw new Error(`aaa server binary not found at ${binary}: run \`cargo build\` in ${REPO_DIR} first (or set AAA_BIN)`);
  }
  const dir = options.dir ?? mkdtempSync(path.join(tmpdir(), "aaa-ts-"));
  const logPath = path.join(dir, "server.log");
  const log = openSync(logPath, "a");
  const listen = options.listen ?? "127.0.0.1:0";
  const args = ["serve", "--listen", listen, "--data-dir", path.join(dir, "data"), ...(options.embedded ? [] : storeArgs(dir, options.storeOf)), ...(options.args ?? [])];
  const child = spawn(binary, args, {
    stdio: ["ignore", "pipe", log],
  });
  closeSync(log);
  const logTail = (lines = 30) => {
    try {
      return readFileSync(logPath, "utf8").split("\n").slice(-lines).join("\n");
    } catch {
      return "";
    }
  };
  const lines = createInterface({ input: child.stdout! }); // keeps draining stdout after the first line
  const address = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server printed no 'serving on' line in 30 s\n${logTail()}`)), 30_000);
    lines.on("line", (line) => {
      const match = /serving on (\S+:\d+)/.exec(line);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`the server exited (${code ?? signal}) before serving\n${logTail()}`));
    });
  }).catch(async (err: unknown) => {
    await stopProcess(child);
    if (!options.keep) rmSync(dir, { recursive: true, force: true });
    throw err;
  });
  return {
    address,
    process: child,
    dir,
    logTail,
    async stop() {
      await stopProcess(child);
      if (!options.keep) rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A server and a client connected to it, for one test file: call in `before`, `stop()` in `after`. */
export async function setUp(): Promise<{ server: Server; client: Client; stop(): Promise<void> }> {
  const server = await startServer();
  const client = await connect(server.address);
  return {
    server,
    client,
    async stop() {
      client.close();
      await server.stop();
    },
  };
}

/**
 * A gated wire tool (needing `approvalsRequired` grants), a model that calls it once with
 * `{amount: 250, to: "ACME"}` and then replies with the tool's result, a log of the tool's
 * real runs, and the tool messages the model read.
 */
export function paymentSetup(
  id: string,
  options: { approvalsRequired?: number } = {},
): { wire: Tool<{ amount: number; to: string }>; model: ModelHandler; ran: [number, string][]; toolMessages: Message[] } {
  const ran: [number, string][] = [];
  const toolMessages: Message[] = [];
  const wire = tool({
    name: `wire_${id}`,
    description: "Send money.",
    parameters: { type: "object", properties: { amount: { type: "integer" }, to: { type: "string" } } },
    requiresApproval: true,
    approvalsRequired: options.approvalsRequired,
    handler: ({ amount, to }: { amount: number; to: string }) => {
      ran.push([amount, to]);
      return `sent $${amount} to ${to}`;
    },
  });
  const model: ModelHandler = (request) => {
    const last = request.messages[request.messages.length - 1];
    if (last.role === "user") return toolCall(wire, { amount: 250, to: "ACME" });
    toolMessages.push(last);
    if (last.error) return text(`refused: ${last.error.type}: ${last.error.message}`);
    return text(last.content);
  };
  return { wire, model, ran, toolMessages };
}

let counter = 0;
/** A short unique suffix for the tool, model and label names of one test. */
export function uid(): string {
  counter += 1;
  return `${process.pid.toString(36)}${Date.now().toString(36)}${counter}`;
}

/** Rejects if the promise does not settle within `ms`. */
export async function within<T>(promise: Promise<T>, ms = WAIT_MS, what = "the operation"): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** All events of `run.events(options)`, waiting at most WAIT_MS. */
export async function collect(run: Run, options: EventsOptions = {}): Promise<Event[]> {
  const events: Event[] = [];
  for await (const event of run.events({ ...options, signal: options.signal ?? AbortSignal.timeout(WAIT_MS) })) {
    events.push(event);
  }
  return events;
}

/** The events of one type. */
export function ofType(events: Event[], type: string): Event[] {
  return events.filter((e) => e.type === type);
}

/** The iterator's next value, waiting at most `ms`; fails if the iterator ends. */
export async function next<T>(iterator: AsyncIterator<T>, ms = WAIT_MS): Promise<T> {
  const result = await within(iterator.next(), ms, "the next item");
  if (result.done) throw new Error("the iterator ended");
  return result.value;
}

/** A promise with its resolve function, for a test to hold a handler until it lets it go. */
export function deferred<T = void>(): { promise: Promise<T>; resolve(value: T): void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** Reads a child process's stdout line by line. */
export function lineReader(child: ChildProcess): AsyncIterator<string> {
  return createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
}

/** A port of 127.0.0.1 that nothing listens on: bound, read, closed. */
export async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A TCP proxy on 127.0.0.1 whose connections can be cut, to simulate a dropped network. */
export class Proxy {
  /** "127.0.0.1:PORT" to connect to. */
  address = "";
  private readonly sockets = new Set<net.Socket>();
  private readonly server: net.Server;

  /** Forwards to `target` ("host:port"). */
  constructor(target: string) {
    const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
    this.server = net.createServer((downstream) => {
      const upstream = net.connect(port, host);
      for (const s of [downstream, upstream]) {
        this.sockets.add(s);
        s.on("close", () => this.sockets.delete(s));
        s.on("error", () => {});
      }
      downstream.pipe(upstream).on("error", () => {});
      upstream.pipe(downstream).on("error", () => {});
      downstream.on("close", () => upstream.destroy());
      upstream.on("close", () => downstream.destroy());
    });
  }

  /** Listens on a free port. */
  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.address = `127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
    return this;
  }

  /** Cuts every open connection (RST); returns how many sockets were cut. */
  drop(): number {
    const cut = [...this.sockets].filter((s) => !s.destroyed);
    for (const s of cut) s.resetAndDestroy();
    this.sockets.clear();
    return cut.length;
  }

  /** Stops listening and cuts everything. */
  async close(): Promise<void> {
    this.drop();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
