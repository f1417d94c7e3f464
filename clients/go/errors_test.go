package aaa_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/aaav1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func TestTypedErrors(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	waiting := e.start(t, payACME(nil))
	request := decode(t, e.waitFor(t, waiting, aaa.EventApprovalRequested))
	callID := request["call_id"].(string)
	finished := e.start(t, aaa.StartRunRequest{Task: "hi", Model: aaa.ScriptedModel(aaa.TextStep("hello"))})
	e.result(t, finished)

	_, err := e.client.GetRun(e.ctx, "no-such-run")
	notFound := wantReason(t, err, aaa.ErrRunNotFound)
	if notFound.Code != codes.NotFound || status.Code(err) != codes.NotFound || notFound.Message == "" {
		t.Fatalf("GetRun of an unknown run: %#v", notFound)
	}
	if !strings.HasPrefix(err.Error(), "aaa: RUN_NOT_FOUND (NotFound): ") {
		t.Fatalf("message: %s", err)
	}

	cases := []struct {
		name   string
		call   func() error
		reason aaa.Reason
		code   codes.Code
		field  string
	}{
		{"unregistered tool", func() error {
			_, err := e.client.StartRun(e.ctx, aaa.StartRunRequest{Task: "x", Model: aaa.WorkerModel("m"), Tools: []aaa.ToolRef{{Name: "nope"}}})
			return err
		}, aaa.ErrToolNotRegistered, codes.InvalidArgument, "tools[0].name"},
		{"missing task", func() error {
			_, err := e.client.StartRun(e.ctx, aaa.StartRunRequest{Model: aaa.WorkerModel("m")})
			return err
		}, aaa.ErrInvalidField, codes.InvalidArgument, "task"},
		// The test server has no --models: the request carried the built-in model.
		{"built-in model without providers", func() error {
			_, err := e.client.StartRun(e.ctx, aaa.StartRunRequest{Task: "x", Model: aaa.OpenAI("gpt-4.1-mini", "openai"), Budget: aaa.Budget{MaxTokens: 1000}})
			return err
		}, aaa.ErrInvalidField, codes.InvalidArgument, "model.openai"},
		{"engine-owned type", func() error {
			_, err := e.client.Signal(e.ctx, waiting, aaa.EventToolCompleted, map[string]string{"call_id": callID})
			return err
		}, aaa.ErrReservedEventType, codes.InvalidArgument, "type"},
		{"data not an object", func() error {
			_, err := e.client.Signal(e.ctx, waiting, "acme.note", json.RawMessage(`[1]`))
			return err
		}, aaa.ErrInvalidField, codes.InvalidArgument, "data_json"},
		{"data too large", func() error {
			_, err := e.client.Signal(e.ctx, waiting, "acme.note", map[string]string{"blob": strings.Repeat("x", 70_000)})
			return err
		}, aaa.ErrPayloadTooLarge, codes.InvalidArgument, "data_json"},
		{"unknown call", func() error {
			_, err := e.client.Approve(e.ctx, waiting, "call-99")
			return err
		}, aaa.ErrCallNotFound, codes.NotFound, ""},
		{"other arguments", func() error {
			_, err := e.client.Approve(e.ctx, waiting, callID, aaa.WithArgumentsSHA256(strings.Repeat("0", 64)))
			return err
		}, aaa.ErrArgumentsMismatch, codes.FailedPrecondition, ""},
		{"finished run", func() error {
			_, err := e.client.Signal(e.ctx, finished, "acme.note", nil)
			return err
		}, aaa.ErrRunFinished, codes.FailedPrecondition, ""},
		{"forged token", func() error {
			_, err := e.client.WorkerService().HeartbeatTask(e.ctx, &aaav1.HeartbeatTaskRequest{Token: "forged"})
			return aaa.FromGRPC(err)
		}, aaa.ErrInvalidToken, codes.InvalidArgument, "token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			got := wantReason(t, err, c.reason)
			if got.Code != c.code || got.Field() != c.field {
				t.Fatalf("code %s field %q, want %s %q (%v)", got.Code, got.Field(), c.code, c.field, err)
			}
			if c.reason == aaa.ErrPayloadTooLarge && got.Metadata["limit"] == "" {
				t.Fatalf("no limit in %v", got.Metadata)
			}
			for _, other := range []aaa.Reason{aaa.ErrRunNotFound, aaa.ErrStaleAttempt, aaa.ErrShuttingDown} {
				if other != c.reason && errors.Is(err, other) {
					t.Fatalf("%v also matches %s", err, other)
				}
			}
		})
	}
	if ran.Load() != 0 {
		t.Fatal("a refused grant let the tool run")
	}

	// None of the refusals changed the waiting run.
	run, err := e.client.GetRun(e.ctx, waiting)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != aaa.StatusWaitingForApproval {
		t.Fatalf("status %s", run.Status)
	}

	// A call cut short by its context matches the context's errors.
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if _, err := e.client.GetRun(ctx, waiting); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	for _, err := range e.client.Events(ctx, waiting, aaa.EventsOptions{Follow: true}) {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled stream: %v", err)
		}
	}
}

