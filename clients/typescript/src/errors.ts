/**
 * Typed errors for the failures the aaa server reports.
 *
 * Every server error is a `google.rpc.Status` in the `grpc-status-details-bin`
 * trailer carrying one `google.rpc.ErrorInfo` with domain `aaa.v1` and a
 * reason from the `ErrorReason` enum of types.proto (`RUN_NOT_FOUND`,
 * `STALE_ATTEMPT`, ...). The SDK turns each failed call into the error class
 * of that reason, or without a reason into the class of the gRPC status code:
 *
 * ```ts
 * try {
 *   await client.getRun(runId);
 * } catch (err) {
 *   if (err instanceof RunNotFound) ...
 * }
 * ```
 *
 * A failed *run* is not an error: it is data (see `Outcome`).
 *
 * @module
 */

import { Code, ConnectError } from "@connectrpc/connect";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { ErrorReason } from "./gen/aaa/v1/types_pb.js";

export { Code };

/** The ErrorInfo domain of errors raised by aaa servers. */
export const DOMAIN = "aaa.v1";

const ERROR_INFO_TYPE = "google.rpc.ErrorInfo";

/** Options of an {@link AaaError}. */
export interface AaaErrorOptions {
  /** The gRPC status code; `Code.Unknown` when not given. */
  code?: Code;
  /** `ErrorInfo.reason`, for example `"RUN_NOT_FOUND"`. */
  reason?: string;
  /** `ErrorInfo.metadata`, for example `{ field: "task" }`. */
  metadata?: Record<string, string>;
  /** The underlying error (usually a `ConnectError`). */
  cause?: unknown;
}

/** Base class of every error the SDK throws for a failed call. */
export class AaaError extends Error {
  /** The gRPC status code (`Code` of @connectrpc/connect, numbered as in gRPC). */
  readonly code: Code;
  /** `ErrorInfo.reason`, for example `"RUN_NOT_FOUND"`; empty when the server sent none (a connection failure, say). */
  readonly reason: string;
  /** `ErrorInfo.metadata`, for example `{ field: "task" }`. */
  readonly metadata: Record<string, string>;

  /** Creates an error; the SDK does this for you from failed calls. */
  constructor(message: string, options: AaaErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code ?? Code.Unknown;
    this.reason = options.reason ?? "";
    this.metadata = { ...options.metadata };
  }

  /** The request field the server complained about, if it named one (`metadata.field`). */
  get field(): string {
    return this.metadata.field ?? "";
  }

  /** `REASON: message` (or the status code's name when there is no reason). */
  override toString(): string {
    return `${this.name}: ${this.reason || Code[this.code]}: ${this.message}`;
  }
}

/** NOT_FOUND: the run or call does not exist. */
export class NotFound extends AaaError {}
/** A consumer group that does not exist (reason GROUP_NOT_FOUND). */
export class GroupNotFound extends NotFound {}
/** A standing grant that does not exist (reason GRANT_NOT_FOUND); `metadata.grant_id` names it. */
export class GrantNotFound extends NotFound {}
/** The run id is unknown, or (auth on) names another principal's run and the caller lacks the reader role (reason RUN_NOT_FOUND). */
export class RunNotFound extends NotFound {}
/** The run finished and was deleted by retention (reason RUN_EXPIRED), said while its tombstone lasts; `metadata.expired_ms` says when. */
export class RunExpired extends NotFound {}
/** The run has no such call, or no approval request for it (reason CALL_NOT_FOUND). */
export class CallNotFound extends NotFound {}

/** INVALID_ARGUMENT: the request is malformed; `field` names the field when the server did. */
export class InvalidArgument extends AaaError {}
/** A field is missing or malformed (reason INVALID_FIELD); see `field`. */
export class InvalidField extends InvalidArgument {}
/** A payload is larger than the server's limit (reason PAYLOAD_TOO_LARGE); `metadata.limit` says how large. */
export class PayloadTooLarge extends InvalidArgument {}
/** Signal with an event type only the engine may append (reason RESERVED_EVENT_TYPE). */
export class ReservedEventType extends InvalidArgument {}
/** StartRun names a tool no worker has registered (reason TOOL_NOT_REGISTERED). */
export class ToolNotRegistered extends InvalidArgument {}
/** A task token this server did not mint (reason INVALID_TOKEN). */
export class InvalidToken extends InvalidArgument {}
/** The request bytes are not a valid message (reason MALFORMED_REQUEST): a bug of the client that sent them. */
export class MalformedRequest extends InvalidArgument {}

