package aaa_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"

	aaa "aaa.dev/clients/go"
)

// noSuchDigest is a well-formed digest of no arguments a test uses.
var noSuchDigest = strings.Repeat("0", 64)

// requested waits for the approval request of a call (the run's first one
// when callID is empty) and returns it as pending.
func (e *env) requested(t *testing.T, runID, callID string) aaa.Approval {
	t.Helper()
	opts := aaa.EventsOptions{Follow: true, StopAtEnd: true, TypePrefix: aaa.EventApprovalRequested}
	for event, err := range e.client.Events(e.ctx, runID, opts) {
		if err != nil {
			t.Fatalf("Events: %v", err)
		}
		if id := decode(t, event)["call_id"]; callID == "" || id == callID {
			callID = id.(string)
			break
		}
	}
	run, err := e.client.GetRun(e.ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range run.PendingApprovals {
		if a.CallID == callID {
			return a
		}
	}
	t.Fatalf("call %q of run %s is not pending: %+v", callID, runID, run.PendingApprovals)
	return aaa.Approval{}
}

// approvalHistory returns the first n changes of the approval inbox, from
// the beginning of the log.
func (e *env) approvalHistory(t *testing.T, n int) []aaa.ApprovalUpdate {
	t.Helper()
	var start uint64
	var updates []aaa.ApprovalUpdate
	for update, err := range e.client.WatchApprovals(e.ctx, aaa.WatchOptions{AfterPosition: &start}) {
		if err != nil {
			t.Fatalf("WatchApprovals: %v", err)
		}
		updates = append(updates, update)
		if len(updates) == n {
			break
		}
	}
	return updates
}

func TestEditThenGrantRunsTheEditedArguments(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	runID := e.start(t, payACME(nil))
	shown := e.requested(t, runID, "")

	// Refused edits change nothing.
	_, err := e.client.Edit(e.ctx, runID, shown.CallID, map[string]any{"amount": "a lot", "to": "ACME"})
	if got := wantReason(t, err, aaa.ErrInvalidField); got.Field() != "data_json.arguments" {
		t.Fatalf("edit off the schema: %v", err)
	}
	_, err = e.client.Edit(e.ctx, runID, shown.CallID, transfer{250, "ACME"})
	if got := wantReason(t, err, aaa.ErrInvalidField); got.Field() != "data_json.arguments" {
		t.Fatalf("edit to the requested arguments: %v", err)
	}
	_, err = e.client.Edit(e.ctx, runID, shown.CallID, transfer{200, "ACME"}, aaa.WithArgumentsSHA256(noSuchDigest))
	wantReason(t, err, aaa.ErrArgumentsMismatch)

	edited, err := e.client.Edit(e.ctx, runID, shown.CallID, transfer{200, "ACME"},
		aaa.WithArgumentsSHA256(shown.ArgumentsSHA256), aaa.WithReason("over the daily limit"))
	if err != nil {
		t.Fatal(err)
	}
	if edited.AlreadyDecided || edited.Decision != aaa.EventApprovalEdited || edited.Seq == 0 ||
		edited.NewCallID == "" || edited.NewCallID == shown.CallID || edited.NewArgumentsSHA256 == "" ||
		edited.Votes != 0 || edited.ApprovalsRequired != 1 {
		t.Fatalf("edit: %+v", edited)
	}
	next := e.requested(t, runID, edited.NewCallID)
	if next.EditedFrom != shown.CallID || string(next.Arguments) != `{"amount":200,"to":"ACME"}` || next.ArgumentsSHA256 != edited.NewArgumentsSHA256 {
		t.Fatalf("the edited call: %+v", next)
	}
	if ran.Load() != 0 {
		t.Fatal("the tool ran before the edited call was granted")
	}
	// The edited call is decided: it never runs.
	late, err := e.client.Approve(e.ctx, runID, shown.CallID)
	if err != nil {
		t.Fatal(err)
	}
	if !late.AlreadyDecided || late.Decision != aaa.EventApprovalEdited {
		t.Fatalf("grant of the edited call: %+v", late)
	}

	granted, err := e.client.Approve(e.ctx, runID, next.CallID, aaa.WithArgumentsSHA256(edited.NewArgumentsSHA256))
	if err != nil {
		t.Fatal(err)
	}
	if granted.Decision != aaa.EventApprovalGranted {
		t.Fatalf("grant of the new call: %+v", granted)
	}
	// The scripted model echoes its tool message: the edit, then the result.
	outcome := e.result(t, runID)
	if !strings.Contains(outcome.Text, `{"amount":200,"to":"ACME"}`) || !strings.Contains(outcome.Text, "over the daily limit") ||
		!strings.HasSuffix(outcome.Text, "sent $200 to ACME") {
		t.Fatalf("the model read: %q", outcome.Text)
	}
	if ran.Load() != 1 {
		t.Fatalf("the tool ran %d times", ran.Load())
	}

	history := e.approvalHistory(t, 4)
	if h := history[1]; h.Kind != aaa.Resolved || h.Resolution.CallID != shown.CallID || h.Resolution.Outcome != aaa.OutcomeEdited ||
		h.Resolution.ReplacedBy != next.CallID || h.Resolution.Reason != "over the daily limit" {
		t.Fatalf("the edit, watched: %+v", h.Resolution)
	}
	if h := history[2]; h.Kind != aaa.Requested || h.Approval.CallID != next.CallID || h.Approval.EditedFrom != shown.CallID {
		t.Fatalf("the new call, watched: %+v", h)
	}
	if h := history[3]; h.Kind != aaa.Resolved || h.Resolution.CallID != next.CallID || h.Resolution.Outcome != aaa.OutcomeGranted {
		t.Fatalf("the grant, watched: %+v", h)
	}
}

func TestEditWithGrantRunsAtOnce(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	runID := e.start(t, payACME(nil))
	shown := e.requested(t, runID, "")

	edited, err := e.client.Edit(e.ctx, runID, shown.CallID, json.RawMessage(`{"amount":200,"to":"ACME"}`),
		aaa.WithArgumentsSHA256(shown.ArgumentsSHA256), aaa.WithGrant())
	if err != nil {
		t.Fatal(err)
	}
	if edited.Decision != aaa.EventApprovalEdited || edited.Votes != 1 || edited.ApprovalsRequired != 1 || edited.NewCallID == "" {
		t.Fatalf("edit: %+v", edited)
	}
	if outcome := e.result(t, runID); !strings.HasSuffix(outcome.Text, "sent $200 to ACME") {
		t.Fatalf("the model read: %q", outcome.Text)
	}
	if ran.Load() != 1 {
		t.Fatalf("the tool ran %d times", ran.Load())
	}
	// Granting it again changes nothing.
	again, err := e.client.Approve(e.ctx, runID, edited.NewCallID)
	if err != nil {
		t.Fatal(err)
	}
	if !again.AlreadyDecided || again.Decision != aaa.EventApprovalGranted {
		t.Fatalf("a second grant: %+v", again)
	}
}

func TestTwoApproversOfTwoRequired(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	tool := wireMoney(&ran)
	tool.ApprovalsRequired = 2
	stored, err := aaa.NewWorker(e.client, aaa.WorkerOptions{Tools: []aaa.Tool{tool}}).Register(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || stored[0].ApprovalsRequired != 2 {
		t.Fatalf("registered: %+v", stored)
	}
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{tool}})
	runID := e.start(t, payACME(nil))
	shown := e.requested(t, runID, "")
	if shown.ApprovalsRequired != 2 || len(shown.Votes) != 0 {
		t.Fatalf("request: %+v", shown)
	}

	first, err := e.client.Approve(e.ctx, runID, shown.CallID, aaa.WithArgumentsSHA256(shown.ArgumentsSHA256),
		aaa.WithApprover("alice"), aaa.WithComment("invoice checked"))
	if err != nil {
		t.Fatal(err)
	}
	if first.AlreadyDecided || first.Decision != aaa.EventApprovalVoted || first.Votes != 1 || first.ApprovalsRequired != 2 || first.Seq == 0 {
		t.Fatalf("first grant: %+v", first)
	}
	pending := e.requested(t, runID, shown.CallID)
	if len(pending.Votes) != 1 || pending.Votes[0].Approver != "alice" || pending.Votes[0].Comment != "invoice checked" || pending.Votes[0].Time.IsZero() {
		t.Fatalf("votes after the first grant: %+v", pending.Votes)
	}

	_, err = e.client.Approve(e.ctx, runID, shown.CallID, aaa.WithApprover("alice"))
	twice := wantReason(t, err, aaa.ErrAlreadyVoted)
	if twice.Code != codes.FailedPrecondition || twice.Metadata["approver"] != "alice" || twice.Metadata["call_id"] != shown.CallID {
		t.Fatalf("the same approver again: %#v", twice)
	}
	if ran.Load() != 0 {
		t.Fatal("the tool ran on one grant of two")
	}

	second, err := e.client.Approve(e.ctx, runID, shown.CallID, aaa.WithArgumentsSHA256(shown.ArgumentsSHA256), aaa.WithApprover("bob"))
	if err != nil {
		t.Fatal(err)
	}
	if second.AlreadyDecided || second.Decision != aaa.EventApprovalGranted || second.Votes != 2 || second.ApprovalsRequired != 2 {
		t.Fatalf("second grant: %+v", second)
	}
	if outcome := e.result(t, runID); outcome.Text != "sent $250 to ACME" || ran.Load() != 1 {
		t.Fatalf("outcome %+v after %d runs", outcome, ran.Load())
	}
	var grant struct {
		Approvers []string `json:"approvers"`
	}
	if err := ofType(e.events(t, runID), aaa.EventApprovalGranted)[0].Decode(&grant); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(grant.Approvers, []string{"alice", "bob"}) {
		t.Fatalf("approvers: %v", grant.Approvers)
	}

	history := e.approvalHistory(t, 3)
	if v := history[1]; v.Kind != aaa.Voted || v.Vote.CallID != shown.CallID || v.Vote.Approver != "alice" ||
		v.Vote.Comment != "invoice checked" || v.Vote.Votes != 1 || v.Vote.ApprovalsRequired != 2 || v.Vote.Seq != first.Seq || v.Position == 0 {
		t.Fatalf("the vote, watched: %+v", v)
	}
	if r := history[2]; r.Kind != aaa.Resolved || r.Resolution.Outcome != aaa.OutcomeGranted {
		t.Fatalf("the grant, watched: %+v", r)
	}

	// A run may ask for more approvers than its tool does, never fewer.
	for _, asked := range []uint32{3, 1} {
		req := payACME(nil)
		req.Tools = []aaa.ToolRef{{Name: "wire_money", ApprovalsRequired: asked}}
		if got := e.requested(t, e.start(t, req), "").ApprovalsRequired; got != max(asked, 2) {
			t.Fatalf("a run asking for %d approvers: %d", asked, got)
		}
	}
}

