/**
 * The SDK's plain data types (events, runs, approvals, model messages and
 * replies) and their conversion from the generated wire messages.
 *
 * JSON text fields of the wire (`data_json`, `arguments_json`, ...) are kept
 * as text and also parsed exactly (see json.ts). `seq` and `position` are
 * `uint64` on the wire and `number`s here: they count events, so they stay far
 * below 2^53.
 *
 * @module
 */

import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { parse, parseObject, stringify, type JsonObject, type JsonValue } from "./json.js";
import * as approvalPb from "./gen/aaa/v1/approval_pb.js";
import type * as grantPb from "./gen/aaa/v1/grant_pb.js";
import type * as policyPb from "./gen/aaa/v1/policy_pb.js";
import * as runPb from "./gen/aaa/v1/run_pb.js";
import * as typesPb from "./gen/aaa/v1/types_pb.js";
import * as workerPb from "./gen/aaa/v1/worker_pb.js";

/** An error as recorded in events and reported by workers, e.g. `{type: "ApprovalDenied", message: "over the limit"}`. */
export interface ErrorDetail {
  /** A short machine-readable type: "ApprovalDenied", "DeadlineExceeded", "AttemptLost", a tool's error class name... */
  type: string;
  /** A human-readable message. */
  message: string;
}

/** Who caused an event: the engine, a worker (`name` is its identity), a client, or the approval policy (`name` is the rule). */
export interface Actor {
  /** The kind of actor. */
  kind: "engine" | "worker" | "client" | "policy" | "grant" | "unspecified";
  /** Worker identity, caller name, the policy rule or the standing grant's id that granted or denied; empty for the engine. */
  name: string;
  /**
   * For a worker with auth on: the authenticated principal that served the task (an identity
   * alone is only a label). Empty otherwise: a client's name already is its principal.
   */
  principal: string;
}

/** One event of a run's append-only log. `D` is the type of its data (see {@link EventDataMap}). */
export interface Event<D = JsonObject> {
  /** The run this event belongs to. */
  runId: string;
  /** Position in the run's log: dense, from 1. Pass it as `afterSeq` to resume after this event. */
  seq: number;
  /** Position in the server's global log, in commit order. */
  position: number;
  /** Unique id of the event. */
  id: string;
  /** Event type, for example "aaa.tool.requested". */
  type: string;
  /** The event's data, parsed exactly (big integers are bigints). */
  data: D;
  /** The event's data as the server sent it (JSON text). */
  dataJson: string;
  /** When the event was appended (server clock). */
  time: Date;
  /** Who caused it. */
  actor: Actor;
}

/** A tool call as recorded in `aaa.llm.completed`. */
export interface RecordedToolCall {
  /** The call's id. */
  call_id: string;
  /** The tool's name. */
  name: string;
  /** The arguments object. */
  arguments: JsonObject;
}

/**
 * The data of each event type of the catalogue at the top of types.proto.
 * Keys are as on the wire (snake_case): this is the run's JSON data.
 */
