package aaa_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/aaav1"
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
