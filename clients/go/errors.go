package aaa

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"aaa.dev/clients/go/aaav1"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo that the server
// attaches to every error it returns.
const ErrorDomain = "aaa.v1"

// Reason is the reason the server gives for an error: the name of a value of
// the ErrorReason enum in types.proto (aaav1.ErrorReason). The variables below
// are errors, so errors.Is(err, aaa.ErrRunNotFound) tells whether a call
// failed for that reason. A reason newer than this SDK still arrives in
// Error.Reason; compare it with Reason(aaav1.ErrorReason_X.String()).
type Reason string

// Error returns the reason with an "aaa: " prefix.
func (r Reason) Error() string { return "aaa: " + string(r) }

// reasonOf is the Reason of a value of the generated enum: the names below
// cannot drift from the proto (a test checks that every value has one).
func reasonOf(r aaav1.ErrorReason) Reason { return Reason(r.String()) }

// The reasons the server gives (google.rpc.ErrorInfo.reason, domain "aaa.v1").
var (
	// ErrRunNotFound (NOT_FOUND): the run id is unknown, or (auth on) names
	// another principal's run and the caller lacks the reader role.
	ErrRunNotFound = reasonOf(aaav1.ErrorReason_RUN_NOT_FOUND)
	// ErrCallNotFound (NOT_FOUND): the run has no such call, or no approval request for it.
	ErrCallNotFound = reasonOf(aaav1.ErrorReason_CALL_NOT_FOUND)
	// ErrInvalidField (INVALID_ARGUMENT): a field is missing or malformed; Error.Field names it.
	ErrInvalidField = reasonOf(aaav1.ErrorReason_INVALID_FIELD)
	// ErrPayloadTooLarge (INVALID_ARGUMENT): a payload is over its limit (Metadata["limit"]).
	ErrPayloadTooLarge = reasonOf(aaav1.ErrorReason_PAYLOAD_TOO_LARGE)
	// ErrReservedEventType (INVALID_ARGUMENT): Signal with an event type only the engine may append.
	ErrReservedEventType = reasonOf(aaav1.ErrorReason_RESERVED_EVENT_TYPE)
	// ErrRunFinished (FAILED_PRECONDITION): the run has finished.
	ErrRunFinished = reasonOf(aaav1.ErrorReason_RUN_FINISHED)
	// ErrStaleAttempt (FAILED_PRECONDITION): the task token names an attempt that is no longer current.
	ErrStaleAttempt = reasonOf(aaav1.ErrorReason_STALE_ATTEMPT)
	// ErrArgumentsMismatch (FAILED_PRECONDITION): a grant's arguments_sha256 does not match the request.
	ErrArgumentsMismatch = reasonOf(aaav1.ErrorReason_ARGUMENTS_MISMATCH)
	// ErrToolNotRegistered (INVALID_ARGUMENT): StartRun names a tool no worker has registered.
	ErrToolNotRegistered = reasonOf(aaav1.ErrorReason_TOOL_NOT_REGISTERED)
	// ErrInvalidToken (INVALID_ARGUMENT): the task token is not one the server minted.
	ErrInvalidToken = reasonOf(aaav1.ErrorReason_INVALID_TOKEN)
	// ErrShuttingDown (UNAVAILABLE): the server is stopping.
	ErrShuttingDown = reasonOf(aaav1.ErrorReason_SHUTTING_DOWN)
	// ErrInternal (INTERNAL): the server failed; details are in its log.
	ErrInternal = reasonOf(aaav1.ErrorReason_INTERNAL_ERROR)
	// ErrUnauthenticated (UNAUTHENTICATED): no token or client certificate, or one the server does not know.
	ErrUnauthenticated = reasonOf(aaav1.ErrorReason_UNAUTHENTICATED)
	// ErrPermissionDenied (PERMISSION_DENIED): the caller lacks the role;
	// Metadata["roles"] lists the roles that would do, comma-separated.
	ErrPermissionDenied = reasonOf(aaav1.ErrorReason_PERMISSION_DENIED)
	// ErrNotRunOwner (PERMISSION_DENIED): a runner with the reader role acts on
	// a run another principal started (a caller without reader gets
	// ErrRunNotFound instead).
	ErrNotRunOwner = reasonOf(aaav1.ErrorReason_NOT_RUN_OWNER)
	// ErrSeparationOfDuties (PERMISSION_DENIED): the run's starter decided one of
	// its calls while the server enforces separation of duties.
	ErrSeparationOfDuties = reasonOf(aaav1.ErrorReason_SEPARATION_OF_DUTIES)
	// ErrGroupNotFound (NOT_FOUND): a consumer group that does not exist.
	ErrGroupNotFound = reasonOf(aaav1.ErrorReason_GROUP_NOT_FOUND)
	// ErrGroupMismatch (FAILED_PRECONDITION): Subscribe asked a group for another
	// definition than it was created with; Error.Field says which part differs.
	ErrGroupMismatch = reasonOf(aaav1.ErrorReason_GROUP_MISMATCH)
	// ErrMemberTooSlow (RESOURCE_EXHAUSTED): a subscriber read none of its
	// deliveries while they piled up and the server ended its stream;
	// Subscribe joins again by itself.
	ErrMemberTooSlow = reasonOf(aaav1.ErrorReason_MEMBER_TOO_SLOW)
	// ErrStorageUnavailable (UNAVAILABLE): the server's store cannot take
	// writes (disk full, I/O error, database unreachable) and wrote nothing of
	// the call; retried like any UNAVAILABLE.
	ErrStorageUnavailable = reasonOf(aaav1.ErrorReason_STORAGE_UNAVAILABLE)
	// ErrOwnershipLost (UNAVAILABLE): another aaa server on the same
	// PostgreSQL database took the run over; this server wrote nothing of
	// the call. Send it to the server that serves the deployment now.
	ErrOwnershipLost = reasonOf(aaav1.ErrorReason_OWNERSHIP_LOST)
	// ErrOwnerUnavailable (UNAVAILABLE): this server forwards the call to the
	// server of the cluster that owns the runs, and none answers now (the
	// owner died and its lease has not lapsed yet, or no server holds the
	// runs); Metadata["owner"] names the last owner known. Retried like any
	// UNAVAILABLE: another server takes the runs over within seconds.
	ErrOwnerUnavailable = reasonOf(aaav1.ErrorReason_OWNER_UNAVAILABLE)
	// ErrMalformedRequest (INVALID_ARGUMENT): the request bytes are not a valid
	// message of the method's type: a bug of the client that sent them.
	ErrMalformedRequest = reasonOf(aaav1.ErrorReason_MALFORMED_REQUEST)
	// ErrNotAllowedToServe (PERMISSION_DENIED): a worker principal registers or
	// polls a tool or model that its tools / models in the auth config do not
	// list; Metadata["tool"] or Metadata["model"] names it.
	ErrNotAllowedToServe = reasonOf(aaav1.ErrorReason_NOT_ALLOWED_TO_SERVE)
	// ErrIdentityTaken (PERMISSION_DENIED): the worker identity was first used
	// by another principal; Metadata["identity"] names it.
	ErrIdentityTaken = reasonOf(aaav1.ErrorReason_IDENTITY_TAKEN)
	// ErrNotTaskHolder (PERMISSION_DENIED): CompleteTask, FailTask or
	// HeartbeatTask from another principal than the one the task was handed to.
	ErrNotTaskHolder = reasonOf(aaav1.ErrorReason_NOT_TASK_HOLDER)
	// ErrAlreadyVoted (FAILED_PRECONDITION): this approver already granted the
	// call, whose tool needs grants from several distinct approvers;
	// Metadata["approver"] and Metadata["call_id"] name them.
	ErrAlreadyVoted = reasonOf(aaav1.ErrorReason_ALREADY_VOTED)
	// ErrNotAnApproverForCall (PERMISSION_DENIED): the call may be decided
	// (granted, denied, edited) only by members of its approver groups, and
	// the caller is in none of them; Error.Groups lists them and
	// Metadata["call_id"] names the call.
	ErrNotAnApproverForCall = reasonOf(aaav1.ErrorReason_NOT_AN_APPROVER_FOR_CALL)
	// ErrGrantNotFound (NOT_FOUND): GrantService names a standing grant that
	// does not exist; Metadata["grant_id"] names it.
	ErrGrantNotFound = reasonOf(aaav1.ErrorReason_GRANT_NOT_FOUND)
	// ErrRunExpired (NOT_FOUND): the run finished and was deleted by
	// retention; said while its tombstone lasts (ErrRunNotFound after).
	// Metadata["expired_ms"] says when it was deleted.
	ErrRunExpired = reasonOf(aaav1.ErrorReason_RUN_EXPIRED)
)