export interface EventDataMap {
  /** The run started: its task, model, tools (definitions as snapshotted), budget and labels. */
  "aaa.run.started": {
    task: string;
    system?: string;
    model: JsonObject;
    tools: JsonObject[];
    budget: JsonObject;
    labels: Record<string, string>;
    deadline_at_ms?: number;
  };
  /** A model call was requested (attempt > 1: a retry). */
  "aaa.llm.requested": { call_id: string; model: string; attempt: number };
  /** The model replied. */
  "aaa.llm.completed": { call_id: string; message: { content: string; tool_calls: RecordedToolCall[] } };
  /** A model call failed. */
  "aaa.llm.failed": { call_id: string; attempt: number; error: ErrorDetail };
  /** The model asked for a tool call (or a reviewer's edit did: `edited_from` names the call it replaces). */
  "aaa.tool.requested": {
    call_id: string;
    name: string;
    arguments: JsonObject;
    requires_approval: boolean;
    edited_from?: string;
  };
  /**
   * A gated call waits for a decision (`approvals_required` only when more than 1; `approvers`,
   * the groups that may decide it, when it names some; `policy` when a policy rule set what the
   * decision needs, or failed and left the call to the tool's settings).
   */
  "aaa.approval.requested": {
    call_id: string;
    name: string;
    arguments: JsonObject;
    arguments_sha256: string;
    expires_at_ms?: number;
    approvals_required?: number;
    edited_from?: string;
    approvers?: string[];
    approval_timeout_s?: number;
    policy?: PolicyDecision & { error?: string };
  };
  /**
   * A human granted the call; for a call that needed several grants, `approvers` lists them all.
   * Granted by the policy: the actor's kind is "policy" and `policy` names the rule.
   * Granted by a standing grant: the actor's kind is "grant", its name and `grant.id` the grant's id.
   */
  "aaa.approval.granted": {
    call_id: string;
    name?: string;
    arguments_sha256?: string;
    comment?: string;
    approver?: string;
    approvers?: string[];
    policy?: PolicyDecision;
    grant?: { id: string; reason: string; created_by: string };
  };
  /** A grant of a call that needs several, not yet the last one. */
  "aaa.approval.voted": {
    call_id: string;
    name: string;
    arguments_sha256: string;
    approver: string;
    comment?: string;
    votes: number;
    approvals_required: number;
  };
  /** A reviewer edited the arguments: `call_id` never runs, `new_call_id` (requested next) takes its place. */
  "aaa.approval.edited": {
    call_id: string;
    name: string;
    arguments_sha256: string;
    new_call_id: string;
    new_arguments: JsonObject;
    new_arguments_sha256: string;
    reason: string;
    grant: boolean;
    approver?: string;
  };
  /** A human denied the call (or its approval timed out: reason "timeout"; or a policy rule denied it: `policy`). */
  "aaa.approval.denied": {
    call_id: string;
    name?: string;
    reason?: string;
    arguments_sha256?: string;
    approver?: string;
    policy?: PolicyDecision;
  };
  /** The request expired: reason "deadline" or "run_cancelled". */
  "aaa.approval.expired": { call_id: string; name: string; reason: string };
  /** An attempt was handed to a worker. */
  "aaa.tool.started": { call_id: string; attempt: number; worker: string };
  /** The tool's output. */
  "aaa.tool.completed": { call_id: string; attempt: number; output: JsonValue };
  /** An attempt failed and will be retried after `delay_s`. */
  "aaa.tool.retrying": { call_id: string; attempt: number; error: ErrorDetail; delay_s: number };
  /** The call failed for good (attempt 0: no attempt ran, e.g. ApprovalDenied). */
  "aaa.tool.failed": { call_id: string; attempt: number; error: ErrorDetail };
  /** The run completed with a value, `{text}`. */
  "aaa.run.completed": { value: { text: string } & JsonObject };
  /** The run failed: DeadlineExceeded, BudgetExceeded, ModelFailed, ScriptExhausted. */
  "aaa.run.failed": { error: ErrorDetail };
  /** The run was cancelled. */
  "aaa.run.cancelled": { reason: string };
}

/** The rule of the approval policy that decided, and the sha256 of the policy file it was in. */
export interface PolicyDecision {
  rule: string;
  sha256: string;
}

/** An event type of the catalogue. */
export type EventType = keyof EventDataMap;

/** An event of a catalogue type, with its data typed. */
export type TypedEvent<K extends EventType> = Event<EventDataMap[K]> & { type: K };

/** The event types that end a run. */
export const TERMINAL_EVENT_TYPES: ReadonlySet<string> = new Set([
  "aaa.run.completed",
  "aaa.run.failed",
  "aaa.run.cancelled",
]);

/** Narrows an event to a catalogue type: `if (isEvent(e, "aaa.tool.completed")) e.data.output`. */
export function isEvent<K extends EventType>(event: Event, type: K): event is Event & TypedEvent<K> {
  return event.type === type;
}

/** Where a run is in its lifecycle. */
export type RunStatus = "running" | "waiting_for_approval" | "completed" | "failed" | "cancelled" | "unspecified";

const RUN_STATUS: Record<runPb.RunStatus, RunStatus> = {
  [runPb.RunStatus.UNSPECIFIED]: "unspecified",
  [runPb.RunStatus.RUNNING]: "running",
  [runPb.RunStatus.WAITING_FOR_APPROVAL]: "waiting_for_approval",
  [runPb.RunStatus.COMPLETED]: "completed",
  [runPb.RunStatus.FAILED]: "failed",
  [runPb.RunStatus.CANCELLED]: "cancelled",
};

