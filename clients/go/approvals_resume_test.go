package aaa_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/aaav1"
)

// watching runs WatchApprovals of client in the background until the test
// ends; next returns its updates one by one, failing the test if the watch
// ends or the test times out first.
func (e *env) watching(t *testing.T, client *aaa.Client, opts aaa.WatchOptions) (next func() aaa.ApprovalUpdate) {
	t.Helper()
	ctx, stop := context.WithCancel(e.ctx)
	t.Cleanup(stop)
	updates := make(chan aaa.ApprovalUpdate)
	ended := make(chan error, 1)
	go func() {
		for update, err := range client.WatchApprovals(ctx, opts) {
			if err != nil {
				ended <- err
				return
			}
			select {
			case updates <- update:
			case <-ctx.Done():
				return
			}
		}
		ended <- nil
	}()
	return func() aaa.ApprovalUpdate {
		t.Helper()
		select {
		case u := <-updates:
			return u
		case err := <-ended:
			t.Fatalf("the watch ended: %v", err)
		case <-e.ctx.Done():
			t.Fatal("timed out waiting for an approval update")
		}
		return aaa.ApprovalUpdate{}
	}
}

// change is what an update says, without its resume token (a resumed
// stream may encode the same place differently).
func change(u aaa.ApprovalUpdate) string {
	switch u.Kind {
	case aaa.Requested:
		return fmt.Sprintf("%v %s %d", u.Kind, u.Approval.RunID, u.Position)
	case aaa.Resolved:
		return fmt.Sprintf("%v %s %d", u.Kind, u.Resolution.RunID, u.Position)
	case aaa.Voted:
		return fmt.Sprintf("%v %s %d", u.Kind, u.Vote.RunID, u.Position)
	}
	return fmt.Sprintf("%v %d", u.Kind, u.Position)
}

func changes(updates []aaa.ApprovalUpdate) []string {
	var out []string
	for _, u := range updates {
		out = append(out, change(u))
	}
	return out
}

// requestApproval starts a run that asks to pay and waits for its request.
func (e *env) requestApproval(t *testing.T) string {
	t.Helper()
	runID := e.start(t, payACME(nil))
	e.waitFor(t, runID, aaa.EventApprovalRequested)
	return runID
}

func TestWatchResumedWithATokenGetsExactlyTheChangesAfterIt(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	next := e.watching(t, e.client, aaa.WatchOptions{})
	snapshot := next()
	if snapshot.Kind != aaa.SnapshotComplete || snapshot.ResumeToken == "" {
		t.Fatalf("snapshot complete: %+v", snapshot)
	}
	first, second := e.requestApproval(t), e.requestApproval(t)
	for _, runID := range []string{first, second} {
		if _, err := e.client.Cancel(e.ctx, runID, "no"); err != nil {
			t.Fatal(err)
		}
	}
	var seen []aaa.ApprovalUpdate
	for range 4 {
		seen = append(seen, next())
	}
	want := []string{
		change(aaa.ApprovalUpdate{Kind: aaa.Requested, Approval: &aaa.Approval{RunID: first}, Position: seen[0].Position}),
		change(aaa.ApprovalUpdate{Kind: aaa.Requested, Approval: &aaa.Approval{RunID: second}, Position: seen[1].Position}),
		change(aaa.ApprovalUpdate{Kind: aaa.Resolved, Resolution: &aaa.ApprovalResolution{RunID: first}, Position: seen[2].Position}),
		change(aaa.ApprovalUpdate{Kind: aaa.Resolved, Resolution: &aaa.ApprovalResolution{RunID: second}, Position: seen[3].Position}),
	}
	if got := changes(seen); !slices.Equal(got, want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
	marks := []string{snapshot.ResumeToken}
	for _, u := range seen {
		if u.ResumeToken == "" {
			t.Fatalf("a change without a resume token: %+v", u)
		}
		marks = append(marks, u.ResumeToken)
	}

	// From the snapshot's token and from each change's: exactly the changes
	// after it, in order.
	for k, token := range marks {
		next := e.watching(t, e.client, aaa.WatchOptions{ResumeToken: token})
		var got []aaa.ApprovalUpdate
		for range seen[k:] {
			got = append(got, next())
		}
		if !slices.Equal(changes(got), changes(seen[k:])) {
			t.Fatalf("resumed after %d: %v, want %v", k, changes(got), changes(seen[k:]))
		}
		// Nothing repeated after them: the next update is a new change.
		third := e.requestApproval(t)
		requested := next()
		if requested.Kind != aaa.Requested || requested.Approval.RunID != third {
			t.Fatalf("resumed after %d, then: %+v", k, requested)
		}
		if _, err := e.client.Cancel(e.ctx, third, "no"); err != nil {
			t.Fatal(err)
		}
		resolved := next()
		if resolved.Kind != aaa.Resolved || resolved.Resolution.RunID != third {
			t.Fatalf("resumed after %d, then: %+v", k, resolved)
		}
		// This round's changes come after every token: later rounds get them too.
		seen = append(seen, requested, resolved)
	}
}

// watchRequests records each WatchApprovals request a client sends.
type watchRequests struct {
	mu   sync.Mutex
	sent []*aaav1.WatchApprovalsRequest
}

func (w *watchRequests) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	stream, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return recordingStream{stream, w}, nil
}

