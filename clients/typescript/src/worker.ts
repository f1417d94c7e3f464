/**
 * The worker: serve tools and models to the runs of an aaa server.
 *
 * ```ts
 * const wireMoney = tool({
 *   name: "wire_money",
 *   description: "Send money",
 *   parameters: { type: "object", properties: { amount: { type: "integer" }, to: { type: "string" } } },
 *   requiresApproval: true,
 *   handler: async ({ amount, to }: { amount: number; to: string }) => `sent $${amount} to ${to}`,
 * });
 * const worker = client.worker({ tools: [wireMoney], models: { seed: model } });
 * await worker.start();   // RegisterWorker, then PollTask in the background
 * ...
 * await worker.stop();    // graceful: running tasks may finish
 * ```
 *
 * Each task is one exclusive attempt. The worker runs the tool's handler (or
 * the model handler), sends heartbeats at a third of the task's
 * `heartbeat_timeout_s` while it runs, and reports the result with
 * CompleteTask. A result whose reply is lost (`Unavailable`, `Timeout`: each
 * try waits 10 s) is sent again with the same token, with backoff, for up to
 * 30 s in all; the server records it once. A thrown error becomes FailTask with the error's name as type
 * and its message: the server retries per the tool's policy, then gives the
 * failure to the model. Throw {@link NonRetryable} to skip the retries. When
 * a heartbeat answers that the run no longer wants the attempt (cancelled,
 * deadline passed, attempt superseded), the task's `signal` aborts and nothing
 * is reported.
 *
 * @module
 */

import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { CompleteTaskRequestSchema, FailTaskRequestSchema, Task } from "./gen/aaa/v1/worker_pb.js";
import type { ToolDefinitionSchema } from "./gen/aaa/v1/types_pb.js";
import type { CallOptions } from "@connectrpc/connect";
import { Backoff } from "./backoff.js";
import type { Connection } from "./connection.js";
import { FailedPrecondition, InvalidArgument, NonRetryable, NotFound, Timeout, Unavailable, toAaaError } from "./errors.js";
import { parseObject, stringify, type JsonObject } from "./json.js";
import { inTaskSpan, type FailSpan } from "./otel.js";
import { toOwnerOf } from "./route.js";
import { Reply, modelRequestFromProto, optionalDate, replyToProto, type ModelRequest, type ToolInfo } from "./types.js";

/** The attempt a tool or model handler is running. */
export interface TaskContext {
  /** The run the call belongs to. */
  readonly runId: string;
  /** The call's id: the idempotency key to pass to the outside world. */
  readonly callId: string;
  /** Attempt number, from 1. */
  readonly attempt: number;
  /** "tool" or "model". */
  readonly kind: "tool" | "model";
  /** The tool's or model's name. */
  readonly name: string;
  /** The lease: the worker heartbeats at a third of it. */
  readonly heartbeatTimeoutS: number;
  /** When the run's deadline passes, if it has one. */
  readonly deadlineAt?: Date;
  /**
   * Aborted when the attempt is no longer wanted (run cancelled, deadline
   * passed, attempt superseded) or the worker stops past its grace period.
   * Pass it on (fetch, timers...) so the work stops; the worker does not wait
   * for a handler once it is aborted.
   */
  readonly signal: AbortSignal;
  /** The identity of the worker running it. */
  readonly worker: string;
  /** W3C trace context of the server's span of this attempt ("" from an older server). */
  readonly traceparent: string;
}

/** A tool's handler: gets the arguments (parsed exactly) and the task; returns any JSON value (bigints allowed). */
export type ToolHandler<A> = (args: A, task: TaskContext) => unknown;

/** Options of {@link tool}. */
export interface ToolOptions<A> {
  /** The tool's name: letters, digits, '_', '-' and '.', at most 128 characters. */
  name: string;
  /** What the tool does, shown to models. */
  description?: string;
  /** JSON schema of the arguments object. Default `{}`. */
  parameters?: Record<string, unknown>;
  /** When true, every call waits for a human's grant before it runs. */
  requiresApproval?: boolean;
  /** Retries after a failed or lost first attempt (so `retries + 1` attempts in all). Unset: the server's default (gated tools 0, others 2). */
  retries?: number;
  /** Delay before the first retry, in seconds (server default 1), doubling after each. */
  retryBackoffS?: number;
  /** A started attempt with no heartbeat for this long is lost (seconds; server default 30). */
  heartbeatTimeoutS?: number;
  /** When > 0, an unanswered approval request is denied with reason "timeout" after this many seconds. */
  approvalTimeoutS?: number;
  /** Grants from distinct approvers a gated call needs before it runs (any one denial denies); unset: 1. At most 16. */
  approvalsRequired?: number;
  /**
   * The approver groups (`groups` of the server's auth config) whose members may decide its calls;
   * others get `NotAnApproverForCall`. Unset or empty: any approver (a policy rule may still name
   * groups). Not enforced when the server runs without auth.
   */
  approvers?: readonly string[];
  /** The work. */
  handler: ToolHandler<A>;
}

