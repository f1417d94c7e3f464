// Approval requests: ListApprovals and WatchApprovals.

package aaa

import (
	"context"
	"errors"
	"io"
	"iter"
	"time"

	"aaa.dev/clients/go/aaav1"
	"google.golang.org/protobuf/proto"
)

// ApprovalFilter selects approval requests for ListApprovals and WatchApprovals.
type ApprovalFilter struct {
	// Tool keeps requests for this tool.
	Tool string
	// RunID keeps requests of this run.
	RunID string
	// Labels keeps requests of runs carrying all of these labels.
	Labels map[string]string
	// Decidable keeps the requests the caller may decide: those whose
	// approver groups include one of its own, and those that name none (with
	// auth off, every request). WatchApprovals does not filter votes and
	// resolutions by it.
	Decidable bool
	// PageSize is how many requests each ListApprovals call fetches; 0 means 50.
	PageSize uint32
}

// ListApprovals iterates over the pending approval requests that match the
// filter, oldest run first, fetching pages as the loop goes. It stops after
// yielding an error.
func (c *Client) ListApprovals(ctx context.Context, filter ApprovalFilter) iter.Seq2[Approval, error] {
	return func(yield func(Approval, error) bool) {
		req := &aaav1.ListApprovalsRequest{
			Tool:      filter.Tool,
			RunId:     filter.RunID,
			Labels:    filter.Labels,
			PageSize:  filter.PageSize,
			Decidable: filter.Decidable,
		}
		for {
			var resp *aaav1.ListApprovalsResponse
			err := c.retry(ctx, func(ctx context.Context) (err error) {
				resp, err = c.approvals.ListApprovals(ctx, req)
				return err
			})
			if err != nil {
				yield(Approval{}, err)
				return
			}
			for _, a := range resp.GetApprovals() {
				if !yield(approvalFromProto(a), nil) {
					return
				}
			}
			if resp.GetNextPageToken() == "" {
				return
			}
			req.PageToken = resp.GetNextPageToken()
		}
	}
}

// WatchOptions says what WatchApprovals yields.
type WatchOptions struct {
	// ApprovalFilter selects the requests (PageSize is not used).
	ApprovalFilter
	// ResumeToken resumes a watch: no snapshot, exactly the changes after
	// the update it came with (the ResumeToken of the last update handled,
	// unchanged), on any server of the deployment and across restarts. ""
	// (and AfterPosition nil) starts with a snapshot of what is pending.
	ResumeToken string
	// AfterPosition resumes a watch, the older form: the changes after this
	// position (the Position of the last update handled). Exact only for
	// positions from before the server's log was partitioned by shard, or of
	// a log with one committer (the embedded store, or one server on
	// PostgreSQL). Ignored when ResumeToken is set.
	AfterPosition *uint64
	// Heartbeat is how often the server shows it is alive while nothing
	// happens; 0 means 15 s. Heartbeats are not yielded.
	Heartbeat time.Duration
}

// UpdateKind says what an ApprovalUpdate reports.
type UpdateKind int

// The kinds of ApprovalUpdate.
const (
	// Requested: Approval is pending (from the snapshot, or new).
	Requested UpdateKind = iota + 1
	// Resolved: Resolution says how a request ended.
	Resolved
	// SnapshotComplete: every request pending at the start has been yielded;
	// Pending says how many. What follows are changes.
	SnapshotComplete
	// Voted: Vote is a grant of a call that needs several, not yet the last
	// one (the call stays pending).
	Voted
)

// String returns the kind's name.
func (k UpdateKind) String() string {
	switch k {
	case Requested:
		return "Requested"
	case Resolved:
		return "Resolved"
	case SnapshotComplete:
		return "SnapshotComplete"
	case Voted:
		return "Voted"
	}
	return "UpdateKind(?)"
}