func (w *watchRequests) all() []*aaav1.WatchApprovalsRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.sent)
}

type recordingStream struct {
	grpc.ClientStream
	requests *watchRequests
}

func (s recordingStream) SendMsg(m any) error {
	if req, ok := m.(*aaav1.WatchApprovalsRequest); ok {
		s.requests.mu.Lock()
		s.requests.sent = append(s.requests.sent, proto.Clone(req).(*aaav1.WatchApprovalsRequest))
		s.requests.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func TestWatchResumesWithItsLastTokenAcrossAServerRestart(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	stopWorker := e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	requests := &watchRequests{}
	watcher, err := aaa.Dial(e.server.Addr, aaa.WithDialOptions(grpc.WithChainStreamInterceptor(requests.intercept)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watcher.Close() })
	next := e.watching(t, watcher, aaa.WatchOptions{})
	snapshot := next()
	one, two := e.requestApproval(t), e.requestApproval(t)
	stopWorker()
	for _, runID := range []string{one, two} {
		if u := next(); u.Kind != aaa.Requested || u.Approval.RunID != runID {
			t.Fatalf("request of %s: %+v", runID, u)
		}
	}
	if _, err := e.client.Cancel(e.ctx, one, "no"); err != nil {
		t.Fatal(err)
	}
	resolved := next()
	if resolved.Kind != aaa.Resolved || resolved.Resolution.RunID != one || resolved.ResumeToken == "" {
		t.Fatalf("resolution of %s: %+v", one, resolved)
	}

	e.server.Restart() // SIGTERM: the stream ends with UNAVAILABLE
	if _, err := e.client.Cancel(e.ctx, two, "no"); err != nil {
		t.Fatal(err)
	}
	// Only the change made while the stream was down: none of the earlier ones again.
	if u := next(); u.Kind != aaa.Resolved || u.Resolution.RunID != two {
		t.Fatalf("after the restart: %+v", u)
	}

	// The first stream started with a snapshot; each try after it (some may
	// have found the server down) resumed with the token of the last update.
	sent := requests.all()
	if len(sent) < 2 || sent[0].ResumeToken != nil || sent[0].AfterPosition != nil {
		t.Fatalf("requests sent: %v", sent)
	}
	for _, retry := range sent[1:] {
		if retry.GetResumeToken() != resolved.ResumeToken || retry.AfterPosition != nil {
			t.Fatalf("a retry: %v, want resume_token %q", retry, resolved.ResumeToken)
		}
	}
	if snapshot.ResumeToken == resolved.ResumeToken {
		t.Fatal("the snapshot and a later change have the same token")
	}
}
