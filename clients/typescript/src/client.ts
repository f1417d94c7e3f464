/**
 * The client: start runs, follow their events, answer approvals.
 *
 * ```ts
 * const client = await connect("127.0.0.1:50051");
 * const run = await client.startRun("Pay ACME $250", { model: "seed", tools: [wireMoney] });
 * for await (const event of run.events()) console.log(event.seq, event.type, event.data);
 * const outcome = await run.result();
 * client.close();
 * ```
 *
 * Unary calls return promises; streams are async iterators. Calls that fail
 * with UNAVAILABLE (a dropped connection, a restarting server) are retried
 * for up to `retryMs`. StartRun, Signal and DecideApprovals send a fresh
 * `request_id` when the caller gives none, so a retried call never starts a
 * second run or appends a second event, and answers as the first try did. Event and approval streams resume from their cursor after a
 * dropped connection, with no gap and no duplicate.
 *
 * Given several addresses (the servers of a cluster), the client spreads its
 * calls over them (round robin) and leaves out those that do not answer,
 * until they do again; the writes of a run go to the server that owns it
 * (from GetCluster) when it is one of them.
 *
 * @module
 */

import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import { BatchDecision } from "./gen/aaa/v1/approval_pb.js";
import type { CreateGrantRequestSchema } from "./gen/aaa/v1/grant_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ModelSpecSchema, ScriptedStepSchema, StartRunRequestSchema } from "./gen/aaa/v1/run_pb.js";
import { Backoff, anySignal, cancelledBy } from "./backoff.js";
import { Connection, type CallControl, type ConnectOptions } from "./connection.js";
import { AaaError, Code, MemberTooSlow, Timeout, Unavailable, notCancelledError } from "./errors.js";
import { stringify, type JsonObject } from "./json.js";
import { traceparent } from "./otel.js";
import {
  Echo,
  OpenAIModel,
  Reply,
  TERMINAL_EVENT_TYPES,
  approvalFromProto,
  decisionResultFromProto,
  eventFromProto,
  grantFromProto,
  outcomeFromEvent,
  policyFromProto,
  resolutionFromProto,
  runInfoFromProto,
  runStatusToProto,
  signalResultFromProto,
  votedFromProto,
  type Approval,
  type ApprovalWatchItem,
  type DecisionItem,
  type DecisionResult,
  type Event,
  type EventType,
  type Grant,
  type Outcome,
  type Policy,
  type RunInfo,
  type RunStatus,
  type ScriptedStep,
  type SignalResult,
  type TypedEvent,
} from "./types.js";
import { Worker, type WorkerOptions } from "./worker.js";
import { Outbox, deliveryFromProto, handle, openRequest, type DeliveryHandler, type SubscribeOptions } from "./subscriptions.js";
import { toOwnerOf } from "./route.js";

/** The longest wait between two joins of a group whose stream ended (ms). */
const REJOIN_MAX_DELAY_MS = 5000;

/** A tool a run may call: its name, and optionally a gate, approval timeout or number of approvers for this run only. */
export interface ToolRef {
  /** Name of a tool registered by a worker. */
  readonly name: string;
  /** Gate this tool's calls in this run even if its worker does not (a run can add a gate, never remove one). */
  readonly requiresApproval?: boolean;
  /** When > 0, the tool's approval timeout in this run (seconds; unanswered means denied with reason "timeout"): shorter than the tool's, or one where it has none; longer is refused (INVALID_FIELD: a run may tighten a gate, never loosen it). */
  readonly approvalTimeoutS?: number;
  /** When above the tool's own, the grants from distinct approvers each call needs in this run (a run can raise it, never lower it). */
  readonly approvalsRequired?: number;
}

/** Limits of one run. */
export interface Budget {
  /** The run fails with DeadlineExceeded this many seconds after it starts; 0 or unset: no deadline. */
  deadlineS?: number;
  /** The run fails with BudgetExceeded past this many model calls; 0 or unset: the server's default (50). */
  maxModelCalls?: number;
  /** The run fails with BudgetExceeded once its built-in model calls used this many tokens; 0 or unset: no limit. */
  maxTokens?: number;
}

