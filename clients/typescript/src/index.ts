/**
 * TypeScript SDK of aaa: start agent runs, follow their durable event
 * streams, answer approvals, and serve tools and models as a worker.
 *
 * ```ts
 * import { connect, tool, text, toolCall } from "@aaa/sdk";
 * ```
 *
 * The generated wire types and service descriptors (protoc-gen-es) are under
 * the `pb` namespace: `pb.run.StartRunRequestSchema`, `pb.worker.WorkerService`...
 *
 * @module
 */

export {
  Approvals,
  Client,
  Run,
  connect,
  type Budget,
  type CreateGrantOptions,
  type DecideApprovalsOptions,
  type EventsOptions,
  type ListGrantsOptions,
  type StartRunOptions,
  type ToolRef,
  type WatchOptions,
} from "./client.js";
export { DEFAULT_ADDRESS, type CallControl, type ConnectOptions, type TlsOptions } from "./connection.js";
export {
  Tool,
  Worker,
  asReply,
  type AnyTool,
  tool,
  type Logger,
  type ModelHandler,
  type ReplyLike,
  type TaskContext,
  type ToolHandler,
  type ToolOptions,
  type WorkerOptions,
} from "./worker.js";
export {
  Echo,
  OpenAIModel,
  Reply,
  TERMINAL_EVENT_TYPES,
  echo,
  openai,
  isEvent,
  text,
  toolCall,
  type Actor,
  type Approval,
  type ApprovalOutcome,
  type ApprovalResolution,
  type ApprovalVoted,
  type ApprovalWatchItem,
  type DecisionItem,
  type DecisionResult,
  type DecisionStatus,
  type ErrorDetail,
  type Event,
  type EventDataMap,
  type EventType,
  type Grant,
  type GrantScope,
  type Message,
  type ModelRequest,
  type Outcome,
  type Policy,
  type PolicyDecision,
  type RecordedToolCall,
  type ReplyToolCall,
  type Role,
  type RunInfo,
  type RunStatus,
  type ScriptedStep,
  type TokenUsage,
  type SignalResult,
  type ToolCall,
  type ToolInfo,
  type TypedEvent,
  type Vote,
} from "./types.js";
export {
  AaaError,
  AlreadyExists,
  AlreadyVoted,
  ArgumentsMismatch,
  CallNotFound,
  Cancelled,
  Code,
  DOMAIN,
  FailedPrecondition,
  GrantNotFound,
  GroupMismatch,
  GroupNotFound,
  IdentityTaken,
  InternalError,
  InvalidArgument,
  InvalidField,
  InvalidToken,
  MalformedRequest,
  MemberTooSlow,
  NonRetryable,
  NotAllowedToServe,
  NotAnApproverForCall,
  NotFound,
  NotRunOwner,
  NotTaskHolder,
  PayloadTooLarge,
  PermissionDenied,
  ReservedEventType,
  RunFinished,
  RunExpired,
  RunNotFound,
  SeparationOfDuties,
  ShuttingDown,
  StaleAttempt,
  StorageUnavailable,
  OwnershipLost,
  OwnerUnavailable,
  Timeout,
  ToolNotRegistered,
  Unauthenticated,
  Unavailable,
  decodeErrorInfo,
  toAaaError,
  type AaaErrorOptions,
  type ErrorInfo,
  type ReasonName,
} from "./errors.js";
export { type Delivery, type DeliveryHandler, type SubscribeOptions } from "./subscriptions.js";
export { parse, parseObject, stringify, type JsonObject, type JsonValue } from "./json.js";

/** The generated wire messages and service descriptors, one namespace per proto file. */
export * as pb from "./pb.js";
