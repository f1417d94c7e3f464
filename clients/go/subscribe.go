package aaa

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"aaa.dev/clients/go/aaav1"
)

// Delivery is one event handed to this member of a consumer group.
type Delivery struct {
	// DeliveryID is what the SDK acks or nacks; each attempt has its own.
	DeliveryID string
	// Event is the event; RunID + Seq identify it across deliveries.
	Event Event
	// Attempt is 1 for the first delivery of the event to the group, then 2, ...
	Attempt uint32
	// Replayed is true when the event was put back from the dead-letter list.
	Replayed bool
	// AckDeadline is when the server delivers it again if the handler has not returned.
	AckDeadline time.Time
}

// SubscribeOptions says which group to join and how a new group is set up.
type SubscribeOptions struct {
	// Group is the group's name; the first member creates it. Required.
	Group string
	// Labels: only events of runs carrying all of these labels.
	Labels map[string]string
	// FromBeginning starts a new group at the beginning of the log instead of now.
	FromBeginning bool
	// AfterPosition starts a new group after this global position.
	AfterPosition *uint64
	// AckTimeout is how long a delivery may stay unacked (0: the group's, 30 s).
	AckTimeout time.Duration
	// MaxDeliveries is the attempts before dead-lettering (0: the group's, 5).
	MaxDeliveries uint32
	// MaxInFlight is the most unacked deliveries this member holds (0: 16).
	MaxInFlight uint32
}

// DeliveryHandler handles one delivery: nil acks it, an error nacks it.
type DeliveryHandler func(ctx context.Context, d Delivery) error

// SubscriptionService returns the generated SubscriptionService stub, for what the SDK does not wrap.
func (c *Client) SubscriptionService() aaav1.SubscriptionServiceClient {
	return c.subscriptions
}

// rejoinMaxDelay is the longest wait between two joins of a group whose
// stream ended.
const rejoinMaxDelay = 5 * time.Second

// Subscribe joins a consumer group and calls handler for each delivery,
// concurrently (at most MaxInFlight at a time), until ctx ends; it then waits
// for the handlers running and returns ctx's error. Each event matching
// eventTypes (exact types, prefixes like "aaa.approval.*", or "*") goes to
// one member of the group at a time. The handler returning nil acks it; an
// error nacks it, and it comes again (Attempt + 1) until the group's
// MaxDeliveries dead-letter it. Delivery is at least once: deduplicate on
// (Event.RunID, Event.Seq).
//
// When the stream ends for a reason that passes (the server ended it, is
// stopping or restarting, cannot be reached or cannot write: UNAVAILABLE; or
// dropped this member as too slow: ErrMemberTooSlow), Subscribe joins the
// group again, waiting 50 ms, then twice as long after each failed try up to
// 5 s, for as long as it takes (the client's retry timeout does not apply).
// Deliveries not acked come again. Any other refusal ends it with its error:
// ErrInvalidField for a bad pattern or group name, ErrGroupMismatch when the
// group exists with another definition, ErrPermissionDenied...
func (c *Client) Subscribe(ctx context.Context, eventTypes []string, handler DeliveryHandler, opts SubscribeOptions) error {
	open := &aaav1.SubscriptionOpen{
		Group:         opts.Group,
		EventTypes:    eventTypes,
		Labels:        opts.Labels,
		StartFrom:     aaav1.StartFrom_START_FROM_NOW,
		AckTimeoutS:   opts.AckTimeout.Seconds(),
		MaxDeliveries: opts.MaxDeliveries,
		MaxInFlight:   opts.MaxInFlight,
	}
	switch {
	case opts.AfterPosition != nil:
		open.StartFrom = aaav1.StartFrom_START_FROM_AFTER_POSITION
		open.StartAfterPosition = *opts.AfterPosition
	case opts.FromBeginning:
		open.StartFrom = aaav1.StartFrom_START_FROM_BEGINNING
	}
	var handlers sync.WaitGroup
	defer handlers.Wait()
	wait := newBackoff(forever, rejoinMaxDelay)
	for {
		err := c.subscribeOnce(ctx, open, handler, &handlers, wait)
		if ctx.Err() == nil && !rejoin(err) {
			return FromGRPC(err)
		}
		if !wait.sleep(ctx) {
			return FromGRPC(status.FromContextError(ctx.Err()).Err())
		}
	}
}

// rejoin reports whether a Subscribe stream that ended with err is worth
// joining again: the server ended it (io.EOF), went away or cannot write
// (UNAVAILABLE), or dropped the member as too slow.
func rejoin(err error) bool {
	return errors.Is(err, io.EOF) || transient(err) || errors.Is(FromGRPC(err), ErrMemberTooSlow)
}

// subscribeOnce runs one Subscribe stream until it fails.
func (c *Client) subscribeOnce(ctx context.Context, open *aaav1.SubscriptionOpen, handler DeliveryHandler, handlers *sync.WaitGroup, wait *retryBackoff) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.subscriptions.Subscribe(ctx)
	if err != nil {
		return err
	}
	// Handlers answer from their goroutines; gRPC wants one sender at a time.
	var sending sync.Mutex
	send := func(req *aaav1.SubscribeRequest) {
		sending.Lock()
		defer sending.Unlock()
		_ = stream.Send(req) // a failed send shows up in Recv
	}
	send(&aaav1.SubscribeRequest{Kind: &aaav1.SubscribeRequest_Open{Open: open}})
	for {
		response, err := stream.Recv()
		if err != nil {
			return err
		}
		wait.reset()
		d := response.GetDelivery()
		if d == nil {
			continue
		}
		delivery := Delivery{
			DeliveryID:  d.GetDeliveryId(),
			Event:       eventFromProto(d.GetEvent()),
			Attempt:     d.GetAttempt(),
			Replayed:    d.GetReplayed(),
			AckDeadline: timeOf(d.GetAckDeadline()),
		}
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			if err := handler(ctx, delivery); err != nil {
				nack := &aaav1.Nack{DeliveryId: delivery.DeliveryID, Reason: err.Error()}
				send(&aaav1.SubscribeRequest{Kind: &aaav1.SubscribeRequest_Nack{Nack: nack}})
				return
			}
			ack := &aaav1.Ack{DeliveryId: delivery.DeliveryID}
			send(&aaav1.SubscribeRequest{Kind: &aaav1.SubscribeRequest_Ack{Ack: ack}})
		}()
	}
}