/** Options of {@link Client.startRun}. */
export interface StartRunOptions {
  /** A worker-served model's name, `openai(...)` (the server's built-in OpenAI-compatible model), or the steps of the built-in scripted model (`[toolCall(...), echo()]`). */
  model: string | OpenAIModel | readonly ScriptedStep[];
  /** The tools the run may call: `tool(...)` objects (their gate applies to this run too), {@link ToolRef}s or names. */
  tools?: readonly (ToolRef | string)[];
  /** Deadline and model-call limit. */
  budget?: Budget;
  /** Labels for filtering runs and approvals. */
  labels?: Record<string, string>;
  /** Idempotency key: a retry with the same key returns the first run. Generated when omitted. */
  requestId?: string;
  /** System instructions, given to models as the first message. */
  system?: string;
}

/** Options of {@link Run.events}. */
export interface EventsOptions {
  /** Exclusive cursor: only events with a greater seq. Pass the seq of the last event you handled to resume. */
  afterSeq?: number;
  /** After the stored history, wait for live events (default true). */
  follow?: boolean;
  /** Only events whose type starts with this. */
  typePrefix?: string;
  /** End after the run's terminal event (default true). */
  stopAtEnd?: boolean;
  /** Abort the stream: the iterator then throws `Cancelled`. Breaking out of the loop needs no signal. */
  signal?: AbortSignal;
}

/** Options of {@link Approvals.watch}. */
export interface WatchOptions {
  /** Only requests for this tool. */
  tool?: string;
  /** Only requests of this run. */
  runId?: string;
  /** Only requests of runs carrying all of these labels. */
  labels?: Record<string, string>;
  /**
   * Resume: skip the snapshot and yield exactly the changes after this token (an item's `resumeToken`, as it
   * came), on any server of the deployment and across restarts.
   */
  resumeToken?: string;
  /**
   * Resume, the older form: skip the snapshot and yield the changes after this position (an item's `position`).
   * Exact only for positions from before the server's log was partitioned by shard, or of a log with one
   * committer (the embedded store, or one server on PostgreSQL). Ignored when `resumeToken` is given.
   */
  afterPosition?: number;
  /** Seconds between the server's heartbeats while idle (0: 15 s); they keep the resume token fresh and are not yielded. */
  heartbeatS?: number;
  /** Only requests the caller may decide (see {@link Approvals.list}); votes and resolutions are not filtered. */
  decidable?: boolean;
  /** Abort the stream: the iterator then throws `Cancelled`. */
  signal?: AbortSignal;
}

/** Options of {@link Client.decideApprovals}. */
export interface DecideApprovalsOptions extends CallControl {
  /** Grant or deny every item. */
  decision: "grant" | "deny";
  /** For a denial: the reason the model reads. */
  reason?: string;
  /** For a grant: a comment recorded with it. */
  comment?: string;
  /** Decide nothing unless every item would be decided (or voted); the others then come back "not_applied". */
  allOrNothing?: boolean;
  /** With auth off: the approver's name for the votes (unverified). With auth on the caller is the approver. */
  approver?: string;
  /**
   * Idempotency key: a retry with the same key answers each item the first call decided with that
   * first result ("decided" and its seq, not "already_decided"). Generated when omitted.
   */
  requestId?: string;
}

/** Options of {@link Client.createGrant}. */
export interface CreateGrantOptions extends CallControl {
  /** Why it exists, for the audit trail. Required. */
  reason: string;
  /** Only this run's calls. */
  runId?: string;
  /** Only runs with every one of these labels, with these values. */
  labels?: Record<string, string>;
  /** Only runs started by this principal. */
  startedBy?: string;
  /** A CEL expression over the call, with the variables of policy rules (tool, args, labels, task, started_by, now); unset: any call. */
  condition?: string;
  /** Only a call with exactly these arguments: the `argumentsSha256` of its {@link Approval}. */
  argumentsSha256?: string;
  /** When it stops granting; unset (and no `expiresInS`): it does not expire. */
  expiresAt?: Date;
  /** Seconds from now until it stops granting (instead of `expiresAt`). */
  expiresInS?: number;
  /** How many calls it may grant; 0 or unset: any number. */
  maxUses?: number;
  /** Idempotency key: a retry with the same id creates nothing and returns the grant the first call created (default: a fresh one, so the SDK's own retries are safe). */
  requestId?: string;
}

/** Options of {@link Client.listGrants}. */
export interface ListGrantsOptions extends CallControl {
  /** Also revoked, expired and used-up grants. */
  includeRevoked?: boolean;
  /** Only this tool's. */
  tool?: string;
}

const BATCH_DECISION: Record<DecideApprovalsOptions["decision"], BatchDecision> = { grant: BatchDecision.GRANT, deny: BatchDecision.DENY };

