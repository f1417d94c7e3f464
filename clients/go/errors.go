package aaa

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo that the server
// attaches to every error it returns.
const ErrorDomain = "aaa.v1"

// Reason is the reason the server gives for an error: the name of a value of
// the ErrorReason enum in types.proto. The constants below are errors, so
// errors.Is(err, aaa.ErrRunNotFound) tells whether a call failed for that
// reason.
type Reason string

// Error returns the reason with an "aaa: " prefix.
func (r Reason) Error() string { return "aaa: " + string(r) }

// The reasons the server gives (google.rpc.ErrorInfo.reason, domain "aaa.v1").
const (
	// ErrRunNotFound (NOT_FOUND): the run id is unknown.
	ErrRunNotFound Reason = "RUN_NOT_FOUND"
	// ErrCallNotFound (NOT_FOUND): the run has no such call, or no approval request for it.
	ErrCallNotFound Reason = "CALL_NOT_FOUND"
	// ErrInvalidField (INVALID_ARGUMENT): a field is missing or malformed; Error.Field names it.
	ErrInvalidField Reason = "INVALID_FIELD"
	// ErrPayloadTooLarge (INVALID_ARGUMENT): a payload is over its limit (Metadata["limit"]).
	ErrPayloadTooLarge Reason = "PAYLOAD_TOO_LARGE"
	// ErrReservedEventType (INVALID_ARGUMENT): Signal with an event type only the engine may append.
	ErrReservedEventType Reason = "RESERVED_EVENT_TYPE"
	// ErrRunFinished (FAILED_PRECONDITION): the run has finished.
	ErrRunFinished Reason = "RUN_FINISHED"
	// ErrStaleAttempt (FAILED_PRECONDITION): the task token names an attempt that is no longer current.
	ErrStaleAttempt Reason = "STALE_ATTEMPT"
	// ErrArgumentsMismatch (FAILED_PRECONDITION): a grant's arguments_sha256 does not match the request.
	ErrArgumentsMismatch Reason = "ARGUMENTS_MISMATCH"
	// ErrToolNotRegistered (INVALID_ARGUMENT): StartRun names a tool no worker has registered.
	ErrToolNotRegistered Reason = "TOOL_NOT_REGISTERED"
	// ErrInvalidToken (INVALID_ARGUMENT): the task token is not one the server minted.
	ErrInvalidToken Reason = "INVALID_TOKEN"
	// ErrShuttingDown (UNAVAILABLE): the server is stopping.
	ErrShuttingDown Reason = "SHUTTING_DOWN"
	// ErrInternal (INTERNAL): the server failed; details are in its log.
	ErrInternal Reason = "INTERNAL_ERROR"
	// ErrGroupNotFound (NOT_FOUND): a consumer group that does not exist.
	ErrGroupNotFound Reason = "GROUP_NOT_FOUND"
	// ErrGroupMismatch (FAILED_PRECONDITION): Subscribe asked a group for another
	// definition than it was created with; Error.Field says which part differs.
	ErrGroupMismatch Reason = "GROUP_MISMATCH"
	// ErrUnauthenticated (UNAUTHENTICATED): no token or client certificate, or one the server does not know.
	ErrUnauthenticated Reason = "UNAUTHENTICATED"
	// ErrPermissionDenied (PERMISSION_DENIED): the caller lacks the role;
	// Metadata["roles"] lists the roles that would do, comma-separated.
	ErrPermissionDenied Reason = "PERMISSION_DENIED"
	// ErrNotRunOwner (PERMISSION_DENIED): a runner touched a run it did not start.
	ErrNotRunOwner Reason = "NOT_RUN_OWNER"
	// ErrSeparationOfDuties (PERMISSION_DENIED): the run's starter decided one of
	// its calls while the server enforces separation of duties.
	ErrSeparationOfDuties Reason = "SEPARATION_OF_DUTIES"
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