/** The wire enum value of a {@link RunStatus}. */
export function runStatusToProto(status: RunStatus): runPb.RunStatus {
  const entry = Object.entries(RUN_STATUS).find(([, name]) => name === status);
  if (entry === undefined) throw new TypeError(`unknown run status ${JSON.stringify(status)}`);
  return Number(entry[0]) as runPb.RunStatus;
}

/** A run's summary (GetRun, ListRuns). */
export interface RunInfo {
  /** The run's id. */
  runId: string;
  /** Where it is in its lifecycle. */
  status: RunStatus;
  /** Its task (first user message). */
  task: string;
  /** "scripted", the worker-served model's name, or "openai:MODEL@PROVIDER". */
  model: string;
  /** Names of the tools it may call. */
  tools: string[];
  /** Its labels. */
  labels: Record<string, string>;
  /** When it started. */
  createdAt?: Date;
  /** When its last event was appended. */
  updatedAt?: Date;
  /** When its deadline passes, if it has one. */
  deadlineAt?: Date;
  /** seq of its last event. */
  lastSeq: number;
  /** For a completed run: the value of aaa.run.completed, e.g. `{text: "..."}`. */
  result?: JsonValue;
  /** For a failed or cancelled run: why. */
  error?: ErrorDetail;
  /** Approvals it waits for (filled by `getRun` only). */
  pendingApprovals: Approval[];
  /** Tokens its built-in model calls used (zeros for other models). */
  usage: TokenUsage;
}

/** A pending approval request: a tool call waiting for a human decision. */
export interface Approval {
  /** The run that waits. */
  runId: string;
  /** The call to approve or deny. */
  callId: string;
  /** The tool's name. */
  tool: string;
  /** The exact arguments the tool gets if granted. */
  arguments: JsonObject;
  /** The same as canonical JSON text (sorted keys, no spaces). */
  argumentsJson: string;
  /** Hex SHA-256 of `argumentsJson`; pass it to `approve` to grant exactly these arguments. */
  argumentsSha256: string;
  /** Grants from distinct approvers the call needs before it runs (1 unless its tool or run asks for more). */
  approvalsRequired: number;
  /** The grants cast so far, oldest first (fewer than `approvalsRequired`). */
  votes: Vote[];
  /** For a call a reviewer edited: the id of the call it replaces; "" otherwise. */
  editedFrom: string;
  /** The approver groups that may decide it (from its tool or a policy rule); empty: any approver. */
  approvers: string[];
  /** When it was requested. */
  requestedAt?: Date;
  /** When it expires, if it does. */
  expiresAt?: Date;
  /** The run's labels. */
  labels: Record<string, string>;
  /** seq of the aaa.approval.requested event. */
  seq: number;
  /** Global position of that event. */
  position: number;
  /** The run's task (its first user message): what the call is for. */
  task: string;
}

/** One approver's grant of a call that needs several. */
export interface Vote {
  /** The principal with auth on; with auth off the grant's `approver`, else the caller's address. */
  approver: string;
  /** When the grant was recorded. */
  time?: Date;
  /** The grant's comment. */
  comment: string;
}

/** A grant of a call that needs several, not yet the last one (`client.approvals.watch()`). */
export interface ApprovalVoted {
  /** The run. */
  runId: string;
  /** The call. */
  callId: string;
  /** The tool's name. */
  tool: string;
  /** The grant. */
  vote: Vote;
  /** Grants so far, this one included. */
  votes: number;
  /** Grants the call needs. */
  approvalsRequired: number;
  /** seq of the aaa.approval.voted event. */
  seq: number;
}

/** How an approval request ended ("edited": a reviewer changed the arguments; the call never runs, `replacedBy` does). */
export type ApprovalOutcome = "granted" | "denied" | "expired" | "edited" | "unspecified";