/**
 * Connects to an aaa server, or to the servers of a cluster, and waits until one answers.
 *
 * @param address "host:port" (or an http:// URL); defaults to env AAA_SERVER, then 127.0.0.1:50051.
 *   An array of them (the servers of a cluster) spreads the calls over those that answer.
 * @throws Unavailable when no server answers within `timeoutMs`.
 */
export async function connect(address?: string | readonly string[], options: ConnectOptions = {}): Promise<Client> {
  const client = new Client(address, options);
  const timeoutMs = options.timeoutMs ?? 10_000;
  const deadline = Date.now() + timeoutMs;
  let delay = 50;
  for (;;) {
    const left = deadline - Date.now();
    const timer = new AbortController();
    const state = await Promise.race([
      anyConnected(client.allSessions),
      sleep(Math.max(left, 0), "timeout" as const, { signal: timer.signal }),
    ]);
    timer.abort();
    if (state === "open" || state === "idle") {
      // Best effort: without the map of the runs' owners, calls go round robin until a later read.
      await client["shardOwners"]?.read(Math.max(1, deadline - Date.now()));
      return client;
    }
    if (state === "timeout" || Date.now() + delay > deadline) {
      client.close();
      throw new Unavailable(`no aaa server answered at ${client.address} within ${timeoutMs} ms`, {
        code: Code.Unavailable,
        cause: client.allSessions.map((s) => s.error()).find((e) => e !== undefined),
      });
    }
    await sleep(delay);
    delay = Math.min(delay * 2, 1000);
  }
}

/** Connects each manager: "open" or "idle" as soon as one is, "error" when all failed. */
function anyConnected(managers: readonly Http2SessionManager[]): Promise<"open" | "idle" | "error"> {
  if (managers.length === 1) return managers[0].connect();
  return new Promise((resolve) => {
    let failed = 0;
    for (const manager of managers) {
      void manager.connect().then((state) => {
        if (state !== "error") resolve(state);
        else if (++failed === managers.length) resolve("error");
      });
    }
  });
}

/** The error of an SDK call that was given `timeoutMs` and ran out. */
function timeoutError(what: string, ms: number): Timeout {
  return new Timeout(`${what} did not finish within ${ms} ms`, { code: Code.DeadlineExceeded });
}

/**
 * A connection to an aaa server. Create it with {@link connect}; close it with
 * {@link Client.close}.
 */
export class Client extends Connection {
  /** List and watch pending approvals. */
  readonly approvals: Approvals;

  /** Creates a client without waiting for the server; prefer {@link connect}. */
  constructor(address?: string | readonly string[], options: ConnectOptions = {}) {
    super(address, options);
    this.approvals = new Approvals(this);
  }


  /**
   * Joins a consumer group and calls `handler` for each delivery, until
   * `options.signal` aborts or the client closes (then it rejects with
   * `Cancelled`). Each event matching `eventTypes` (exact types, prefixes like
   * `"aaa.approval.*"`, or `"*"`) goes to one member of the group at a time;
   * the handler resolving acks it, throwing nacks it (it comes again with
   * `attempt` + 1 until the group's `maxDeliveries` dead-letter it).
   * Deliveries are handled concurrently, at most `maxInFlight` at a time.
   * Delivery is at least once: deduplicate on `(event.runId, event.seq)`.
   *
   * When the stream ends for a reason that passes (the server ended it, is
   * stopping or restarting, cannot be reached or cannot write: `Unavailable`;
   * or dropped this member as too slow: `MemberTooSlow`), the group is joined
   * again after 50 ms, then twice as long after each failed try up to 5 s, for
   * as long as it takes (`retryMs` does not apply); deliveries not acked come
   * again.
   *
   * @throws any other refusal, which cannot get better: InvalidField for a bad
   * pattern or group name, GroupMismatch when the group exists with another
   * definition, PermissionDenied...
   */
  async subscribe(eventTypes: string | string[], handler: DeliveryHandler, options: SubscribeOptions): Promise<void> {
    const backoff = new Backoff(Infinity, REJOIN_MAX_DELAY_MS);
    const leave = anySignal(this.closeSignal, options.signal);
    for (;;) {
      const stream = new AbortController();
      const signal = anySignal(stream.signal, leave);
      const outbox = new Outbox(openRequest(eventTypes, options));
      try {
        for await (const response of this.services.subscription.subscribe(outbox.drain(signal), { signal })) {
          backoff.reset();
          if (response.item.case === "delivery") {
            void handle(handler, deliveryFromProto(response.item.value), outbox);
          }
        }
        // The server ended the stream: join again.
      } catch (err) {
        if (signal.aborted) throw cancelledBy(signal);
        const error = notCancelledError(err);
        if (!(error instanceof Unavailable || error instanceof MemberTooSlow)) throw error;
      } finally {
        stream.abort();
      }
      await backoff.wait(leave); // unacked deliveries come again after the join
    }
  }