/** FAILED_PRECONDITION: the run or attempt is in the wrong state. */
export class FailedPrecondition extends AaaError {}
/** The run has finished (reason RUN_FINISHED). */
export class RunFinished extends FailedPrecondition {}
/** The task token names an attempt that is no longer current (reason STALE_ATTEMPT). */
export class StaleAttempt extends FailedPrecondition {}
/** Subscribe asked a group for another definition than it was created with (reason GROUP_MISMATCH). */
export class GroupMismatch extends FailedPrecondition {}
/** A grant's arguments_sha256 does not match the requested arguments (reason ARGUMENTS_MISMATCH). */
export class ArgumentsMismatch extends FailedPrecondition {}
/**
 * This approver already voted for the call, which needs grants from several distinct approvers
 * (reason ALREADY_VOTED); `metadata.approver` and `metadata.call_id` name them. Another approver must grant it.
 */
export class AlreadyVoted extends FailedPrecondition {}

/** ALREADY_EXISTS: an id clash. */
export class AlreadyExists extends AaaError {}

/** UNAUTHENTICATED: no token or client certificate, or one the server does not know. */
export class Unauthenticated extends AaaError {}

/**
 * PERMISSION_DENIED: the caller lacks the role (`metadata.roles` lists those that would do),
 * acts on a run it did not start (reason NOT_RUN_OWNER), decides a call of a run it started
 * under separation of duties (reason SEPARATION_OF_DUTIES), serves a tool or model its auth
 * config does not list (reason NOT_ALLOWED_TO_SERVE), uses another principal's worker identity
 * (reason IDENTITY_TAKEN), reports on another principal's task (reason NOT_TASK_HOLDER) or decides
 * a call outside its approver groups (reason NOT_AN_APPROVER_FOR_CALL).
 */
export class PermissionDenied extends AaaError {}
/**
 * A runner with the reader role acts on a run another principal started (a caller without reader
 * gets {@link RunNotFound} instead); reason NOT_RUN_OWNER.
 */
export class NotRunOwner extends PermissionDenied {}
/** With separation of duties on, the principal that started the run decides one of its calls (reason SEPARATION_OF_DUTIES). */
export class SeparationOfDuties extends PermissionDenied {}
/**
 * A worker principal registers or polls a tool or model that its `tools` / `models` in the auth
 * config do not list (reason NOT_ALLOWED_TO_SERVE); `metadata.tool` or `metadata.model` names it.
 */
export class NotAllowedToServe extends PermissionDenied {}
/** The worker identity was first used by another principal (reason IDENTITY_TAKEN); `metadata.identity` names it. */
export class IdentityTaken extends PermissionDenied {}
/** CompleteTask, FailTask or HeartbeatTask from another principal than the one the task was handed to (reason NOT_TASK_HOLDER). */
export class NotTaskHolder extends PermissionDenied {}
/**
 * The call may be decided (granted, denied, edited) only by members of its approver groups, and
 * the caller is in none of them (reason NOT_AN_APPROVER_FOR_CALL); `groups` lists them,
 * `metadata.call_id` names the call.
 */
export class NotAnApproverForCall extends PermissionDenied {
  /** The approver groups that may decide the call. */
  get groups(): string[] {
    // The server sends them comma-separated in the ErrorInfo metadata.
    return (this.metadata.groups ?? "").split(",").filter((g) => g !== "");
  }
}

/**
 * RESOURCE_EXHAUSTED: a subscriber read none of its deliveries while they piled up and the server
 * ended its stream (reason MEMBER_TOO_SLOW); `client.subscribe` joins again by itself.
 */
export class MemberTooSlow extends AaaError {}

/** UNAVAILABLE: the server cannot be reached or is not serving. */
export class Unavailable extends AaaError {}
/** The server is shutting down (reason SHUTTING_DOWN). */
export class ShuttingDown extends Unavailable {}
/**
 * The server's store cannot take writes (disk full, I/O error, database unreachable) and wrote
 * nothing of the call (reason STORAGE_UNAVAILABLE): retried with backoff like any `Unavailable`.
 */