/** A request that was granted, denied, edited or expired. */
export interface ApprovalResolution {
  /** The run. */
  runId: string;
  /** The call. */
  callId: string;
  /** The tool's name. */
  tool: string;
  /** What happened. */
  outcome: ApprovalOutcome;
  /** The denial's or expiry's reason; a grant's comment. */
  reason: string;
  /** seq of the resolving event. */
  seq: number;
  /** When it was resolved. */
  time?: Date;
  /** For outcome "edited": the call that takes this one's place (it is requested next); "" otherwise. */
  replacedBy: string;
}

/**
 * One item of `client.approvals.watch()`: each pending request of the
 * snapshot (`snapshot: true`), one `snapshot_complete`, then each new request,
 * each vote of a call that needs several grants, and each resolution.
 * `resumeToken` is where the item leaves the stream: pass the last one handled
 * as `resumeToken` to resume after it ("" on the snapshot's requests).
 * `position` is the item's position in the log, the older resume cursor
 * (`afterPosition`).
 */
export type ApprovalWatchItem =
  | { kind: "requested"; approval: Approval; snapshot: boolean; position: number; resumeToken: string }
  | { kind: "voted"; voted: ApprovalVoted; position: number; resumeToken: string }
  | { kind: "resolved"; resolution: ApprovalResolution; position: number; resumeToken: string }
  | { kind: "snapshot_complete"; pending: number; position: number; resumeToken: string };

/** Signal's answer. */
export interface SignalResult {
  /** seq of the appended event; 0 when nothing was appended. */
  seq: number;
  /** For decisions: true when the call had already been decided (or had expired) and this changed nothing. */
  alreadyDecided: boolean;
  /**
   * For decisions: the decision that stands ("aaa.approval.granted", "aaa.approval.denied",
   * "aaa.approval.edited" or "aaa.approval.expired"), or "aaa.approval.voted" for a grant
   * that is not yet the last one the call needs.
   */
  decision: string;
  /** For a grant (or an edit with `grant`) of a call that needs several: grants so far, this one included. */
  votes: number;
  /** For a grant or an edit: how many grants the call needs. */
  approvalsRequired: number;
  /** For an edit: the call that takes the edited call's place (grant that one); "" otherwise. */
  newCallId: string;
  /** For an edit: the digest of the new call's arguments, to bind its grant to; "" otherwise. */
  newArgumentsSha256: string;
}

/** A call to decide in a batch: an {@link Approval} will do, as it carries all three. */
export interface DecisionItem {
  /** The run. */
  readonly runId: string;
  /** The call. */
  readonly callId: string;
  /** Hex SHA-256 of the arguments the reviewer was shown (required: a batch never decides blind). */
  readonly argumentsSha256: string;
}

/**
 * How one item of a batch went: "decided" (recorded: a grant, a vote or a denial),
 * "already_decided" (decided or expired before, or this approver already voted: then
 * `errorReason` is "ALREADY_VOTED"),
 * "mismatch" (the digest is not the call's), "not_found" (no such run or pending call),
 * "refused" (see `errorReason`: a finished run, separation of duties...), "not_applied"
 * (`allOrNothing` and another item was not decided). Only "decided" recorded anything.
 */
export type DecisionStatus = "decided" | "already_decided" | "mismatch" | "not_found" | "refused" | "not_applied" | "unspecified";

/** The result of one item of `client.decideApprovals()`. */
export interface DecisionResult {
  /** The item's run. */
  runId: string;
  /** The item's call. */
  callId: string;
  /** What happened. */
  status: DecisionStatus;
  /**
   * For "decided": the event recorded ("aaa.approval.granted", "aaa.approval.voted" or
   * "aaa.approval.denied"); for "already_decided": the decision that stands.
   */
  decision: string;
  /** seq of the recorded event; 0 when nothing was recorded. */
  seq: number;
  /** Why nothing was recorded, as an ErrorReason name ("RUN_FINISHED", "ARGUMENTS_MISMATCH", "ALREADY_VOTED"...); "" otherwise. */
  errorReason: string;
  /** The refusal's message. */
  errorMessage: string;
}

/** How a run ended: its terminal event, read. A failed run is an outcome, not an exception. */
export interface Outcome {
  /** "completed", "failed" or "cancelled". */
  status: "completed" | "failed" | "cancelled";
  /** True when the run completed. */
  ok: boolean;
  /** For a completed run: the value, `{text}`. */
  value?: JsonObject;
  /** For a completed run: `value.text`; "" otherwise. */
  text: string;
  /** For a failed run its error; for a cancelled one `{type: "Cancelled", message: reason}`. */
  error?: ErrorDetail;
  /** The terminal event itself. */
  event: Event;
}