func TestDecideApprovals(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	var shown []aaa.Approval // the requests of four runs, as a reviewer sees them
	for range 4 {
		shown = append(shown, e.requested(t, e.start(t, payACME(nil)), ""))
	}
	good := shown[0].DecisionItem()
	stale := shown[1].DecisionItem()
	stale.ArgumentsSHA256 = noSuchDigest
	statuses := func(results []aaa.DecisionResult) []aaa.DecisionStatus {
		var s []aaa.DecisionStatus
		for _, r := range results {
			s = append(s, r.Status)
		}
		return s
	}

	// All or nothing: one stale item, and nothing is decided.
	results, err := e.client.DecideApprovals(e.ctx, []aaa.DecisionItem{good, stale}, aaa.BatchGrant, aaa.WithAllOrNothing())
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(results); !slices.Equal(got, []aaa.DecisionStatus{aaa.DecisionNotApplied, aaa.DecisionMismatch}) {
		t.Fatalf("all or nothing: %v", got)
	}
	if results[0].Seq != 0 || results[1].ErrorReason != aaa.ErrArgumentsMismatch || results[1].CallID != stale.CallID || results[1].RunID != stale.RunID {
		t.Fatalf("all or nothing: %+v", results)
	}
	e.requested(t, good.RunID, good.CallID) // still pending

	// Item by item: the good one is decided, the others are not.
	missing := aaa.DecisionItem{RunID: shown[2].RunID, CallID: "call-99", ArgumentsSHA256: shown[2].ArgumentsSHA256}
	batch := []aaa.DecisionItem{good, stale, missing}
	opts := []aaa.SignalOption{aaa.WithComment("batch of the day"), aaa.WithRequestID("batch-" + good.RunID)}
	results, err = e.client.DecideApprovals(e.ctx, batch, aaa.BatchGrant, opts...)
	if err != nil {
		t.Fatal(err)
	}
	// A retry with the request id (its reply lost) gets the first reply again.
	again, err := e.client.DecideApprovals(e.ctx, batch, aaa.BatchGrant, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again, results) {
		t.Fatalf("the retry answered %+v, the first call %+v", again, results)
	}
	if got := statuses(results); !slices.Equal(got, []aaa.DecisionStatus{aaa.DecisionDecided, aaa.DecisionMismatch, aaa.DecisionNotFound}) {
		t.Fatalf("item by item: %v", got)
	}
	if results[0].Decision != aaa.EventApprovalGranted || results[0].Seq == 0 || results[2].ErrorReason != aaa.ErrCallNotFound {
		t.Fatalf("item by item: %+v", results)
	}

	results, err = e.client.DecideApprovals(e.ctx, []aaa.DecisionItem{shown[2].DecisionItem(), shown[3].DecisionItem(), good},
		aaa.BatchDeny, aaa.WithReason("not this week"))
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(results); !slices.Equal(got, []aaa.DecisionStatus{aaa.DecisionDecided, aaa.DecisionDecided, aaa.DecisionAlreadyDecided}) {
		t.Fatalf("denials: %v", got)
	}
	if results[0].Decision != aaa.EventApprovalDenied || results[2].Decision != aaa.EventApprovalGranted || results[2].Seq != 0 {
		t.Fatalf("denials: %+v", results)
	}
	if out := e.result(t, good.RunID); out.Text != "sent $250 to ACME" {
		t.Fatalf("granted run: %+v", out)
	}
	if out := e.result(t, shown[3].RunID); out.Text != "ApprovalDenied: not this week" {
		t.Fatalf("denied run: %+v", out)
	}
	e.requested(t, stale.RunID, stale.CallID) // never decided

	// A batch names each call with the digest shown: never a filter.
	_, err = e.client.DecideApprovals(e.ctx, []aaa.DecisionItem{{RunID: stale.RunID, CallID: stale.CallID}}, aaa.BatchGrant)
	if got := wantReason(t, err, aaa.ErrInvalidField); got.Field() != "items[0].arguments_sha256" {
		t.Fatalf("an item without a digest: %v", err)
	}
	_, err = e.client.DecideApprovals(e.ctx, nil, aaa.BatchGrant)
	if got := wantReason(t, err, aaa.ErrInvalidField); got.Field() != "items" {
		t.Fatalf("no items: %v", err)
	}
	if ran.Load() != 1 {
		t.Fatalf("the tool ran %d times", ran.Load())
	}
}

