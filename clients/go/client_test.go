package aaa_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	aaa "aaa.dev/clients/go"
)

// transfer is wire_money's arguments.
type transfer struct {
	Amount int64  `json:"amount"`
	To     string `json:"to"`
}

// wireMoney is the gated tool of the reference scenario; ran counts its runs.
func wireMoney(ran *atomic.Int32) aaa.Tool {
	return aaa.Tool{
		Name:             "wire_money",
		Description:      "Send money",
		Parameters:       json.RawMessage(`{"type":"object","properties":{"amount":{"type":"integer"},"to":{"type":"string"}}}`),
		RequiresApproval: true,
		Handler: aaa.Typed(func(ctx context.Context, t transfer) (string, error) {
			ran.Add(1)
			return fmt.Sprintf("sent $%d to %s", t.Amount, t.To), nil
		}),
	}
}

// payACME is a scripted run that calls wire_money, then echoes its result.
func payACME(labels map[string]string) aaa.StartRunRequest {
	return aaa.StartRunRequest{
		Task:   "Pay ACME $250",
		Model:  aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "wire_money", Arguments: transfer{250, "ACME"}}), aaa.EchoStep()),
		Tools:  []aaa.ToolRef{{Name: "wire_money"}},
		Labels: labels,
	}
}

func TestApprovalScenarioEvents(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Identity: "payments-1", Tools: []aaa.Tool{wireMoney(&ran)}})
	runID := e.start(t, payACME(nil))

	request := e.waitFor(t, runID, aaa.EventApprovalRequested)
	data := decode(t, request)
	if data["name"] != "wire_money" || data["call_id"] == "" {
		t.Fatalf("approval request: %v", data)
	}
	run, err := e.client.GetRun(e.ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != aaa.StatusWaitingForApproval || len(run.PendingApprovals) != 1 {
		t.Fatalf("run waiting: %+v", run)
	}
	pending := run.PendingApprovals[0]
	if string(pending.Arguments) != `{"amount":250,"to":"ACME"}` || pending.Tool != "wire_money" || pending.Task != "Pay ACME $250" {
		t.Fatalf("pending approval: %+v", pending)
	}
	if ran.Load() != 0 {
		t.Fatal("the gated tool ran before a grant")
	}

	granted, err := e.client.Approve(e.ctx, runID, pending.CallID, aaa.WithArgumentsSHA256(pending.ArgumentsSHA256), aaa.WithComment("ok"))
	if err != nil {
		t.Fatal(err)
	}
	if granted.AlreadyDecided || granted.Decision != aaa.EventApprovalGranted || granted.Seq == 0 {
		t.Fatalf("grant: %+v", granted)
	}
	outcome := e.result(t, runID)
	if outcome.Status != aaa.StatusCompleted || outcome.Text != "sent $250 to ACME" || string(outcome.Value) != `{"text":"sent $250 to ACME"}` {
		t.Fatalf("outcome: %+v", outcome)
	}
	// Duplicates are harmless: a second grant and a late deny change nothing.
	again, err := e.client.Approve(e.ctx, runID, pending.CallID)
	if err != nil {
		t.Fatal(err)
	}
	late, err := e.client.Deny(e.ctx, runID, pending.CallID, "too late")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []aaa.SignalResult{again, late} {
		if !r.AlreadyDecided || r.Decision != aaa.EventApprovalGranted || r.Seq != 0 {
			t.Fatalf("duplicate decision: %+v", r)
		}
	}
	if ran.Load() != 1 {
		t.Fatalf("the tool ran %d times", ran.Load())
	}

	want := []string{
		aaa.EventRunStarted, aaa.EventLLMRequested, aaa.EventLLMCompleted,
		aaa.EventToolRequested, aaa.EventApprovalRequested, aaa.EventApprovalGranted,
		aaa.EventToolStarted, aaa.EventToolCompleted,
		aaa.EventLLMRequested, aaa.EventLLMCompleted, aaa.EventRunCompleted,
	}
	events := e.events(t, runID)
	if got := types(events); !slices.Equal(got, want) {
		t.Fatalf("events:\n%v\nwant:\n%v", got, want)
	}
	started := decode(t, ofType(events, aaa.EventToolStarted)[0])
	if started["attempt"] != json.Number("1") || started["worker"] != "payments-1" {
		t.Fatalf("tool started: %v", started)
	}
	if grant := ofType(events, aaa.EventApprovalGranted)[0]; grant.Actor.Kind != aaa.ActorClient {
		t.Fatalf("grant actor: %+v", grant.Actor)
	}
}