/** The role of a message in a model's conversation. */
export type Role = "system" | "user" | "assistant" | "tool" | "unspecified";

/** A tool call made by a model, as a model handler sees it. */
export interface ToolCall {
  /** The call's id (minted by the engine). */
  callId: string;
  /** The tool's name. */
  name: string;
  /** The arguments, parsed exactly. */
  arguments: JsonObject;
  /** The arguments as canonical JSON text. */
  argumentsJson: string;
}

/** One message of a run's conversation, as handed to a model handler. */
export interface Message {
  /** Who spoke. */
  role: Role;
  /** The text; for a tool message the tool's output (a string output unquoted, anything else as JSON text) or "Type: message" on failure. */
  content: string;
  /** For assistant messages: the tool calls the model asked for. */
  toolCalls: ToolCall[];
  /** For tool messages: the call this answers. */
  callId: string;
  /** For tool messages: the tool's name. */
  name: string;
  /** For tool messages: set when the call failed (ApprovalDenied included). */
  error?: ErrorDetail;
}

/** A tool as offered to a model. */
export interface ToolInfo {
  /** The tool's name. */
  name: string;
  /** What it does. */
  description: string;
  /** JSON schema of its arguments. */
  parameters: JsonObject;
  /** Whether its calls wait for approval. */
  requiresApproval: boolean;
}

/** What a model handler gets: the conversation so far and the tools it may call. */
export interface ModelRequest {
  /** The model's name. */
  model: string;
  /** The conversation, first message first. */
  messages: Message[];
  /** The tools the model may call. */
  tools: ToolInfo[];
}

/** A tool call in a reply: which tool, with which arguments. */
export interface ReplyToolCall {
  /** The tool's name. */
  name: string;
  /** The arguments object (bigints allowed; written with exact JSON). */
  arguments: Record<string, unknown>;
}

/**
 * A model's reply: text, tool calls, or both. Build it with {@link text} and
 * {@link toolCall}; combine with `.and()`: `text("paying").and(toolCall("wire_money", {...}))`.
 */
export class Reply {
  /** Creates a reply; prefer {@link text} and {@link toolCall}. */
  constructor(
    /** The reply's text. A reply without tool calls ends the run with `{text: content}`. */
    readonly content: string = "",
    /** The tool calls to make. */
    readonly toolCalls: readonly ReplyToolCall[] = [],
  ) {}

  /** This reply followed by others: texts joined, tool calls concatenated. */
  and(...others: Reply[]): Reply {
    const all = [this, ...others];
    return new Reply(
      all.map((r) => r.content).filter((c) => c !== "").join(""),
      all.flatMap((r) => r.toolCalls),
    );
  }
}

/** A scripted-model step that replies with the content of the conversation's last message. */
export class Echo {
  /** Discriminates echo steps. */
  readonly echo = true;
}

/** A reply with text only: the run completes with `{text: content}`. */
export function text(content: string): Reply {
  return new Reply(content);
}

/** A reply that calls one tool (by name or as a `tool(...)` object) with these arguments. */
export function toolCall(tool: string | { readonly name: string }, args: Record<string, unknown> = {}): Reply {
  return new Reply("", [{ name: typeof tool === "string" ? tool : tool.name, arguments: args }]);
}

/** A scripted-model step: reply with the conversation's last message (a tool's output, say). */
export function echo(): Echo {
  return new Echo();
}

/** The server's built-in OpenAI-compatible model (see docs/models.md); make one with {@link openai}. */
export class OpenAIModel {
  constructor(
    /** What the provider serves, e.g. "gpt-4.1-mini"; "" for the provider's default_model. */
    readonly model: string,
    /** A provider of the server's --models file; "" for its default. */
    readonly provider: string,
    /** Sampling temperature (0 to 2); unset: the provider's default. */
    readonly temperature?: number,
    /** Most tokens one reply may have; 0: not sent. */
    readonly maxTokens: number = 0,
  ) {}
}

