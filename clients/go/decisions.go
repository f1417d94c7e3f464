// Decisions on approval requests: Signal and its options, Approve, Deny,
// Edit and DecideApprovals.

package aaa

import (
	"context"

	"aaa.dev/clients/go/aaav1"
)

// SignalResult is Signal's answer.
type SignalResult struct {
	// Seq is the seq of the appended event; 0 when nothing was appended.
	Seq uint64
	// AlreadyDecided is true, for an approval decision, when the call had
	// already been decided (or had expired) and this decision changed nothing.
	AlreadyDecided bool
	// Decision is, for an approval decision, the event type of the decision
	// that stands: aaa.approval.granted, aaa.approval.denied,
	// aaa.approval.edited or aaa.approval.expired; or aaa.approval.voted for
	// a grant that is not yet the last one the call needs.
	Decision string
	// Votes is, for a grant of a call that needs several, the grants so far,
	// this one included; for an edit, 1 with WithGrant and 0 without.
	Votes uint32
	// ApprovalsRequired is, for a grant or an edit, how many grants the call needs.
	ApprovalsRequired uint32
	// NewCallID is, for an edit, the call requested in the edited call's place.
	NewCallID string
	// NewArgumentsSHA256 is, for an edit, the digest of the new call's
	// arguments: grant NewCallID with WithArgumentsSHA256(NewArgumentsSHA256).
	NewArgumentsSHA256 string
}

// SignalOption adds to a Signal, Approve, Deny, Edit or DecideApprovals call;
// each option says which it applies to.
type SignalOption func(*signalOptions)

type signalOptions struct {
	requestID       string
	comment         string
	argumentsSHA256 string
	approver        string
	reason          string
	grant           bool
	allOrNothing    bool
}

// WithRequestID sets the idempotency key of a Signal, Approve, Deny, Edit or
// DecideApprovals: a retry with the same id returns the first answer and
// appends nothing (for a batch: each item the first call decided comes back
// DecisionDecided with its seq, not DecisionAlreadyDecided). A fresh one is
// generated when it is not given.
func WithRequestID(id string) SignalOption {
	return func(o *signalOptions) { o.requestID = id }
}

// WithComment adds a comment to a grant (Approve, DecideApprovals with BatchGrant).
func WithComment(comment string) SignalOption {
	return func(o *signalOptions) { o.comment = comment }
}

// WithArgumentsSHA256 makes a decision valid only for the arguments with
// this hex SHA-256 (Approval.ArgumentsSHA256): the server refuses it with
// ErrArgumentsMismatch if the call's arguments are others (Approve, Deny, Edit).
func WithArgumentsSHA256(sha256 string) SignalOption {
	return func(o *signalOptions) { o.argumentsSHA256 = sha256 }
}

// WithApprover names the approver a grant counts for, when the server runs
// with auth off (unverified). Without it the approver is the caller's IP
// address, so every client on one host counts as one approver. With auth
// on the approver is the authenticated principal, and naming anyone else is
// refused with ErrInvalidField (Approve, Deny, Edit with WithGrant,
// DecideApprovals).
func WithApprover(name string) SignalOption {
	return func(o *signalOptions) { o.approver = name }
}

// WithReason gives the reason of an edit (the model reads it with the new
// arguments) or of a batch denial (Edit, DecideApprovals with BatchDeny).
func WithReason(reason string) SignalOption {
	return func(o *signalOptions) { o.reason = reason }
}

// WithGrant makes an edit also grant the new call, in the same step: the
// tool runs with the edited arguments once it has all the grants it needs (Edit).
func WithGrant() SignalOption {
	return func(o *signalOptions) { o.grant = true }
}

// WithAllOrNothing makes a batch decide nothing unless every item would be
// decided; the others then come back DecisionNotApplied (DecideApprovals).
func WithAllOrNothing() SignalOption {
	return func(o *signalOptions) { o.allOrNothing = true }
}

// Signal appends a client event to a run: "aaa.approval.granted",
// "aaa.approval.denied", "aaa.approval.edited", or a type outside the "aaa."
// prefix. data is the event's data, a JSON object (a map, a struct or
// json.RawMessage; nil means {}).
func (c *Client) Signal(ctx context.Context, runID, eventType string, data any, opts ...SignalOption) (SignalResult, error) {
	o := options(opts)
	dataJSON, err := encodeObject(data)
	if err != nil {
		return SignalResult{}, err
	}
	req := &aaav1.SignalRequest{RunId: runID, Type: eventType, DataJson: dataJSON, RequestId: o.requestID}
	if req.RequestId == "" {
		req.RequestId = newID()
	}
	var resp *aaav1.SignalResponse
	err = c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.runWrites(runID).Signal(ctx, req)
		return err
	})
	if err != nil {
		return SignalResult{}, err
	}
	return SignalResult{
		Seq:                resp.GetSeq(),
		AlreadyDecided:     resp.GetAlreadyDecided(),
		Decision:           resp.GetDecision(),
		Votes:              resp.GetVotes(),
		ApprovalsRequired:  resp.GetApprovalsRequired(),
		NewCallID:          resp.GetNewCallId(),
		NewArgumentsSHA256: resp.GetNewArgumentsSha256(),
	}, nil
}