func TestDenyScenario(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	runID := e.start(t, payACME(nil))
	request := decode(t, e.waitFor(t, runID, aaa.EventApprovalRequested))
	callID := request["call_id"].(string)

	denied, err := e.client.Deny(e.ctx, runID, callID, "not this vendor")
	if err != nil {
		t.Fatal(err)
	}
	if denied.AlreadyDecided || denied.Decision != aaa.EventApprovalDenied {
		t.Fatalf("deny: %+v", denied)
	}
	outcome := e.result(t, runID)
	// The scripted model echoes the tool message: "Type: message" for a failure.
	if outcome.Status != aaa.StatusCompleted || outcome.Text != "ApprovalDenied: not this vendor" {
		t.Fatalf("outcome: %+v", outcome)
	}
	lateGrant, err := e.client.Approve(e.ctx, runID, callID)
	if err != nil {
		t.Fatal(err)
	}
	if !lateGrant.AlreadyDecided || lateGrant.Decision != aaa.EventApprovalDenied {
		t.Fatalf("grant after deny: %+v", lateGrant)
	}
	failed := ofType(e.events(t, runID), aaa.EventToolFailed)
	if len(failed) != 1 {
		t.Fatalf("tool.failed events: %d", len(failed))
	}
	var data struct {
		Error aaa.ErrorDetail `json:"error"`
	}
	if err := failed[0].Decode(&data); err != nil {
		t.Fatal(err)
	}
	if data.Error != (aaa.ErrorDetail{Type: "ApprovalDenied", Message: "not this vendor"}) {
		t.Fatalf("tool failure: %+v", data.Error)
	}
	if ran.Load() != 0 {
		t.Fatal("a denied tool ran")
	}
}

func TestWatchApprovalsFromAnotherClient(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	before := e.start(t, payACME(map[string]string{"team": "a"}))
	e.waitFor(t, before, aaa.EventApprovalRequested)

	// The approver is another client, on a connection of its own.
	approver := dial(t, e.server.Addr)
	ctx, stopWatching := context.WithCancel(e.ctx)
	defer stopWatching()
	updates := make(chan aaa.ApprovalUpdate)
	watchErr := make(chan error, 1)
	go func() {
		for update, err := range approver.WatchApprovals(ctx, aaa.WatchOptions{}) {
			if err != nil {
				watchErr <- err
				return
			}
			select {
			case updates <- update:
			case <-ctx.Done():
				return
			}
		}
		watchErr <- nil
	}()
	next := func() aaa.ApprovalUpdate {
		t.Helper()
		select {
		case u := <-updates:
			return u
		case err := <-watchErr:
			t.Fatalf("watch ended: %v", err)
		case <-e.ctx.Done():
			t.Fatal("timed out waiting for an approval update")
		}
		return aaa.ApprovalUpdate{}
	}

	snap := next()
	if snap.Kind != aaa.Requested || snap.Approval.RunID != before || snap.Approval.Labels["team"] != "a" || snap.Position != 0 {
		t.Fatalf("snapshot item: %+v", snap)
	}
	complete := next()
	if complete.Kind != aaa.SnapshotComplete || complete.Pending != 1 || complete.Position == 0 {
		t.Fatalf("snapshot complete: %+v", complete)
	}

	after := e.start(t, payACME(map[string]string{"team": "b"}))
	live := next()
	if live.Kind != aaa.Requested || live.Approval.RunID != after || string(live.Approval.Arguments) != `{"amount":250,"to":"ACME"}` {
		t.Fatalf("live request: %+v", live)
	}
	if _, err := approver.Approve(e.ctx, before, snap.Approval.CallID); err != nil {
		t.Fatal(err)
	}
	granted := next()
	if granted.Kind != aaa.Resolved || granted.Resolution.RunID != before || granted.Resolution.Outcome != aaa.OutcomeGranted {
		t.Fatalf("grant: %+v", granted)
	}
	if _, err := approver.Deny(e.ctx, after, live.Approval.CallID, "no"); err != nil {
		t.Fatal(err)
	}
	denied := next()
	if denied.Kind != aaa.Resolved || denied.Resolution.RunID != after || denied.Resolution.Outcome != aaa.OutcomeDenied || denied.Resolution.Reason != "no" {
		t.Fatalf("deny: %+v", denied)
	}
	if !(complete.Position < live.Position && live.Position < granted.Position && granted.Position < denied.Position) {
		t.Fatalf("positions not increasing: %d %d %d %d", complete.Position, live.Position, granted.Position, denied.Position)
	}
	if e.result(t, before).Text != "sent $250 to ACME" || e.result(t, after).Text != "ApprovalDenied: no" {
		t.Fatal("unexpected outcomes")
	}

	// Resuming from a position skips the snapshot and repeats nothing before it.
	resumeAt := complete.Position
	var resumed []aaa.ApprovalUpdate
	for update, err := range approver.WatchApprovals(e.ctx, aaa.WatchOptions{AfterPosition: &resumeAt}) {
		if err != nil {
			t.Fatal(err)
		}
		resumed = append(resumed, update)
		if len(resumed) == 3 {
			break
		}
	}
	// The same changes; their resume tokens say the same place, but a stream
	// that started elsewhere may encode it differently (per-shard cursors).
	want := []aaa.ApprovalUpdate{live, granted, denied}
	for i := range resumed {
		if resumed[i].ResumeToken == "" || want[i].ResumeToken == "" {
			t.Fatalf("an update without a resume token: %+v, %+v", resumed[i], want[i])
		}
		resumed[i].ResumeToken, want[i].ResumeToken = "", ""
	}
	if !reflect.DeepEqual(resumed, want) {
		t.Fatalf("resumed watch:\n%+v\nwant:\n%+v", resumed, want)
	}
	stopWatching()

	var inbox []aaa.Approval
	for a, err := range e.client.ListApprovals(e.ctx, aaa.ApprovalFilter{}) {
		if err != nil {
			t.Fatal(err)
		}
		inbox = append(inbox, a)
	}
	if len(inbox) != 0 {
		t.Fatalf("inbox not empty: %+v", inbox)
	}
}