  /** Starts a run and returns its handle. */
  async startRun(task: string, options: StartRunOptions & CallControl): Promise<Run> {
    const request: MessageInitShape<typeof StartRunRequestSchema> = {
      task,
      model: modelSpec(options.model),
      tools: (options.tools ?? []).map((t) =>
        typeof t === "string"
          ? { name: t }
          : {
              name: t.name,
              requiresApproval: t.requiresApproval ?? false,
              approvalTimeoutS: t.approvalTimeoutS ?? 0,
              approvalsRequired: t.approvalsRequired ?? 0,
            },
      ),
      labels: { ...options.labels },
      requestId: options.requestId || randomUUID(),
      system: options.system ?? "",
    };
    if (options.budget !== undefined) {
      request.budget = {
        deadlineS: options.budget.deadlineS ?? 0,
        maxModelCalls: options.budget.maxModelCalls ?? 0,
        maxTokens: BigInt(options.budget.maxTokens ?? 0),
      };
    }
    // With OpenTelemetry set up and a span active, the run's spans join its trace.
    const parent = await traceparent();
    const headers = parent === undefined ? undefined : { traceparent: parent };
    const response = await this.call((o) => this.services.run.startRun(request, { ...o, headers }), options);
    return new Run(this, response.runId, response.created);
  }

  /**
   * Grants or denies several calls in one request, each bound to the digest
   * of the arguments the reviewer was shown: pass the {@link Approval}s
   * themselves (or `{runId, callId, argumentsSha256}`). Returns one result per
   * item, in order; a grant of a call that needs several approvers is
   * "decided" as an "aaa.approval.voted". With `allOrNothing`, nothing is
   * recorded unless every item would be. Throws `InvalidArgument` for no
   * items, a call named twice or a missing digest. A retry after a lost reply
   * (with the same `requestId`) gets the first reply again.
   */
  async decideApprovals(items: readonly DecisionItem[], options: DecideApprovalsOptions): Promise<DecisionResult[]> {
    const request = {
      items: items.map(({ runId, callId, argumentsSha256 }) => ({ runId, callId, argumentsSha256 })),
      // Anything else (a typo from untyped code) goes as UNSPECIFIED, which the server refuses.
      decision: BATCH_DECISION[options.decision] ?? BatchDecision.UNSPECIFIED,
      reason: options.reason ?? "",
      comment: options.comment ?? "",
      allOrNothing: options.allOrNothing ?? false,
      approver: options.approver ?? "",
      requestId: options.requestId || randomUUID(),
    };
    const response = await this.call((o) => this.services.approval.decideApprovals(request, o), options);
    return response.results.map(decisionResultFromProto);
  }

  /** The approval policy this server runs with (`loaded` is false without one). Each server of a cluster answers for its own file. */
  async getPolicy(control: CallControl = {}): Promise<Policy> {
    const response = await this.call((o) => this.services.policy.getPolicy({}, o), control);
    return policyFromProto(response);
  }

  /**
   * Makes the server read its policy file again and returns the policy now in force. Role admin.
   * A file that does not check throws `InvalidField` (the message names the rule) and the policy
   * in force stays; so does a server started without `--policy`. Calls requested from now on follow
   * the new policy; those already waiting keep what they were requested with.
   */
  async reloadPolicy(control: CallControl = {}): Promise<Policy> {
    const response = await this.call((o) => this.services.policy.reloadPolicy({}, o), control);
    return policyFromProto(response.policy);
  }