// ErrNoOutcome is returned by Client.Result when the run's event stream ends
// before its terminal event.
var ErrNoOutcome = errors.New("aaa: the event stream ended before the run's terminal event")

// Error is an error returned by the server (or by gRPC on the way to it).
// Every error the client returns for a failed call is an *Error; inspect it
// with errors.Is (against a Reason, or context.Canceled and
// context.DeadlineExceeded) or errors.As. status.Code(err) works too.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Reason is the server's reason; empty when the error carries no
	// ErrorInfo of domain "aaa.v1" (a transport failure, say).
	Reason Reason
	// Message is the status message.
	Message string
	// Metadata is the ErrorInfo's metadata, e.g. "field" and "limit".
	Metadata map[string]string

	status *status.Status
}

// Error formats the error as "aaa: REASON (Code): message".
func (e *Error) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("aaa: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("aaa: %s (%s): %s", string(e.Reason), e.Code, e.Message)
}

// Is reports whether the error has the target's reason (target a Reason), or
// is a cancellation or deadline (target context.Canceled or
// context.DeadlineExceeded).
func (e *Error) Is(target error) bool {
	switch target {
	case context.Canceled:
		return e.Code == codes.Canceled
	case context.DeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	}
	r, ok := target.(Reason)
	return ok && e.Reason != "" && r == e.Reason
}

// Field names the offending request field of an ErrInvalidField or
// ErrPayloadTooLarge error; empty otherwise.
func (e *Error) Field() string { return e.Metadata["field"] }

// Groups lists the approver groups that may decide the call of an
// ErrNotAnApproverForCall error; nil otherwise.
func (e *Error) Groups() []string {
	// The server sends them comma-separated in the ErrorInfo metadata.
	var groups []string
	for _, g := range strings.Split(e.Metadata["groups"], ",") {
		if g != "" {
			groups = append(groups, g)
		}
	}
	return groups
}

// GRPCStatus returns the gRPC status the error was made from, so that
// status.FromError and status.Code keep working.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// FromGRPC turns an error returned by a gRPC call (for example a call made
// with the generated stubs) into an *Error. It returns nil for nil, and
// errors that carry no gRPC status unchanged.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e = &Error{Code: st.Code(), Message: st.Message(), status: st}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			e.Reason = Reason(info.GetReason())
			e.Metadata = info.GetMetadata()
			break
		}
	}
	return e
}