func options(opts []SignalOption) signalOptions {
	var o signalOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// decisionData is the data every approval decision shares: the call, and the
// digest and approver when given.
func decisionData(callID string, o signalOptions) map[string]any {
	data := map[string]any{"call_id": callID}
	if o.argumentsSHA256 != "" {
		data["arguments_sha256"] = o.argumentsSHA256
	}
	if o.approver != "" {
		data["approver"] = o.approver
	}
	return data
}

// Approve grants one call of a run: the tool runs with exactly the arguments
// of its request. The first decision on a call wins; a later one answers with
// AlreadyDecided set. A call whose tool needs several approvers runs at the
// last grant it needs: the ones before answer Decision aaa.approval.voted
// with Votes and ApprovalsRequired, and the same approver granting twice is
// refused with ErrAlreadyVoted.
func (c *Client) Approve(ctx context.Context, runID, callID string, opts ...SignalOption) (SignalResult, error) {
	o := options(opts)
	data := decisionData(callID, o)
	if o.comment != "" {
		data["comment"] = o.comment
	}
	return c.Signal(ctx, runID, EventApprovalGranted, data, opts...)
}

// Deny refuses one call of a run: the tool fails with ApprovalDenied and the
// reason as message, and the model reads that as the tool's result. One
// denial denies a call that needs several approvers.
func (c *Client) Deny(ctx context.Context, runID, callID, reason string, opts ...SignalOption) (SignalResult, error) {
	data := decisionData(callID, options(opts))
	if reason != "" {
		data["reason"] = reason
	}
	return c.Signal(ctx, runID, EventApprovalDenied, data, opts...)
}

// Edit changes the arguments of a pending call (arguments as for
// ToolCallRequest: a map, a struct or json.RawMessage). The call is resolved
// as edited and never runs; a new call with the edited arguments is
// requested in its place (SignalResult.NewCallID) and needs its own grant,
// bound to SignalResult.NewArgumentsSHA256, unless WithGrant grants it in
// the same step. The model reads the new call's result as the answer to its
// own call, after a note of the new arguments and the reason (WithReason).
// Pass WithArgumentsSHA256(approval.ArgumentsSHA256) to edit only the
// arguments shown. Arguments that do not fit the tool's schema, or that are
// the requested ones, are refused with ErrInvalidField (field
// "data_json.arguments"); a call already decided answers AlreadyDecided.
func (c *Client) Edit(ctx context.Context, runID, callID string, arguments any, opts ...SignalOption) (SignalResult, error) {
	o := options(opts)
	data := decisionData(callID, o)
	data["arguments"] = arguments
	if o.reason != "" {
		data["reason"] = o.reason
	}
	if o.grant {
		data["grant"] = true
	}
	return c.Signal(ctx, runID, EventApprovalEdited, data, opts...)
}

// DecisionItem is one call of DecideApprovals, as the reviewer was shown it
// (Approval.DecisionItem): a batch names calls and their arguments, never a filter.
type DecisionItem struct {
	// RunID is the run.
	RunID string
	// CallID is the call.
	CallID string
	// ArgumentsSHA256 is the digest of the arguments shown
	// (Approval.ArgumentsSHA256). Required: the call is decided only if its
	// arguments are still these.
	ArgumentsSHA256 string
}

// DecisionResult is how one item of DecideApprovals went.
type DecisionResult struct {
	// RunID is the item's run.
	RunID string
	// CallID is the item's call.
	CallID string
	// Status says what happened; only DecisionDecided recorded anything.
	Status DecisionStatus
	// Decision is, for DecisionDecided, the event recorded
	// (aaa.approval.granted, aaa.approval.voted or aaa.approval.denied); for
	// DecisionAlreadyDecided, the decision that stands.
	Decision string
	// Seq is the seq of the recorded event; 0 when nothing was recorded.
	Seq uint64
	// ErrorReason and ErrorMessage say why an item was refused (e.g.
	// ErrArgumentsMismatch for DecisionMismatch, ErrAlreadyVoted).
	ErrorReason  Reason
	ErrorMessage string
}

// DecideApprovals grants (BatchGrant) or denies (BatchDeny) several calls
// at once, each only if its arguments are still those of its item. It
// returns one result per item, in the items' order; an item that cannot be
// decided does not stop the others, unless WithAllOrNothing is given.
// Options: WithComment (grant), WithReason (deny), WithApprover,
// WithAllOrNothing, WithRequestID. No items, an item without a digest, or a
// call named twice fail the whole call with ErrInvalidField. Like every call
// it is retried while the server is unavailable; with its request id, a
// retry after a lost reply gets the first reply again.
func (c *Client) DecideApprovals(ctx context.Context, items []DecisionItem, decision BatchDecision, opts ...SignalOption) ([]DecisionResult, error) {
	o := options(opts)
	req := &aaav1.DecideApprovalsRequest{
		Decision:     decision,
		Reason:       o.reason,
		Comment:      o.comment,
		AllOrNothing: o.allOrNothing,
		Approver:     o.approver,
		RequestId:    o.requestID,
	}
	if req.RequestId == "" {
		req.RequestId = newID()
	}
	for _, item := range items {
		req.Items = append(req.Items, &aaav1.DecisionItem{RunId: item.RunID, CallId: item.CallID, ArgumentsSha256: item.ArgumentsSHA256})
	}
	var resp *aaav1.DecideApprovalsResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.approvals.DecideApprovals(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	results := make([]DecisionResult, 0, len(resp.GetResults()))
	for _, r := range resp.GetResults() {
		results = append(results, DecisionResult{
			RunID:        r.GetRunId(),
			CallID:       r.GetCallId(),
			Status:       r.GetStatus(),
			Decision:     r.GetDecision(),
			Seq:          r.GetSeq(),
			ErrorReason:  Reason(r.GetErrorReason()),
			ErrorMessage: r.GetErrorMessage(),
		})
	}
	return results, nil
}