/** The built-in model for `startRun`: `model: openai("gpt-4.1-mini", { provider: "openai" })`. Keys stay in the server. */
export function openai(
  model = "",
  options: { provider?: string; temperature?: number; maxTokens?: number } = {},
): OpenAIModel {
  return new OpenAIModel(model, options.provider ?? "", options.temperature, options.maxTokens ?? 0);
}

/** Tokens a run's built-in model calls used, as the provider reported them. */
export interface TokenUsage {
  promptTokens: number;
  completionTokens: number;
  totalTokens: number;
}

/** A step of the built-in scripted model: a `text(...)`, a `toolCall(...)` (or several, combined with `.and()`), or `echo()`. */
export type ScriptedStep = Reply | Echo;

// ---- conversions from wire messages ----

/** The Date of an optional Timestamp. */
export function optionalDate(ts: Timestamp | undefined): Date | undefined {
  return ts === undefined ? undefined : timestampDate(ts);
}

function errorDetail(e: typesPb.ErrorDetail | undefined): ErrorDetail | undefined {
  return e === undefined ? undefined : { type: e.type, message: e.message };
}

const ACTOR_KIND: Record<typesPb.ActorKind, Actor["kind"]> = {
  [typesPb.ActorKind.UNSPECIFIED]: "unspecified",
  [typesPb.ActorKind.ENGINE]: "engine",
  [typesPb.ActorKind.WORKER]: "worker",
  [typesPb.ActorKind.CLIENT]: "client",
  [typesPb.ActorKind.POLICY]: "policy",
  [typesPb.ActorKind.GRANT]: "grant",
};

/** Converts a wire Event. */
export function eventFromProto(e: typesPb.Event): Event {
  return {
    runId: e.runId,
    seq: Number(e.seq),
    position: Number(e.position),
    id: e.id,
    type: e.type,
    data: e.dataJson === "" ? {} : parseObject(e.dataJson),
    dataJson: e.dataJson,
    time: optionalDate(e.time) ?? new Date(0),
    actor: {
      kind: ACTOR_KIND[e.actor?.kind ?? typesPb.ActorKind.UNSPECIFIED] ?? "unspecified",
      name: e.actor?.name ?? "",
      principal: e.actor?.principal ?? "",
    },
  };
}

/** Converts a wire Approval. */
export function approvalFromProto(a: approvalPb.Approval): Approval {
  return {
    runId: a.runId,
    callId: a.callId,
    tool: a.tool,
    arguments: a.argumentsJson === "" ? {} : parseObject(a.argumentsJson),
    argumentsJson: a.argumentsJson,
    argumentsSha256: a.argumentsSha256,
    requestedAt: optionalDate(a.requestedAt),
    expiresAt: optionalDate(a.expiresAt),
    labels: { ...a.labels },
    seq: Number(a.seq),
    position: Number(a.position),
    task: a.task,
    approvalsRequired: a.approvalsRequired,
    votes: a.votes.map(voteFromProto),
    editedFrom: a.editedFrom,
    approvers: [...a.approvers],
  };
}

function voteFromProto(v: approvalPb.Vote | undefined): Vote {
  return { approver: v?.approver ?? "", time: optionalDate(v?.time), comment: v?.comment ?? "" };
}

/** Converts a wire ApprovalVoted. */
export function votedFromProto(v: approvalPb.ApprovalVoted): ApprovalVoted {
  return {
    runId: v.runId,
    callId: v.callId,
    tool: v.tool,
    vote: voteFromProto(v.vote),
    votes: v.votes,
    approvalsRequired: v.approvalsRequired,
    seq: Number(v.seq),
  };
}

const OUTCOME: Record<approvalPb.ApprovalOutcome, ApprovalOutcome> = {
  [approvalPb.ApprovalOutcome.UNSPECIFIED]: "unspecified",
  [approvalPb.ApprovalOutcome.GRANTED]: "granted",
  [approvalPb.ApprovalOutcome.DENIED]: "denied",
  [approvalPb.ApprovalOutcome.EXPIRED]: "expired",
  [approvalPb.ApprovalOutcome.EDITED]: "edited",
};