  /**
   * Grants a tool's calls in advance (role approver): a gated call that would wait for one person
   * and that the grant matches (tool, scope, condition, digest; not expired, revoked or used up)
   * runs at once, with actor kind "grant" named after the grant's id. A policy rule's decision comes
   * first; a call that needs several approvals still waits for them. Not retried: a retry after a
   * lost answer could make a second grant.
   *
   * @param tool the tool (a `tool(...)` object or its name); it must be registered.
   * @throws InvalidField naming the field for bad input (a condition that does not compile...).
   */
  async createGrant(tool: string | { readonly name: string }, options: CreateGrantOptions): Promise<Grant> {
    if (options.expiresAt !== undefined && options.expiresInS !== undefined) {
      throw new TypeError("give expiresAt or expiresInS, not both");
    }
    const expiresAt =
      options.expiresAt ?? (options.expiresInS === undefined ? undefined : new Date(Date.now() + options.expiresInS * 1000));
    const request: MessageInitShape<typeof CreateGrantRequestSchema> = {
      tool: typeof tool === "string" ? tool : tool.name,
      scope: { runId: options.runId ?? "", labels: { ...options.labels }, startedBy: options.startedBy ?? "" },
      condition: options.condition ?? "",
      argumentsSha256: options.argumentsSha256 ?? "",
      expiresAt: expiresAt === undefined ? undefined : timestampFromDate(expiresAt),
      maxUses: BigInt(options.maxUses ?? 0),
      reason: options.reason,
      requestId: options.requestId || randomUUID(),
    };
    const response = await this.call((o) => this.services.grant.createGrant(request, o), options);
    return grantFromProto(response.grant);
  }

  /** The grants in force, newest last, with their uses (`includeRevoked`: revoked, expired and used-up ones too). Roles approver, reader. */
  async listGrants(options: ListGrantsOptions = {}): Promise<Grant[]> {
    const request = { includeRevoked: options.includeRevoked ?? false, tool: options.tool ?? "" };
    const response = await this.call((o) => this.services.grant.listGrants(request, o), options);
    return response.grants.map(grantFromProto);
  }

  /**
   * Revokes a grant: it grants nothing from now on (role approver). Revoking a revoked grant changes nothing.
   * @throws GrantNotFound for an unknown id.
   */
  async revokeGrant(id: string, options: { reason: string } & CallControl): Promise<Grant> {
    const response = await this.call((o) => this.services.grant.revokeGrant({ id, reason: options.reason }, o), options);
    return grantFromProto(response.grant);
  }

  /** The handle of an existing run (no call is made). */
  run(runId: string): Run {
    return new Run(this, runId, false);
  }

  /** A run's summary, with its pending approvals. @throws RunNotFound */
  async getRun(runId: string, control: CallControl = {}): Promise<RunInfo> {
    const response = await this.call((o) => this.services.run.getRun({ runId }, o), control);
    if (response.run === undefined) throw new AaaError(`GetRun answered no run for ${runId}`);
    return runInfoFromProto(response.run);
  }

  /** Lists runs, newest first, filtered by status and labels: all pages (of `pageSize`, default up to 1000), up to `limit`. */
  async listRuns(
    options: { status?: RunStatus; labels?: Record<string, string>; limit?: number; pageSize?: number } & CallControl = {},
  ): Promise<RunInfo[]> {
    const { status, labels, limit } = options;
    const runs: RunInfo[] = [];
    let pageToken = "";
    for (;;) {
      const request = {
        status: status === undefined ? undefined : runStatusToProto(status),
        labels: { ...labels },
        pageSize: options.pageSize ?? Math.min(limit ?? 1000, 1000),
        pageToken,
      };
      const response = await this.call((o) => this.services.run.listRuns(request, o), options);
      runs.push(...response.runs.map(runInfoFromProto));
      pageToken = response.nextPageToken;
      if (pageToken === "" || (limit !== undefined && runs.length >= limit)) return runs.slice(0, limit);
    }
  }

  /** Creates a worker serving these tools and models; start it with `await worker.start()`. See {@link WorkerOptions}. */
  worker(options: WorkerOptions): Worker {
    return new Worker(this, options);
  }
}

export function modelSpec(model: string | OpenAIModel | readonly ScriptedStep[]): MessageInitShape<typeof ModelSpecSchema> {
  if (typeof model === "string") return { kind: { case: "worker", value: model } };
  if (model instanceof OpenAIModel) {
    const { model: name, provider, temperature, maxTokens } = model;
    return { kind: { case: "openai", value: { model: name, provider, temperature, maxTokens } } };
  }
  const steps = model.map((step): MessageInitShape<typeof ScriptedStepSchema> => {
    if (step instanceof Echo) return { reply: { case: "echo" as const, value: {} } };
    if (!(step instanceof Reply)) throw new TypeError("scripted steps are text(...), toolCall(...) or echo()");
    if (step.toolCalls.length === 0) return { reply: { case: "text" as const, value: step.content } };
    if (step.content !== "") throw new TypeError("a scripted step has either text or tool calls, not both");
    const calls = step.toolCalls.map((c) => ({ name: c.name, argumentsJson: stringify(c.arguments) }));
    return { reply: { case: "toolCalls" as const, value: { calls } } };
  });
  return { kind: { case: "scripted", value: { steps } } };
}