func TestErrorsWithoutServer(t *testing.T) {
	if aaa.FromGRPC(nil) != nil {
		t.Fatal("FromGRPC(nil) is not nil")
	}
	plain := errors.New("plain")
	if aaa.FromGRPC(plain) != plain {
		t.Fatal("FromGRPC changed an error without a status")
	}
	err := aaa.FromGRPC(status.Error(codes.Unavailable, "down"))
	var e *aaa.Error
	if !errors.As(err, &e) || e.Code != codes.Unavailable || e.Reason != "" || errors.Is(err, aaa.ErrShuttingDown) {
		t.Fatalf("transport error: %#v", err)
	}
	if err.Error() != "aaa: Unavailable: down" {
		t.Fatalf("message: %s", err)
	}
	if aaa.ErrRunNotFound.Error() != "aaa: RUN_NOT_FOUND" {
		t.Fatalf("reason message: %s", aaa.ErrRunNotFound)
	}
}

// TestEveryErrorReasonHasASentinel fails when the proto's ErrorReason gains a
// value that the SDK has no Err variable for.
func TestEveryErrorReasonHasASentinel(t *testing.T) {
	sentinels := []aaa.Reason{
		aaa.ErrRunNotFound, aaa.ErrCallNotFound, aaa.ErrInvalidField, aaa.ErrPayloadTooLarge,
		aaa.ErrReservedEventType, aaa.ErrRunFinished, aaa.ErrStaleAttempt, aaa.ErrArgumentsMismatch,
		aaa.ErrToolNotRegistered, aaa.ErrInvalidToken, aaa.ErrShuttingDown, aaa.ErrInternal,
		aaa.ErrUnauthenticated, aaa.ErrPermissionDenied, aaa.ErrNotRunOwner, aaa.ErrSeparationOfDuties,
		aaa.ErrGroupNotFound, aaa.ErrGroupMismatch, aaa.ErrMemberTooSlow, aaa.ErrStorageUnavailable, aaa.ErrOwnershipLost,
		aaa.ErrOwnerUnavailable,
		aaa.ErrMalformedRequest, aaa.ErrNotAllowedToServe, aaa.ErrIdentityTaken, aaa.ErrNotTaskHolder,
		aaa.ErrAlreadyVoted, aaa.ErrNotAnApproverForCall, aaa.ErrGrantNotFound, aaa.ErrRunExpired,
	}
	known := map[string]aaa.Reason{}
	for _, r := range sentinels {
		known[string(r)] = r
	}
	for value, name := range aaav1.ErrorReason_name {
		if value == int32(aaav1.ErrorReason_ERROR_REASON_UNSPECIFIED) {
			continue
		}
		sentinel, ok := known[name]
		if !ok {
			t.Errorf("ErrorReason %s has no Err variable", name)
			continue
		}
		delete(known, name)
		info := &errdetails.ErrorInfo{Reason: name, Domain: aaa.ErrorDomain}
		st, err := status.New(codes.Unknown, "refused").WithDetails(info)
		if err != nil {
			t.Fatal(err)
		}
		if got := aaa.FromGRPC(st.Err()); !errors.Is(got, sentinel) {
			t.Errorf("FromGRPC of reason %s: %v, not %v", name, got, sentinel)
		}
	}
	for name := range known {
		t.Errorf("Err variable %s names no value of ErrorReason", name)
	}
}

// forwarder is a connection to a server of a cluster whose owner of the runs
// does not answer for the first calls: they fail with OWNER_UNAVAILABLE.
type forwarder struct {
	grpc.ClientConnInterface
	failures int
	calls    int
}

func (f *forwarder) Invoke(_ context.Context, _ string, _, reply any, _ ...grpc.CallOption) error {
	f.calls++
	if f.calls <= f.failures {
		info := &errdetails.ErrorInfo{Reason: "OWNER_UNAVAILABLE", Domain: aaa.ErrorDomain, Metadata: map[string]string{"owner": "aaa-2"}}
		st, err := status.New(codes.Unavailable, "no owner answers").WithDetails(info)
		if err != nil {
			return err
		}
		return st.Err()
	}
	proto.Merge(reply.(proto.Message), &aaav1.GetRunResponse{Run: &aaav1.Run{RunId: "r1"}})
	return nil
}

// OWNER_UNAVAILABLE is an UNAVAILABLE: retried within the retry timeout, and
// then ErrOwnerUnavailable with the owner in its metadata.
func TestOwnerUnavailableIsRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	conn := &forwarder{failures: 2}
	run, err := aaa.NewClient(conn).GetRun(ctx, "r1")
	if err != nil || run.ID != "r1" || conn.calls != 3 {
		t.Fatalf("GetRun after two OWNER_UNAVAILABLE: %+v, %v after %d calls", run, err, conn.calls)
	}
	conn = &forwarder{failures: 1}
	_, err = aaa.NewClient(conn, aaa.WithRetryTimeout(0)).GetRun(ctx, "r1")
	e := wantReason(t, err, aaa.ErrOwnerUnavailable)
	if e.Code != codes.Unavailable || e.Metadata["owner"] != "aaa-2" || conn.calls != 1 {
		t.Fatalf("without retries: %#v after %d calls", e, conn.calls)
	}
}