func TestRacingGrantsGrantOnce(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	// Approvers on connections of their own, granting at the same moment.
	approvers := []*aaa.Client{dial(t, e.server.Addr), dial(t, e.server.Addr)}
	for _, required := range []uint32{1, 2} {
		req := payACME(nil)
		req.Tools = []aaa.ToolRef{{Name: "wire_money", ApprovalsRequired: required}}
		runID := e.start(t, req)
		shown := e.requested(t, runID, "")
		// The grants before the last one, then the last one from two approvers at once.
		for i := range required - 1 {
			if _, err := e.client.Approve(e.ctx, runID, shown.CallID, aaa.WithApprover(fmt.Sprint("early-", i))); err != nil {
				t.Fatal(err)
			}
		}
		racers := []string{"racer-1", "racer-2"}
		results := make([]aaa.SignalResult, len(racers))
		errs := make([]error, len(racers))
		start := make(chan struct{})
		var done sync.WaitGroup
		for i, name := range racers {
			done.Go(func() {
				<-start
				results[i], errs[i] = approvers[i].Approve(e.ctx, runID, shown.CallID, aaa.WithApprover(name))
			})
		}
		close(start)
		done.Wait()
		var granted, late int
		for i, r := range results {
			switch {
			case errs[i] != nil:
				t.Fatalf("racing grant: %v", errs[i])
			case !r.AlreadyDecided && r.Decision == aaa.EventApprovalGranted && r.Votes == required:
				granted++
			case r.AlreadyDecided && r.Decision == aaa.EventApprovalGranted:
				late++
			}
		}
		if granted != 1 || late != 1 {
			t.Fatalf("%d required, racing grants: %+v", required, results)
		}
		e.result(t, runID)
		if n := len(ofType(e.events(t, runID), aaa.EventApprovalGranted)); n != 1 {
			t.Fatalf("%d grants recorded", n)
		}
	}
	if ran.Load() != 2 {
		t.Fatalf("the tool ran %d times for two runs", ran.Load())
	}
}