/** A tool a worker serves, made by {@link tool}. Pass it to `client.worker({tools})` and to `startRun({tools})`. */
export class Tool<A = JsonObject> {
  /** The tool's name. */
  readonly name: string;
  /** What it does. */
  readonly description: string;
  /** JSON schema of its arguments. */
  readonly parameters: Record<string, unknown>;
  /** Whether its calls wait for approval. */
  readonly requiresApproval: boolean;
  /** Retries after the first attempt; undefined for the server's default. */
  readonly retries?: number;
  /** Delay before the first retry (s). */
  readonly retryBackoffS?: number;
  /** Lease of an attempt (s). */
  readonly heartbeatTimeoutS?: number;
  /** Approval timeout (s). */
  readonly approvalTimeoutS?: number;
  /** Grants from distinct approvers each call needs; undefined for 1. */
  readonly approvalsRequired?: number;
  /** The approver groups that may decide its calls; empty: any approver. */
  readonly approvers: readonly string[];
  /** The handler. */
  readonly handler: ToolHandler<A>;

  /** Creates a tool; same as {@link tool}. */
  constructor(options: ToolOptions<A>) {
    this.name = options.name;
    this.description = options.description ?? "";
    this.parameters = options.parameters ?? {};
    this.requiresApproval = options.requiresApproval ?? false;
    this.retries = options.retries;
    this.retryBackoffS = options.retryBackoffS;
    this.heartbeatTimeoutS = options.heartbeatTimeoutS;
    this.approvalTimeoutS = options.approvalTimeoutS;
    this.approvalsRequired = options.approvalsRequired;
    this.approvers = [...(options.approvers ?? [])];
    this.handler = options.handler;
  }

  /** The wire ToolDefinition sent by RegisterWorker. */
  definition(): MessageInitShape<typeof ToolDefinitionSchema> {
    const retry =
      this.retries === undefined && this.retryBackoffS === undefined
        ? undefined
        : { maxAttempts: this.retries === undefined ? 0 : this.retries + 1, initialBackoffS: this.retryBackoffS ?? 0 };
    return {
      name: this.name,
      description: this.description,
      parametersJson: stringify(this.parameters),
      requiresApproval: this.requiresApproval,
      retry,
      heartbeatTimeoutS: this.heartbeatTimeoutS ?? 0,
      approvalTimeoutS: this.approvalTimeoutS ?? 0,
      approvalsRequired: this.approvalsRequired ?? 0,
      approvers: [...this.approvers],
    };
  }
}

/**
 * Declares a tool. The handler's first parameter type is the arguments' type
 * (trusted, not checked against `parameters`).
 */
export function tool<A = JsonObject>(options: ToolOptions<A>): Tool<A> {
  return new Tool(options);
}

/** A tool whatever its arguments' type (the worker hands each handler the parsed arguments). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyTool = Tool<any>;

/** What a model handler may return: a {@link Reply}, a plain string (text), or a list of them (combined). */
export type ReplyLike = Reply | string | readonly ReplyLike[];

/** A model: from the conversation and tools to a reply. */
export type ModelHandler = (request: ModelRequest, task: TaskContext) => ReplyLike | Promise<ReplyLike>;

/** How long a worker keeps sending a result whose reply was lost, in all (ms). */
const REPORT_RETRY_MS = 30_000;
/** How long one try of CompleteTask or FailTask waits for its reply (ms). */
const REPORT_TRY_MS = 10_000;

/** Where the worker reports what happens in the background. */
export interface Logger {
  /** Details (a result sent again after a lost reply, and the server's "recorded already"). */
  debug?(message: string): void;
  /** Routine events (an abandoned attempt, a refused stale result). */
  info(message: string): void;
  /** Trouble it recovers from (a failed poll it retries). */
  warn(message: string): void;
}