func TestEventsResumeWithoutGapOrDuplicate(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	// A worker on a connection of its own, like a separate process.
	serveWith(t, e.ctx, dial(t, e.server.Addr), aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	// And an approval inbox that watches across the restart, on a connection of its own.
	watcher := dial(t, e.server.Addr)
	watched := make(chan []aaa.UpdateKind, 1)
	snapshotDone := make(chan struct{})
	go func() {
		var kinds []aaa.UpdateKind
		defer func() { watched <- kinds }()
		for update, err := range watcher.WatchApprovals(e.ctx, aaa.WatchOptions{}) {
			if err != nil {
				t.Errorf("WatchApprovals across a restart: %v", err)
				return
			}
			kinds = append(kinds, update.Kind)
			if update.Kind == aaa.SnapshotComplete {
				close(snapshotDone)
			}
			if update.Kind == aaa.Resolved {
				return
			}
		}
	}()
	select {
	case <-snapshotDone: // the request below comes live, after the (empty) snapshot
	case kinds := <-watched:
		t.Fatalf("the watch ended early: %v", kinds)
	}
	runID := e.start(t, payACME(nil))

	// Follow the run live; when it waits for approval, restart the server
	// (the stream breaks), and approve from another client once it is back.
	approver := dial(t, e.server.Addr)
	var seqs []uint64
	var last aaa.Event
	for event, err := range e.client.Events(e.ctx, runID, aaa.EventsOptions{Follow: true, StopAtEnd: true}) {
		if err != nil {
			t.Fatalf("Events across a restart: %v", err)
		}
		seqs = append(seqs, event.Seq)
		last = event
		if event.Type == aaa.EventApprovalRequested {
			e.server.Restart()
			var data struct {
				CallID string `json:"call_id"`
			}
			if err := event.Decode(&data); err != nil {
				t.Fatal(err)
			}
			if _, err := approver.Approve(e.ctx, runID, data.CallID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if last.Type != aaa.EventRunCompleted {
		t.Fatalf("the stream ended at %s", last.Type)
	}
	if kinds := <-watched; !slices.Equal(kinds, []aaa.UpdateKind{aaa.SnapshotComplete, aaa.Requested, aaa.Resolved}) {
		t.Fatalf("watched %v", kinds)
	}
	for i, seq := range seqs {
		if seq != uint64(i+1) {
			t.Fatalf("seqs not dense from 1: %v", seqs)
		}
	}

	// An explicit cursor resumes exactly after it.
	all := e.events(t, runID)
	if len(all) != len(seqs) {
		t.Fatalf("%d events stored, %d streamed", len(all), len(seqs))
	}
	for _, cursor := range []uint64{0, 4, uint64(len(all) - 1), uint64(len(all))} {
		var got []uint64
		for event, err := range e.client.Events(e.ctx, runID, aaa.EventsOptions{AfterSeq: cursor, Follow: true, StopAtEnd: true}) {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, event.Seq)
		}
		if want := seqs[cursor:]; !slices.Equal(got, want) {
			t.Fatalf("after %d: got %v, want %v", cursor, got, want)
		}
	}
	// A type filter still moves the cursor.
	var tools []string
	for event, err := range e.client.Events(e.ctx, runID, aaa.EventsOptions{TypePrefix: "aaa.tool."}) {
		if err != nil {
			t.Fatal(err)
		}
		tools = append(tools, event.Type)
	}
	if want := []string{aaa.EventToolRequested, aaa.EventToolStarted, aaa.EventToolCompleted}; !slices.Equal(tools, want) {
		t.Fatalf("tool events: %v", tools)
	}
}

func TestStartRunIsIdempotentAndListRunsFilters(t *testing.T) {
	e := setup(t)
	req := aaa.StartRunRequest{Task: "hi", Model: aaa.ScriptedModel(aaa.TextStep("hello")), RequestID: "req-1", Labels: map[string]string{"team": "x"}}
	first, err := e.client.StartRun(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	retry, err := e.client.StartRun(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Created || retry.Created || retry.RunID != first.RunID {
		t.Fatalf("first %+v, retry %+v", first, retry)
	}
	if out := e.result(t, first.RunID); out.Text != "hello" {
		t.Fatalf("outcome: %+v", out)
	}
	other := e.start(t, aaa.StartRunRequest{Task: "b", Model: aaa.ScriptedModel(aaa.TextStep("b")), Labels: map[string]string{"team": "y"}})
	third := e.start(t, aaa.StartRunRequest{Task: "c", Model: aaa.ScriptedModel(aaa.TextStep("c")), Labels: map[string]string{"team": "x"}})
	e.result(t, other)
	e.result(t, third)

	list := func(filter aaa.RunFilter) []string {
		t.Helper()
		var ids []string
		for run, err := range e.client.ListRuns(e.ctx, filter) {
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, run.ID)
		}
		return ids
	}
	if got := list(aaa.RunFilter{PageSize: 1}); !slices.Equal(got, []string{third, other, first.RunID}) {
		t.Fatalf("all runs, newest first, one per page: %v", got)
	}
	if got := list(aaa.RunFilter{Labels: map[string]string{"team": "x"}, Status: aaa.StatusCompleted}); !slices.Equal(got, []string{third, first.RunID}) {
		t.Fatalf("team x: %v", got)
	}
	if got := list(aaa.RunFilter{Status: aaa.StatusFailed}); len(got) != 0 {
		t.Fatalf("failed runs: %v", got)
	}
}

func TestCancelAndSignal(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	runID := e.start(t, payACME(nil))
	e.waitFor(t, runID, aaa.EventApprovalRequested)

	note, err := e.client.Signal(e.ctx, runID, "acme.note", map[string]any{"text": "looking", "n": 1}, aaa.WithRequestID("note-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.client.Signal(e.ctx, runID, "acme.note", map[string]any{"text": "looking", "n": 1}, aaa.WithRequestID("note-1"))
	if err != nil {
		t.Fatal(err)
	}
	if note.Seq == 0 || again != note {
		t.Fatalf("signal %+v, retried %+v", note, again)
	}
	seq, err := e.client.Cancel(e.ctx, runID, "changed my mind")
	if err != nil {
		t.Fatal(err)
	}
	if seq == 0 {
		t.Fatal("cancel appended nothing")
	}
	outcome := e.result(t, runID)
	if outcome.Status != aaa.StatusCancelled || outcome.Reason != "changed my mind" || outcome.Event.Seq != seq {
		t.Fatalf("outcome: %+v", outcome)
	}
	events := e.events(t, runID)
	notes := ofType(events, "acme.note")
	if len(notes) != 1 || string(notes[0].Data) != `{"n":1,"text":"looking"}` {
		t.Fatalf("notes: %+v", notes)
	}
	if len(ofType(events, aaa.EventApprovalExpired)) != 1 || ran.Load() != 0 {
		t.Fatalf("events: %v", types(events))
	}
}

func TestDeadlineFailsTheRun(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	req := payACME(nil)
	req.Budget = aaa.Budget{Deadline: 500 * time.Millisecond}
	runID := e.start(t, req)
	run, err := e.client.GetRun(e.ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if run.DeadlineAt.IsZero() {
		t.Fatalf("no deadline: %+v", run)
	}
	outcome := e.result(t, runID) // nobody answers the approval
	if outcome.Status != aaa.StatusFailed || outcome.Error == nil || outcome.Error.Type != "DeadlineExceeded" {
		t.Fatalf("outcome: %+v", outcome)
	}
	expired := ofType(e.events(t, runID), aaa.EventApprovalExpired)
	if len(expired) != 1 || decode(t, expired[0])["reason"] != "deadline" || ran.Load() != 0 {
		t.Fatalf("expired: %+v", expired)
	}
}
