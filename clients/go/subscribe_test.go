package aaa_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/aaav1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// subscribed runs Subscribe until the returned stop is called, which checks
// it ended because it was stopped.
func (e *env) subscribed(t *testing.T, eventTypes []string, handler aaa.DeliveryHandler, opts aaa.SubscribeOptions) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- e.client.Subscribe(ctx, eventTypes, handler, opts) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Subscribe: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestSubscriberApprovesEachRequestOnce(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Identity: "payments-1", Tools: []aaa.Tool{wireMoney(&ran)}})
	var mu sync.Mutex
	var seen []string
	approve := func(ctx context.Context, d aaa.Delivery) error {
		var data struct {
			CallID string `json:"call_id"`
		}
		if err := json.Unmarshal(d.Event.Data, &data); err != nil {
			return err
		}
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s/%d", d.Event.RunID, d.Attempt))
		mu.Unlock()
		_, err := e.client.Approve(ctx, d.Event.RunID, data.CallID)
		return err
	}
	stop := e.subscribed(t, []string{aaa.EventApprovalRequested}, approve, aaa.SubscribeOptions{Group: "acme.notify", FromBeginning: true})
	var want []string
	for range 3 {
		runID := e.start(t, payACME(nil))
		want = append(want, runID+"/1")
	}
	for _, runID := range want {
		runID = runID[:len(runID)-2]
		if outcome := e.result(t, runID); outcome.Status != aaa.StatusCompleted {
			t.Fatalf("outcome: %+v", outcome)
		}
	}
	stop()
	slices.Sort(want)
	slices.Sort(seen)
	if !slices.Equal(seen, want) {
		t.Fatalf("deliveries %v, want %v", seen, want)
	}
}

func TestFailingHandlerGetsTheEventAgain(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Identity: "payments-1", Tools: []aaa.Tool{wireMoney(&ran)}})
	attempts := make(chan uint32, 10)
	flaky := func(ctx context.Context, d aaa.Delivery) error {
		attempts <- d.Attempt
		if d.Attempt == 1 {
			return errors.New("mail server down")
		}
		return nil
	}
	e.subscribed(t, []string{"aaa.approval.*"}, flaky, aaa.SubscribeOptions{Group: "flaky", FromBeginning: true})
	e.start(t, payACME(nil))
	for _, want := range []uint32{1, 2} {
		select {
		case got := <-attempts:
			if got != want {
				t.Fatalf("attempt %d, want %d", got, want)
			}
		case <-e.ctx.Done():
			t.Fatal("no delivery")
		}
	}
}

func TestBadSubscriptionsAreRefused(t *testing.T) {
	e := setup(t)
	nothing := func(context.Context, aaa.Delivery) error { return nil }
	err := e.client.Subscribe(e.ctx, []string{"app.*.x"}, nothing, aaa.SubscribeOptions{Group: "g"})
	var aerr *aaa.Error
	if !errors.Is(err, aaa.ErrInvalidField) || !errors.As(err, &aerr) || aerr.Field() != "open.event_types[0]" {
		t.Fatalf("bad pattern: %v", err)
	}
	// A first member creates the group; its first answer says it joined.
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	first, err := e.client.SubscriptionService().Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	open := &aaav1.SubscriptionOpen{Group: "g", EventTypes: []string{"app.one"}}
	if err := first.Send(&aaav1.SubscribeRequest{Kind: &aaav1.SubscribeRequest_Open{Open: open}}); err != nil {
		t.Fatal(err)
	}
	if joined, err := first.Recv(); err != nil || !joined.GetSubscribed().GetCreated() {
		t.Fatalf("first member: %v %v", joined, err)
	}
	err = e.client.Subscribe(e.ctx, []string{"app.two"}, nothing, aaa.SubscribeOptions{Group: "g"})
	if !errors.Is(err, aaa.ErrGroupMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
}

// endsFirstStream is a connection whose first Subscribe stream ends cleanly
// (io.EOF) after its first delivery, as when the server ends it; the rest
// goes to the real connection.
type endsFirstStream struct {
	grpc.ClientConnInterface
	streams atomic.Int32
}

func (c *endsFirstStream) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	stream, err := c.ClientConnInterface.NewStream(ctx, desc, method, opts...)
	if err != nil || method != aaav1.SubscriptionService_Subscribe_FullMethodName || c.streams.Add(1) > 1 {
		return stream, err
	}
	return &endsAfterADelivery{ClientStream: stream}, nil
}

type endsAfterADelivery struct {
	grpc.ClientStream
	delivered bool
}

func (s *endsAfterADelivery) RecvMsg(m any) error {
	if s.delivered {
		return io.EOF
	}
	err := s.ClientStream.RecvMsg(m)
	s.delivered = err == nil && m.(*aaav1.SubscribeResponse).GetDelivery() != nil
	return err
}

func TestSubscriberJoinsAgainAfterTheServerEndsItsStream(t *testing.T) {
	e := setup(t)
	conn, err := grpc.NewClient(e.server.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	wrapped := &endsFirstStream{ClientConnInterface: conn}
	// No retry timeout: calls do not retry, but a subscription joins again all the same.
	subscriber := aaa.NewClient(wrapped, aaa.WithRetryTimeout(0))
	labels := map[string]string{"test": t.Name()}
	started := make(chan string, 100)
	note := func(ctx context.Context, d aaa.Delivery) error {
		started <- d.Event.RunID
		return nil
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() {
		done <- subscriber.Subscribe(ctx, []string{aaa.EventRunStarted}, note, aaa.SubscribeOptions{Group: "restart", Labels: labels, FromBeginning: true})
	}()
	// delivered waits for the delivery of a run's aaa.run.started, skipping
	// redeliveries of earlier ones.
	delivered := func(runID string) {
		t.Helper()
		for {
			select {
			case got := <-started:
				if got == runID {
					return
				}
			case err := <-done:
				t.Fatalf("Subscribe ended: %v", err)
			case <-e.ctx.Done():
				t.Fatalf("no delivery of %s", runID)
			}
		}
	}
	run := func(text string) string {
		return e.start(t, aaa.StartRunRequest{Task: text, Model: aaa.ScriptedModel(aaa.TextStep(text)), Labels: labels})
	}
	delivered(run("one")) // and the first stream ends
	delivered(run("two"))
	if n := wrapped.streams.Load(); n < 2 {
		t.Fatalf("%d Subscribe streams, want a second one", n)
	}
	e.server.Restart() // SIGTERM: the stream ends with UNAVAILABLE (SHUTTING_DOWN)
	delivered(run("three"))
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe after cancel: %v", err)
	}
}