/** Options of a {@link Worker} (`client.worker(options)`). */
export interface WorkerOptions {
  /** Tools to serve. */
  tools?: readonly AnyTool[];
  /** Model name to handler. */
  models?: Record<string, ModelHandler>;
  /**
   * The worker's name in events; default "node-HOST-PID". With auth on it belongs to the principal
   * that first uses it: another principal gets `IdentityTaken`.
   */
  identity?: string;
  /** At most this many tasks at once; default 10. */
  concurrency?: number;
  /** Longest wait of one PollTask in seconds; 0 (default) means the server's cap. */
  pollWaitS?: number;
  /** How long `stop()` lets running tasks finish before aborting them; default 30 000 ms. */
  stopGraceMs?: number;
  /** Default: info dropped, warnings to stderr. */
  logger?: Logger;
}

/** Why a task's signal was aborted. */
class Abandoned extends Error {
  constructor(
    message: string,
    readonly report: boolean, // true: the worker stopped, report WorkerStopped; false: the server gave up on it
  ) {
    super(message);
    this.name = "Abandoned";
  }
}

type Report =
  | { kind: "complete"; request: MessageInitShape<typeof CompleteTaskRequestSchema> }
  | { kind: "fail"; request: MessageInitShape<typeof FailTaskRequestSchema> };

/** Counting semaphore for the concurrency limit. */
class Slots {
  private waiters: (() => void)[] = [];
  constructor(private free: number) {}

  acquire(): Promise<void> {
    if (this.free > 0) {
      this.free--;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.free++;
  }
}

/** The error type reported for a thrown value: its name, or its class name when the name is plain "Error". */
function errorType(err: unknown): string {
  if (err instanceof Error) {
    if (err.name && err.name !== "Error") return err.name;
    return err.constructor?.name || "Error";
  }
  return "Error";
}

/**
 * Serves tools and models. Create it with `client.worker({...})`, then
 * `await worker.start()`; `await worker.stop()` ends it gracefully.
 */
export class Worker {
  /** The worker's name in events. */
  readonly identity: string;
  private readonly tools: Map<string, AnyTool>;
  private readonly models: Map<string, ModelHandler>;
  private readonly concurrency: number;
  private readonly pollWaitS: number;
  private readonly stopGraceMs: number;
  private readonly logger: Logger;
  private readonly inflight = new Map<Promise<void>, AbortController>();
  private polling?: AbortController;
  private poller?: Promise<void>;
  private slots: Slots;

  /** Creates a worker; prefer `client.worker(options)`. */
  constructor(
    /** The connection it uses. */
    readonly client: Connection,
    options: WorkerOptions,
  ) {
    this.tools = new Map((options.tools ?? []).map((t) => [t.name, t]));
    this.models = new Map(Object.entries(options.models ?? {}));
    this.identity = options.identity || `node-${hostname()}-${process.pid}`;
    this.concurrency = options.concurrency ?? 10;
    if (!(this.concurrency >= 1)) throw new RangeError("concurrency must be at least 1");
    this.pollWaitS = options.pollWaitS ?? 0;
    this.stopGraceMs = options.stopGraceMs ?? 30_000;
    this.logger = options.logger ?? { info: () => {}, warn: (m) => console.error(`aaa worker ${this.identity}: ${m}`) };
    this.slots = new Slots(this.concurrency);
  }

  /** Declares this worker's tools and models to the server; returns the definitions as stored. */
  async register(): Promise<ToolInfo[]> {
    const request = {
      identity: this.identity,
      tools: [...this.tools.values()].map((t) => t.definition()),
      models: [...this.models.keys()],
    };
    const response = await this.client.call((o) => this.client.services.worker.registerWorker(request, o));
    return response.tools.map((t) => ({
      name: t.name,
      description: t.description,
      parameters: t.parametersJson === "" ? {} : parseObject(t.parametersJson),
      requiresApproval: t.requiresApproval,
    }));
  }

  /** Registers, then polls for tasks in the background until {@link stop}. */
  async start(): Promise<void> {
    if (this.polling !== undefined) throw new Error("the worker is already started");
    const polling = new AbortController();
    this.polling = polling;
    try {
      await this.register();
    } catch (err) {
      this.polling = undefined;
      throw err;
    }
    this.slots = new Slots(this.concurrency);
    this.poller = this.pollLoop(polling.signal);
  }