export class StorageUnavailable extends Unavailable {}
/**
 * Another aaa server on the same PostgreSQL database took the run over, so this server no longer
 * writes it and wrote nothing of the call (reason OWNERSHIP_LOST): send the call to the server that
 * serves the deployment now.
 */
export class OwnershipLost extends Unavailable {}
/**
 * This server forwards the call to the server of the cluster that owns the runs, and none answers
 * now (the owner died and its lease has not lapsed yet, or no server holds the runs); `metadata.owner`
 * names the last owner known (reason OWNER_UNAVAILABLE). Retried with backoff like any `Unavailable`:
 * another server takes the runs over within seconds.
 */
export class OwnerUnavailable extends Unavailable {}

/** INTERNAL: the server failed; its log has the details (reason INTERNAL_ERROR). */
export class InternalError extends AaaError {}

/** CANCELED: the call was aborted on this side (an `AbortSignal`, a closed client, a timeout of the SDK). */
export class Cancelled extends AaaError {}

/** DEADLINE_EXCEEDED: a call's own timeout (`timeoutMs`) passed. */
export class Timeout extends AaaError {}

type ErrorClass = new (message: string, options?: AaaErrorOptions) => AaaError;

/** A value of the `ErrorReason` enum of types.proto, by name. */
export type ReasonName = Exclude<keyof typeof ErrorReason, "ERROR_REASON_UNSPECIFIED">;

/**
 * The class of each reason. Typed by the generated enum: a reason added to the
 * proto that has no class here fails the type-check. A reason newer than the
 * SDK gets the class of its status code.
 */
const BY_REASON: Record<ReasonName, ErrorClass> = {
  RUN_NOT_FOUND: RunNotFound,
  CALL_NOT_FOUND: CallNotFound,
  INVALID_FIELD: InvalidField,
  PAYLOAD_TOO_LARGE: PayloadTooLarge,
  RESERVED_EVENT_TYPE: ReservedEventType,
  RUN_FINISHED: RunFinished,
  STALE_ATTEMPT: StaleAttempt,
  ARGUMENTS_MISMATCH: ArgumentsMismatch,
  TOOL_NOT_REGISTERED: ToolNotRegistered,
  INVALID_TOKEN: InvalidToken,
  SHUTTING_DOWN: ShuttingDown,
  INTERNAL_ERROR: InternalError,
  UNAUTHENTICATED: Unauthenticated,
  PERMISSION_DENIED: PermissionDenied,
  NOT_RUN_OWNER: NotRunOwner,
  SEPARATION_OF_DUTIES: SeparationOfDuties,
  GROUP_NOT_FOUND: GroupNotFound,
  GROUP_MISMATCH: GroupMismatch,
  MEMBER_TOO_SLOW: MemberTooSlow,
  STORAGE_UNAVAILABLE: StorageUnavailable,
  OWNERSHIP_LOST: OwnershipLost,
  OWNER_UNAVAILABLE: OwnerUnavailable,
  MALFORMED_REQUEST: MalformedRequest,
  NOT_ALLOWED_TO_SERVE: NotAllowedToServe,
  IDENTITY_TAKEN: IdentityTaken,
  NOT_TASK_HOLDER: NotTaskHolder,
  ALREADY_VOTED: AlreadyVoted,
  NOT_AN_APPROVER_FOR_CALL: NotAnApproverForCall,
  GRANT_NOT_FOUND: GrantNotFound,
  RUN_EXPIRED: RunExpired,
};

/** The class of a reason the server sent, if this SDK knows it. */
function reasonClass(reason: string): ErrorClass | undefined {
  return Object.hasOwn(BY_REASON, reason) ? BY_REASON[reason as ReasonName] : undefined;
}

const BY_CODE: Partial<Record<Code, ErrorClass>> = {
  [Code.NotFound]: NotFound,
  [Code.InvalidArgument]: InvalidArgument,
  [Code.FailedPrecondition]: FailedPrecondition,
  [Code.AlreadyExists]: AlreadyExists,
  [Code.Unauthenticated]: Unauthenticated,
  [Code.PermissionDenied]: PermissionDenied,
  [Code.Unavailable]: Unavailable,
  [Code.Internal]: InternalError,
  [Code.Canceled]: Cancelled,
  [Code.DeadlineExceeded]: Timeout,
};