/** Converts a wire ApprovalResolution. */
export function resolutionFromProto(r: approvalPb.ApprovalResolution): ApprovalResolution {
  return {
    runId: r.runId,
    callId: r.callId,
    tool: r.tool,
    outcome: OUTCOME[r.outcome] ?? "unspecified",
    reason: r.reason,
    seq: Number(r.seq),
    time: optionalDate(r.time),
    replacedBy: r.replacedBy,
  };
}

/** Converts a wire SignalResponse. */
export function signalResultFromProto(r: runPb.SignalResponse): SignalResult {
  return {
    seq: Number(r.seq),
    alreadyDecided: r.alreadyDecided,
    decision: r.decision,
    votes: r.votes,
    approvalsRequired: r.approvalsRequired,
    newCallId: r.newCallId,
    newArgumentsSha256: r.newArgumentsSha256,
  };
}

const DECISION_STATUS: Record<approvalPb.DecisionStatus, DecisionStatus> = {
  [approvalPb.DecisionStatus.UNSPECIFIED]: "unspecified",
  [approvalPb.DecisionStatus.DECIDED]: "decided",
  [approvalPb.DecisionStatus.ALREADY_DECIDED]: "already_decided",
  [approvalPb.DecisionStatus.MISMATCH]: "mismatch",
  [approvalPb.DecisionStatus.NOT_FOUND]: "not_found",
  [approvalPb.DecisionStatus.REFUSED]: "refused",
  [approvalPb.DecisionStatus.NOT_APPLIED]: "not_applied",
};

/** Converts a wire DecisionResult. */
export function decisionResultFromProto(r: approvalPb.DecisionResult): DecisionResult {
  return {
    runId: r.runId,
    callId: r.callId,
    status: DECISION_STATUS[r.status] ?? "unspecified",
    decision: r.decision,
    seq: Number(r.seq),
    errorReason: r.errorReason,
    errorMessage: r.errorMessage,
  };
}

/** Converts a wire Run. */
export function runInfoFromProto(r: runPb.Run): RunInfo {
  return {
    runId: r.runId,
    status: RUN_STATUS[r.status] ?? "unspecified",
    task: r.task,
    model: r.model,
    tools: [...r.tools],
    labels: { ...r.labels },
    createdAt: optionalDate(r.createdAt),
    updatedAt: optionalDate(r.updatedAt),
    deadlineAt: optionalDate(r.deadlineAt),
    lastSeq: Number(r.lastSeq),
    result: r.resultJson === "" ? undefined : parse(r.resultJson),
    error: errorDetail(r.error),
    pendingApprovals: r.pendingApprovals.map(approvalFromProto),
    usage: {
      promptTokens: Number(r.usage?.promptTokens ?? 0n),
      completionTokens: Number(r.usage?.completionTokens ?? 0n),
      totalTokens: Number(r.usage?.totalTokens ?? 0n),
    },
  };
}

/** Reads a run's terminal event as an {@link Outcome}. */
export function outcomeFromEvent(event: Event): Outcome {
  switch (event.type) {
    case "aaa.run.completed": {
      const value = (event.data.value ?? {}) as JsonObject;
      return { status: "completed", ok: true, value, text: typeof value.text === "string" ? value.text : "", event };
    }
    case "aaa.run.failed":
      return { status: "failed", ok: false, text: "", error: event.data.error as unknown as ErrorDetail, event };
    case "aaa.run.cancelled":
      return {
        status: "cancelled",
        ok: false,
        text: "",
        error: { type: "Cancelled", message: String(event.data.reason ?? "") },
        event,
      };
    default:
      throw new TypeError(`${event.type} is not a terminal event`);
  }
}

const ROLE: Record<typesPb.Role, Role> = {
  [typesPb.Role.UNSPECIFIED]: "unspecified",
  [typesPb.Role.SYSTEM]: "system",
  [typesPb.Role.USER]: "user",
  [typesPb.Role.ASSISTANT]: "assistant",
  [typesPb.Role.TOOL]: "tool",
};