  /**
   * Stops polling, lets running tasks finish for up to `graceMs` (default
   * `stopGraceMs`), then aborts the rest and reports them failed with error
   * type WorkerStopped (retried per the tool's policy).
   */
  async stop(options: { graceMs?: number } = {}): Promise<void> {
    const polling = this.polling;
    if (polling === undefined) return;
    polling.abort();
    this.slots.release(); // wakes a poll loop waiting for a slot
    await this.poller;
    const graceMs = options.graceMs ?? this.stopGraceMs;
    if (this.inflight.size > 0) {
      const timer = new AbortController();
      await Promise.race([Promise.allSettled(this.inflight.keys()), sleep(graceMs, undefined, { signal: timer.signal }).catch(() => {})]);
      timer.abort();
      for (const controller of this.inflight.values()) {
        controller.abort(new Abandoned(`worker ${this.identity} stopped`, true));
      }
      await Promise.allSettled(this.inflight.keys());
    }
    this.polling = undefined;
    this.poller = undefined;
  }

  private async pollLoop(stopped: AbortSignal): Promise<void> {
    const request = {
      identity: this.identity,
      tools: [...this.tools.keys()],
      models: [...this.models.keys()],
      waitS: this.pollWaitS,
    };
    const signal = AbortSignal.any([stopped, this.client.closeSignal]);
    let delay = 50;
    while (!signal.aborted) {
      await this.slots.acquire();
      if (signal.aborted) break;
      let task: Task | undefined;
      try {
        task = (await this.client.services.worker.pollTask(request, { signal })).task;
      } catch (err) {
        this.slots.release();
        if (signal.aborted) break;
        this.logger.warn(`PollTask failed (${toAaaError(err)}); retrying in ${delay} ms`);
        await sleep(delay, undefined, { signal }).catch(() => {});
        delay = Math.min(delay * 2, 5000);
        continue;
      }
      delay = 50;
      if (task === undefined) {
        this.slots.release();
        continue;
      }
      const controller = new AbortController();
      const done = this.handle(task, controller).finally(() => {
        this.inflight.delete(done);
        this.slots.release();
      });
      this.inflight.set(done, controller);
    }
  }

  /** Runs one attempt with heartbeats, then reports it (unless the server gave up on it). */
  private async handle(task: Task, controller: AbortController): Promise<void> {
    const kind = task.kind.case === "tool" ? "tool" : "model";
    const context: TaskContext = {
      runId: task.runId,
      callId: task.callId,
      attempt: task.attempt,
      kind,
      name: task.kind.case === "tool" ? task.kind.value.name : task.kind.case === "model" ? task.kind.value.model : "",
      heartbeatTimeoutS: task.heartbeatTimeoutS,
      deadlineAt: optionalDate(task.deadlineAt),
      signal: controller.signal,
      worker: this.identity,
      traceparent: task.traceparent,
    };
    const heartbeats = new AbortController();
    const heartbeating = this.heartbeat(task, controller, heartbeats.signal);
    let report: Report | undefined;
    let onAbort: (() => void) | undefined;
    try {
      const aborted = new Promise<undefined>((resolve) => {
        onAbort = () => resolve(undefined);
        controller.signal.addEventListener("abort", onAbort, { once: true });
      });
      report = await Promise.race([this.execute(task, context), aborted]);
    } finally {
      if (onAbort) controller.signal.removeEventListener("abort", onAbort);
      heartbeats.abort();
      await heartbeating;
    }
    if (controller.signal.aborted) {
      const reason: unknown = controller.signal.reason;
      if (!(reason instanceof Abandoned) || !reason.report) return; // the run no longer wants it
      const error = { type: "WorkerStopped", message: reason.message };
      report = { kind: "fail", request: { token: task.token, error } };
    }
    if (report !== undefined) await this.report(task, report);
  }

  /** Heartbeats until `stop` aborts; aborts the task when the server no longer wants it. */
  private async heartbeat(task: Task, controller: AbortController, stop: AbortSignal): Promise<void> {
    const intervalMs = ((task.heartbeatTimeoutS || 30) * 1000) / 3;
    const signal = AbortSignal.any([stop, this.client.closeSignal]);
    while (!signal.aborted) {
      try {
        await sleep(intervalMs, undefined, { signal });
        const response = await this.client.services.worker.heartbeatTask(
          { token: task.token },
          toOwnerOf(task.runId, { signal, timeoutMs: intervalMs }),
        );
        if (response.cancelRequested) {
          this.logger.info(`attempt ${task.attempt} of ${task.callId}: the run asked to stop`);
          controller.abort(new Abandoned("the run no longer wants this attempt", false));
          return;
        }
      } catch (err) {
        if (signal.aborted) return;
        const error = toAaaError(err);
        if (error instanceof FailedPrecondition || error instanceof NotFound || error instanceof InvalidArgument) {
          this.logger.info(`attempt ${task.attempt} of ${task.callId} abandoned: ${error}`);
          controller.abort(new Abandoned(error.message, false));
          return;
        }
        // transient: the next heartbeat may get through
      }
    }
  }