/** The handle of one run: follow its events, signal it, wait for its outcome. */
export class Run {
  /** Creates a handle; use {@link Client.startRun} or {@link Client.run}. */
  constructor(
    /** The client it uses. */
    readonly client: Client,
    /** The run's id. */
    readonly id: string,
    /** False when StartRun's requestId matched an earlier run (or the handle came from `client.run`). */
    readonly created: boolean,
  ) {}

  /** The run's summary, with its pending approvals. */
  get(control: CallControl = {}): Promise<RunInfo> {
    return this.client.getRun(this.id, control);
  }

  /**
   * Iterates over the run's events with seq greater than `afterSeq`: the
   * history, then (with `follow`, the default) live events, ending after the
   * terminal event (with `stopAtEnd`, the default). A dropped connection is
   * resumed from the last event received: no event is skipped or repeated.
   * Break out of the loop when done; the stream is then closed.
   */
  async *events(options: EventsOptions = {}): AsyncGenerator<Event, void, undefined> {
    const { follow = true, typePrefix = "", stopAtEnd = true } = options;
    let cursor = BigInt(options.afterSeq ?? 0);
    const backoff = new Backoff(this.client.retryMs);
    for (;;) {
      const stream = new AbortController();
      const signal = anySignal(stream.signal, this.client.closeSignal, options.signal);
      const request = { runId: this.id, afterSeq: cursor, follow, typePrefix, stopAtEnd };
      try {
        for await (const response of this.client.services.run.streamEvents(request, { signal })) {
          backoff.reset();
          const item = response.item;
          if (item.case === "caughtUp") {
            if (item.value.lastSeq > cursor) cursor = item.value.lastSeq;
          } else if (item.case === "event" && item.value.seq > cursor) {
            cursor = item.value.seq;
            const event = eventFromProto(item.value);
            yield event;
            if (stopAtEnd && TERMINAL_EVENT_TYPES.has(event.type)) return;
          }
        }
        return;
      } catch (err) {
        if (signal.aborted) throw cancelledBy(signal);
        const error = notCancelledError(err);
        if (error instanceof Unavailable && (await backoff.wait(signal))) continue;
        throw error;
      } finally {
        stream.abort();
      }
    }
  }

  /**
   * The first event of this type with seq greater than `afterSeq`, waiting for it if needed.
   * @throws AaaError (reason "STREAM_ENDED") if the run ends without one; `Timeout` after `timeoutMs`.
   */
  waitFor<K extends EventType>(type: K, options?: { afterSeq?: number } & CallControl): Promise<TypedEvent<K>>;
  /** The first event of this (application) type, waiting for it if needed. */
  waitFor(type: string, options?: { afterSeq?: number } & CallControl): Promise<Event>;
  async waitFor(type: string, options: { afterSeq?: number } & CallControl = {}): Promise<Event> {
    return this.withTimeout(`waiting for ${type}`, options, async (signal) => {
      for await (const event of this.events({ afterSeq: options.afterSeq, typePrefix: type, signal })) {
        if (event.type === type) return event;
      }
      throw new AaaError(`run ${this.id} ended without a ${type} event`, { reason: "STREAM_ENDED" });
    });
  }

  /**
   * Waits for the run to end and returns its {@link Outcome}. A failed or
   * cancelled run is an outcome, not an exception.
   */
  async result(control: CallControl = {}): Promise<Outcome> {
    return this.withTimeout("waiting for the run's end", control, async (signal) => {
      for await (const event of this.events({ typePrefix: "aaa.run.", signal })) {
        if (TERMINAL_EVENT_TYPES.has(event.type)) return outcomeFromEvent(event);
      }
      throw new AaaError(`the event stream of run ${this.id} ended before its terminal event`, { reason: "STREAM_ENDED" });
    });
  }

  private async withTimeout<T>(what: string, control: CallControl, body: (signal?: AbortSignal) => Promise<T>): Promise<T> {
    if (control.timeoutMs === undefined) return body(control.signal);
    const timer = AbortSignal.timeout(control.timeoutMs);
    try {
      return await body(anySignal(control.signal, timer));
    } catch (err) {
      if (timer.aborted && !control.signal?.aborted) throw timeoutError(what, control.timeoutMs);
      throw err;
    }
  }