// ApprovalUpdate is one item of WatchApprovals.
type ApprovalUpdate struct {
	// Kind says which of the fields below is set.
	Kind UpdateKind
	// Position is the update's position in the log, the older resume point
	// (WatchOptions.AfterPosition). It is 0 for requests of the snapshot,
	// which are resumed by starting over.
	Position uint64
	// ResumeToken is where the update leaves the stream: pass the last one
	// handled as WatchOptions.ResumeToken to resume after it. "" for
	// requests of the snapshot (and from a server older than resume tokens).
	ResumeToken string
	// Approval is the pending request (Requested).
	Approval *Approval
	// Resolution says how a request was resolved (Resolved).
	Resolution *ApprovalResolution
	// Vote is the grant cast (Voted).
	Vote *ApprovalVote
	// Pending is the number of requests in the snapshot (SnapshotComplete).
	Pending uint32
}

// WatchApprovals iterates over pending approval requests, then over changes,
// until ctx ends or the loop breaks: each pending request (the snapshot), one
// SnapshotComplete, then each new request, each vote and each resolution as
// it becomes durable. A dropped connection is resumed with the last resume
// token seen (the last position, from a server that sends no tokens); a
// snapshot cut short is started over without repeating what was yielded. It
// stops after yielding an error.
func (c *Client) WatchApprovals(ctx context.Context, opts WatchOptions) iter.Seq2[ApprovalUpdate, error] {
	return func(yield func(ApprovalUpdate, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		token := opts.ResumeToken
		var position *uint64
		if opts.AfterPosition != nil {
			p := *opts.AfterPosition
			position = &p
		}
		type key struct{ run, call string }
		seen := map[key]bool{} // requests of the snapshot already yielded
		wait := c.newBackoff()
		for {
			req := &aaav1.WatchApprovalsRequest{
				Tool:       opts.Tool,
				RunId:      opts.RunID,
				Labels:     opts.Labels,
				HeartbeatS: opts.Heartbeat.Seconds(),
				Decidable:  opts.Decidable,
			}
			// One resume point: the server refuses an after_position past its
			// head even beside a token, and a token says more.
			if token != "" {
				req.ResumeToken = proto.String(token)
			} else {
				req.AfterPosition = position
			}
			stream, err := c.approvals.WatchApprovals(ctx, req)
			for err == nil {
				var item *aaav1.WatchApprovalsResponse
				if item, err = stream.Recv(); err != nil {
					break
				}
				wait.reset()
				inSnapshot := token == "" && position == nil
				p := item.GetPosition()
				if !inSnapshot || item.GetSnapshotComplete() != nil {
					// The snapshot's requests carry no token: resuming
					// there would skip the rest of it.
					if t := item.GetResumeToken(); t != "" {
						token = t
					}
					position = &p
				}
				var update ApprovalUpdate
				switch x := item.GetItem().(type) {
				case *aaav1.WatchApprovalsResponse_SnapshotComplete:
					update = ApprovalUpdate{Kind: SnapshotComplete, Pending: x.SnapshotComplete.GetPending()}
				case *aaav1.WatchApprovalsResponse_Requested:
					a := approvalFromProto(x.Requested)
					update = ApprovalUpdate{Kind: Requested, Approval: &a}
					if inSnapshot {
						k := key{a.RunID, a.CallID}
						if seen[k] {
							continue
						}
						seen[k] = true
					}
				case *aaav1.WatchApprovalsResponse_Resolved:
					r := resolutionFromProto(x.Resolved)
					update = ApprovalUpdate{Kind: Resolved, Resolution: &r}
				case *aaav1.WatchApprovalsResponse_Voted:
					v := voteUpdateFromProto(x.Voted)
					update = ApprovalUpdate{Kind: Voted, Vote: &v}
				default: // heartbeat
					continue
				}
				if !inSnapshot || update.Kind == SnapshotComplete {
					update.Position = p
					update.ResumeToken = item.GetResumeToken()
				}
				if !yield(update, nil) {
					return
				}
			}
			if errors.Is(err, io.EOF) {
				return
			}
			if transient(err) && wait.sleep(ctx) {
				continue
			}
			yield(ApprovalUpdate{}, giveUp(ctx, err))
			return
		}
	}
}