/** The `reason` and `metadata` of a `google.rpc.ErrorInfo`. */
export interface ErrorInfo {
  /** The reason, for example `"RUN_NOT_FOUND"`. */
  reason: string;
  /** The domain; `"aaa.v1"` for aaa's errors. */
  domain: string;
  /** Extra facts, for example `{ field: "task" }`. */
  metadata: Record<string, string>;
}

/**
 * Decodes a `google.rpc.ErrorInfo` from its protobuf bytes:
 * `string reason = 1; string domain = 2; map<string, string> metadata = 3;`.
 * (A hand-written decoder: the message is not part of aaa's proto files.)
 */
export function decodeErrorInfo(bytes: Uint8Array): ErrorInfo {
  const info: ErrorInfo = { reason: "", domain: "", metadata: {} };
  const reader = new BinaryReader(bytes);
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === 1 && wireType === 2) info.reason = reader.string();
    else if (field === 2 && wireType === 2) info.domain = reader.string();
    else if (field === 3 && wireType === 2) {
      const entry = new BinaryReader(reader.bytes());
      let key = "";
      let value = "";
      while (entry.pos < entry.len) {
        const [f, w] = entry.tag();
        if (f === 1 && w === 2) key = entry.string();
        else if (f === 2 && w === 2) value = entry.string();
        else entry.skip(w);
      }
      info.metadata[key] = value;
    } else reader.skip(wireType);
  }
  return info;
}

/** Node error codes of a lost or refused connection: the call never got a server's answer. */
const CONNECTION_ERRORS = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "ERR_HTTP2_GOAWAY_SESSION",
  "ERR_HTTP2_INVALID_SESSION",
  "ERR_HTTP2_SESSION_ERROR",
  "ERR_HTTP2_STREAM_CANCEL",
  "ERR_HTTP2_STREAM_ERROR",
  "ERR_STREAM_PREMATURE_CLOSE",
]);

/** True when the error, or one of its causes, is a Node connection failure. */
function lostConnection(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 10; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && CONNECTION_ERRORS.has(code)) return true;
  }
  return false;
}

/**
 * Converts anything a call threw into an {@link AaaError} subclass: the class
 * of the server's ErrorInfo reason, else of the gRPC status code. A lost or
 * refused connection is `Unavailable` (code UNAVAILABLE, as in gRPC), whatever
 * code the transport gave it, so that it is retried. AaaErrors are returned as
 * they are.
 */
export function toAaaError(err: unknown): AaaError {
  if (err instanceof AaaError) return err;
  const ce = ConnectError.from(err);
  let info: ErrorInfo | undefined;
  for (const detail of ce.details) {
    if ("type" in detail && detail.type === ERROR_INFO_TYPE) {
      try {
        const decoded = decodeErrorInfo(detail.value);
        if (decoded.domain === DOMAIN) info = decoded;
      } catch {
        // a malformed detail is ignored; the status code still classifies the error
      }
    }
  }
  if (info === undefined && ce.code !== Code.Canceled && lostConnection(ce)) {
    return new Unavailable(`connection lost: ${ce.rawMessage}`, { code: Code.Unavailable, cause: err });
  }
  const cls = (info && reasonClass(info.reason)) ?? BY_CODE[ce.code] ?? AaaError;
  return new cls(ce.rawMessage, { code: ce.code, reason: info?.reason, metadata: info?.metadata, cause: err });
}

/**
 * {@link toAaaError} for a call its caller did not cancel: a CANCELLED without the server's reason is
 * then the transport's, an HTTP/2 stream closed under the call as its connection went away (a killed
 * server's session closes its streams with CANCEL), so it is `Unavailable` and retried like any lost
 * connection (writes carry a request id, so a retry is applied once).
 */
export function notCancelledError(err: unknown): AaaError {
  const error = toAaaError(err);
  if (error.code !== Code.Canceled || error.reason !== "") return error;
  return new Unavailable(`connection lost: ${error.message}`, { code: Code.Unavailable, cause: err });
}

/** A tool failure that must not be retried, whatever the tool's retry policy says. Throw it from a tool handler. */
export class NonRetryable extends Error {
  /** Creates the error; `message` is what the model reads. */
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}