  /**
   * Appends a client event: "aaa.approval.granted", "aaa.approval.denied",
   * "aaa.approval.edited", or an application type outside "aaa.". `data` is a
   * JSON object (bigints allowed). A fresh `requestId` makes retries safe.
   */
  async signal(
    type: string,
    data: Record<string, unknown> = {},
    options: { requestId?: string } & CallControl = {},
  ): Promise<SignalResult> {
    const request = { runId: this.id, type, dataJson: stringify(data), requestId: options.requestId || randomUUID() };
    const response = await this.client.call((o) => this.client.services.run.signal(request, toOwnerOf(this.id, o)), options);
    return signalResultFromProto(response);
  }

  /**
   * Grants one call. With `argumentsSha256` (from the {@link Approval} or the
   * request event) only those exact arguments; a mismatch throws `ArgumentsMismatch`.
   * Granting twice is harmless: the answer says `alreadyDecided`.
   *
   * A call that needs several approvers runs at the last grant it needs: before
   * that the answer's `decision` is "aaa.approval.voted", with `votes` of
   * `approvalsRequired`. The same approver granting again throws `AlreadyVoted`.
   * `approver` names the voter when auth is off (else the caller's address is used);
   * with auth on the caller is the approver.
   */
  approve(
    callId: string,
    options: { argumentsSha256?: string; comment?: string; approver?: string; requestId?: string } & CallControl = {},
  ): Promise<SignalResult> {
    const data: JsonObject = { call_id: callId };
    if (options.argumentsSha256) data.arguments_sha256 = options.argumentsSha256;
    if (options.comment) data.comment = options.comment;
    if (options.approver) data.approver = options.approver;
    return this.signal("aaa.approval.granted", data, options);
  }

  /**
   * Denies one call: the model reads a tool failure of type ApprovalDenied with `reason` as message.
   * One denial denies, however many grants the call needs.
   */
  deny(
    callId: string,
    reason?: string,
    options: { argumentsSha256?: string; approver?: string; requestId?: string } & CallControl = {},
  ): Promise<SignalResult> {
    const data: JsonObject = { call_id: callId };
    if (reason) data.reason = reason;
    if (options.argumentsSha256) data.arguments_sha256 = options.argumentsSha256;
    if (options.approver) data.approver = options.approver;
    return this.signal("aaa.approval.denied", data, options);
  }

  /**
   * Replaces a pending call's arguments: the call is resolved as edited and
   * never runs; a new call with `args` (the answer's `newCallId`) is requested
   * in its place and needs its own grant, bound to `newArgumentsSha256`. With
   * `grant: true` the editor's grant of the new arguments goes with the edit
   * (it runs at once unless it needs more approvers). The model reads the
   * result under its original call id, after a note giving the new arguments
   * and `reason`. `argumentsSha256` is the digest of the arguments being
   * edited, as shown (a stale one throws `ArgumentsMismatch`). Arguments that
   * do not fit the tool's schema, or that repeat the requested ones, throw
   * `InvalidField` (field "data_json.arguments"). Editing a call already
   * decided changes nothing: the answer says `alreadyDecided`.
   */
  edit(
    callId: string,
    args: Record<string, unknown>,
    options: { argumentsSha256?: string; reason?: string; grant?: boolean; approver?: string; requestId?: string } & CallControl = {},
  ): Promise<SignalResult> {
    const data: Record<string, unknown> = { call_id: callId, arguments: args };
    if (options.argumentsSha256) data.arguments_sha256 = options.argumentsSha256;
    if (options.reason) data.reason = options.reason;
    if (options.grant) data.grant = true;
    if (options.approver) data.approver = options.approver;
    return this.signal("aaa.approval.edited", data, options);
  }

  /** Cancels the run; returns the seq of aaa.run.cancelled (0 if it was already cancelled). */
  async cancel(reason = "", control: CallControl = {}): Promise<number> {
    const response = await this.client.call(
      (o) => this.client.services.run.cancelRun({ runId: this.id, reason }, toOwnerOf(this.id, o)),
      control,
    );
    return Number(response.seq);
  }
}

/** Pending approvals across runs: `client.approvals.list()` and `client.approvals.watch()`. */
export class Approvals {
  /** Created by the client. */
  constructor(private readonly client: Client) {}