  /**
   * Runs the tool or model; returns the report to send. With OpenTelemetry set
   * up, in a span under the server's span of this attempt, so the handler's
   * own spans join the run's trace.
   */
  private execute(task: Task, context: TaskContext): Promise<Report> {
    return inTaskSpan(task, context.name, (fail) => this.run(task, context, fail));
  }

  private async run(task: Task, context: TaskContext, fail: FailSpan): Promise<Report> {
    try {
      if (task.kind.case === "tool") {
        const tool = this.tools.get(task.kind.value.name);
        if (tool === undefined) throw new NonRetryable(`worker ${this.identity} does not serve tool ${task.kind.value.name}`);
        const args = parseObject(task.kind.value.argumentsJson || "{}");
        const output: unknown = await tool.handler(args, context);
        const outputJson = output === undefined ? "null" : stringify(output);
        return { kind: "complete", request: { token: task.token, result: { case: "outputJson", value: outputJson } } };
      }
      if (task.kind.case === "model") {
        const handler = this.models.get(task.kind.value.model);
        if (handler === undefined) throw new NonRetryable(`worker ${this.identity} does not serve model ${task.kind.value.model}`);
        const reply = asReply(await handler(modelRequestFromProto(task.kind.value), context));
        return { kind: "complete", request: { token: task.token, result: { case: "reply", value: replyToProto(reply) } } };
      }
      throw new NonRetryable(`task ${task.callId} has no kind this worker knows`);
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      this.logger.info(`${context.kind} ${context.name} attempt ${task.attempt} failed: ${message}`);
      fail(err, errorType(err));
      return {
        kind: "fail",
        request: { token: task.token, error: { type: errorType(err), message }, nonRetryable: err instanceof NonRetryable },
      };
    }
  }

  /**
   * Sends CompleteTask or FailTask. While the reply is lost (`Unavailable`: a
   * dropped connection, a stopping server, STORAGE_UNAVAILABLE; or `Timeout`)
   * it sends the same token and result again, with backoff, for up to 30 s in
   * all: the server records a result once and answers a repeat with
   * `alreadyRecorded`. Any other refusal (stale attempt, finished run) is only logged.
   */
  private async report(task: Task, report: Report): Promise<void> {
    const worker = this.client.services.worker;
    const send = (options: CallOptions): Promise<{ alreadyRecorded: boolean }> => {
      const o = toOwnerOf(task.runId, options);
      return report.kind === "complete" ? worker.completeTask(report.request, o) : worker.failTask(report.request, o);
    };
    const what = `attempt ${task.attempt} of ${task.callId}`;
    const deadline = Date.now() + REPORT_RETRY_MS;
    const backoff = new Backoff(REPORT_RETRY_MS);
    for (;;) {
      const timeoutMs = Math.max(1, Math.min(REPORT_TRY_MS, deadline - Date.now()));
      try {
        const response = await this.client.call(send, { timeoutMs, retry: false });
        if (response.alreadyRecorded) this.logger.debug?.(`${what}: recorded already (an earlier reply was lost)`);
        return;
      } catch (err) {
        const error = toAaaError(err);
        if ((error instanceof Unavailable || error instanceof Timeout) && (await backoff.wait())) {
          this.logger.debug?.(`reporting ${what} failed (${error}); sending it again`);
          continue;
        }
        if (error instanceof FailedPrecondition) this.logger.info(`the result of ${what} was refused: ${error}`);
        else this.logger.warn(`the result of ${what} was refused: ${error}`);
        return;
      }
    }
  }
}

/** Normalizes what a model handler returned into one {@link Reply}. */
export function asReply(value: ReplyLike): Reply {
  if (value instanceof Reply) return value;
  if (typeof value === "string") return new Reply(value);
  if (Array.isArray(value)) return new Reply().and(...value.map(asReply));
  throw new TypeError("a model handler returns text(...), toolCall(...), a string, or a list of them");
}