/** Converts a wire ModelTask into what a model handler gets. */
export function modelRequestFromProto(task: workerPb.ModelTask): ModelRequest {
  return {
    model: task.model,
    messages: task.messages.map((m) => ({
      role: ROLE[m.role] ?? "unspecified",
      content: m.content,
      toolCalls: m.toolCalls.map((c) => ({
        callId: c.callId,
        name: c.name,
        arguments: c.argumentsJson === "" ? {} : parseObject(c.argumentsJson),
        argumentsJson: c.argumentsJson,
      })),
      callId: m.callId,
      name: m.name,
      error: errorDetail(m.error),
    })),
    tools: task.tools.map((t) => ({
      name: t.name,
      description: t.description,
      parameters: t.parametersJson === "" ? {} : parseObject(t.parametersJson),
      requiresApproval: t.requiresApproval,
    })),
  };
}

/** Converts a reply to the wire ModelReply. */
export function replyToProto(reply: Reply): { content: string; toolCalls: { name: string; argumentsJson: string }[] } {
  return {
    content: reply.content,
    toolCalls: reply.toolCalls.map((c) => ({ name: c.name, argumentsJson: stringify(c.arguments) })),
  };
}

/** The approval policy a server runs with (`client.getPolicy()`, `client.reloadPolicy()`). */
export interface Policy {
  /** False when the server runs without a policy (the other fields are then empty). */
  loaded: boolean;
  /** Hex SHA-256 of the policy file as loaded; events a rule decided carry it. */
  sha256: string;
  /** The rules' names, in the order they are tried. */
  rules: string[];
  /** The file it was loaded from. */
  file: string;
}

/** Converts a wire GetPolicyResponse (absent: no policy). */
export function policyFromProto(p: policyPb.GetPolicyResponse | undefined): Policy {
  return { loaded: p?.loaded ?? false, sha256: p?.sha256 ?? "", rules: [...(p?.rules ?? [])], file: p?.file ?? "" };
}

/** Which runs' calls a standing grant covers; every field set must hold (empty: any). */
export interface GrantScope {
  /** Only this run's calls. */
  runId: string;
  /** Only runs with every one of these labels, with these values. */
  labels: Record<string, string>;
  /** Only runs started by this principal. */
  startedBy: string;
}

/** A standing grant: an approver's decision made in advance (see {@link Client.createGrant}), and what became of it. */
export interface Grant {
  /** Its id; the calls it grants name it as their actor (kind "grant"). */
  id: string;
  /** The tool whose calls it grants. */
  tool: string;
  /** The runs whose calls it covers. */
  scope: GrantScope;
  /** A CEL expression the call must make true; empty: any call. */
  condition: string;
  /** Only a call with exactly these arguments (hex SHA-256 of their canonical JSON); empty: any. */
  argumentsSha256: string;
  /** When it stops granting; undefined: never. */
  expiresAt?: Date;
  /** How many calls it may grant; 0: any number. */
  maxUses: number;
  /** Calls it granted so far. */
  uses: number;
  /** Uses left; undefined when unlimited. */
  usesLeft?: number;
  /** In force: not revoked, not expired, not used up. */
  active: boolean;
  /** Why it exists. */
  reason: string;
  /** The approver that made it (with auth off, the caller's address). */
  createdBy: string;
  createdAt?: Date;
  /** With auth on, the creator's approver groups, which limit the calls it may grant. */
  creatorGroups: string[];
  /** Set once revoked. */
  revokedAt?: Date;
  revokedBy: string;
  revokeReason: string;
}

/** Converts a wire Grant. */
export function grantFromProto(g: grantPb.Grant | undefined): Grant {
  return {
    id: g?.id ?? "",
    tool: g?.tool ?? "",
    scope: { runId: g?.scope?.runId ?? "", labels: { ...g?.scope?.labels }, startedBy: g?.scope?.startedBy ?? "" },
    condition: g?.condition ?? "",
    argumentsSha256: g?.argumentsSha256 ?? "",
    expiresAt: optionalDate(g?.expiresAt),
    maxUses: Number(g?.maxUses ?? 0n),
    uses: Number(g?.uses ?? 0n),
    usesLeft: g?.usesLeft === undefined ? undefined : Number(g.usesLeft),
    active: g?.active ?? false,
    reason: g?.reason ?? "",
    createdBy: g?.createdBy ?? "",
    createdAt: optionalDate(g?.createdAt),
    creatorGroups: [...(g?.creatorGroups ?? [])],
    revokedAt: optionalDate(g?.revokedAt),
    revokedBy: g?.revokedBy ?? "",
    revokeReason: g?.revokeReason ?? "",
  };
}