  /**
   * Lists pending approval requests, oldest run first: all pages (of `pageSize`, default up to 1000), up to `limit`.
   * With `decidable`, only the calls the caller may decide: those whose approver groups include one of its own,
   * and those that name none (with auth off, every call).
   */
  async list(
    options: {
      tool?: string;
      runId?: string;
      labels?: Record<string, string>;
      limit?: number;
      pageSize?: number;
      decidable?: boolean;
    } & CallControl = {},
  ): Promise<Approval[]> {
    const { tool = "", runId = "", labels, limit, decidable = false } = options;
    const found: Approval[] = [];
    let pageToken = "";
    for (;;) {
      const pageSize = options.pageSize ?? Math.min(limit ?? 1000, 1000);
      const request = { tool, runId, labels: { ...labels }, pageSize, pageToken, decidable };
      const response = await this.client.call((o) => this.client.services.approval.listApprovals(request, o), options);
      found.push(...response.approvals.map(approvalFromProto));
      pageToken = response.nextPageToken;
      if (pageToken === "" || (limit !== undefined && found.length >= limit)) return found.slice(0, limit);
    }
  }

  /**
   * Iterates over pending approvals, then over changes, until you break out
   * (or abort `signal`): each pending request (`kind: "requested"`,
   * `snapshot: true`), one `snapshot_complete`, then each new request, each
   * vote of a call that needs several grants (`kind: "voted"`) and each
   * resolution (`kind: "resolved"`) as it becomes durable. With
   * `resumeToken` (an item's `resumeToken`) the snapshot is skipped and
   * exactly the changes after that item come; `afterPosition` (an item's
   * `position`) is the older form, exact only on a log with one committer. A
   * dropped connection is resumed with the last resume token seen (the last
   * position, from a server that sends no tokens). A snapshot cut short is
   * restarted without repeating what was already yielded; a request yielded
   * before the cut that is no longer pending in the new snapshot is then
   * reported `resolved` with outcome "unspecified" (it was decided or expired
   * meanwhile).
   */
  async *watch(options: WatchOptions = {}): AsyncGenerator<ApprovalWatchItem, void, undefined> {
    const { tool = "", runId = "", labels, heartbeatS = 0, decidable = false } = options;
    let token = options.resumeToken || undefined;
    let position = options.afterPosition === undefined ? undefined : BigInt(options.afterPosition);
    const yielded = new Map<string, Approval>(); // snapshot items already given, in case the snapshot restarts
    const backoff = new Backoff(this.client.retryMs);
    for (;;) {
      const stream = new AbortController();
      const signal = anySignal(stream.signal, this.client.closeSignal, options.signal);
      // One resume point: the server refuses an afterPosition past its head even beside a token, and a token says more.
      const resume = token !== undefined ? { resumeToken: token } : { afterPosition: position };
      const request = { tool, runId, labels: { ...labels }, ...resume, heartbeatS, decidable };
      const inThisSnapshot = new Set<string>();
      try {
        for await (const response of this.client.services.approval.watchApprovals(request, { signal })) {
          backoff.reset();
          const at = Number(response.position);
          const resumeToken = response.resumeToken;
          const item = response.item;
          const inSnapshot = token === undefined && position === undefined;
          if (!inSnapshot || item.case === "snapshotComplete") {
            // The snapshot's requests carry no token: resuming there would skip the rest of it.
            token = resumeToken || token;
            position = response.position;
          }
          if (inSnapshot && item.case === "requested") {
            const key = `${item.value.runId}\u0000${item.value.callId}`;
            inThisSnapshot.add(key);
            if (yielded.has(key)) continue;
            const approval = approvalFromProto(item.value);
            yielded.set(key, approval);
            yield { kind: "requested", approval, snapshot: true, position: at, resumeToken };
          } else if (item.case === "snapshotComplete") {
            for (const [key, gone] of yielded) {
              if (inThisSnapshot.has(key)) continue;
              const resolution = {
                runId: gone.runId,
                callId: gone.callId,
                tool: gone.tool,
                outcome: "unspecified" as const,
                reason: "",
                seq: 0,
                replacedBy: "",
              };
              yield { kind: "resolved", resolution, position: at, resumeToken };
            }
            yielded.clear();
            yield { kind: "snapshot_complete", pending: item.value.pending, position: at, resumeToken };
          } else if (item.case === "requested") {
            const approval = approvalFromProto(item.value);
            yield { kind: "requested", approval, snapshot: false, position: at, resumeToken };
          } else if (item.case === "voted") {
            yield { kind: "voted", voted: votedFromProto(item.value), position: at, resumeToken };
          } else if (item.case === "resolved") {
            yield { kind: "resolved", resolution: resolutionFromProto(item.value), position: at, resumeToken };
          }
        }
        return;
      } catch (err) {
        if (signal.aborted) throw cancelledBy(signal);
        const error = notCancelledError(err);
        if (error instanceof Unavailable && (await backoff.wait(signal))) continue;
        throw error;
      } finally {
        stream.abort();
      }
    }
  }
}
