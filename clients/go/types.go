package aaa

import (
	"encoding/json"
	"time"

	"aaa.dev/clients/go/aaav1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// RunStatus is where a run is in its lifecycle.
type RunStatus = aaav1.RunStatus

// The run statuses.
const (
	StatusRunning            = aaav1.RunStatus_RUN_STATUS_RUNNING
	StatusWaitingForApproval = aaav1.RunStatus_RUN_STATUS_WAITING_FOR_APPROVAL
	StatusCompleted          = aaav1.RunStatus_RUN_STATUS_COMPLETED
	StatusFailed             = aaav1.RunStatus_RUN_STATUS_FAILED
	StatusCancelled          = aaav1.RunStatus_RUN_STATUS_CANCELLED
)

// Role says who spoke a message.
type Role = aaav1.Role

// The roles of a conversation's messages.
const (
	RoleSystem    = aaav1.Role_ROLE_SYSTEM
	RoleUser      = aaav1.Role_ROLE_USER
	RoleAssistant = aaav1.Role_ROLE_ASSISTANT
	RoleTool      = aaav1.Role_ROLE_TOOL
)

// ActorKind says what kind of actor caused an event.
type ActorKind = aaav1.ActorKind

// The kinds of actor.
const (
	ActorEngine = aaav1.ActorKind_ACTOR_KIND_ENGINE
	ActorWorker = aaav1.ActorKind_ACTOR_KIND_WORKER
	ActorClient = aaav1.ActorKind_ACTOR_KIND_CLIENT
	// ActorPolicy: the approval policy granted or denied a call; Actor.Name is the rule.
	ActorPolicy = aaav1.ActorKind_ACTOR_KIND_POLICY
	// ActorGrant: a standing grant; Name is the grant's id.
	ActorGrant = aaav1.ActorKind_ACTOR_KIND_GRANT
)

// ApprovalOutcome says how an approval request ended.
type ApprovalOutcome = aaav1.ApprovalOutcome

// The ways an approval request ends.
const (
	OutcomeGranted = aaav1.ApprovalOutcome_APPROVAL_OUTCOME_GRANTED
	OutcomeDenied  = aaav1.ApprovalOutcome_APPROVAL_OUTCOME_DENIED
	OutcomeExpired = aaav1.ApprovalOutcome_APPROVAL_OUTCOME_EXPIRED
	// OutcomeEdited: a reviewer changed the arguments; the call never runs and
	// ApprovalResolution.ReplacedBy is requested in its place.
	OutcomeEdited = aaav1.ApprovalOutcome_APPROVAL_OUTCOME_EDITED
)

// BatchDecision is what DecideApprovals decides for every item.
type BatchDecision = aaav1.BatchDecision

// The decisions of a batch.
const (
	BatchGrant = aaav1.BatchDecision_BATCH_DECISION_GRANT
	BatchDeny  = aaav1.BatchDecision_BATCH_DECISION_DENY
)

// DecisionStatus says how one item of DecideApprovals went.
type DecisionStatus = aaav1.DecisionStatus

// The statuses of a batch's items. Only DecisionDecided recorded anything.
const (
	// DecisionDecided: recorded; DecisionResult.Decision says as what (granted, voted or denied).
	DecisionDecided = aaav1.DecisionStatus_DECISION_STATUS_DECIDED
	// DecisionAlreadyDecided: the call was decided or expired already (Decision
	// says how), or this approver had already voted for it.
	DecisionAlreadyDecided = aaav1.DecisionStatus_DECISION_STATUS_ALREADY_DECIDED
	// DecisionMismatch: the item's ArgumentsSHA256 is not the call's.
	DecisionMismatch = aaav1.DecisionStatus_DECISION_STATUS_MISMATCH
	// DecisionNotFound: no such run, or no pending request for that call.
	DecisionNotFound = aaav1.DecisionStatus_DECISION_STATUS_NOT_FOUND
	// DecisionRefused: refused for another reason (ErrorReason says which).
	DecisionRefused = aaav1.DecisionStatus_DECISION_STATUS_REFUSED
	// DecisionNotApplied: WithAllOrNothing was given and another item was refused.
	DecisionNotApplied = aaav1.DecisionStatus_DECISION_STATUS_NOT_APPLIED
)

// Event types the engine appends to a run's log, and the decisions a client
// may append with Signal. See the catalogue at the top of types.proto for
// each type's data.
const (
	EventRunStarted        = "aaa.run.started"
	EventLLMRequested      = "aaa.llm.requested"
	EventLLMCompleted      = "aaa.llm.completed"
	EventLLMFailed         = "aaa.llm.failed"
	EventToolRequested     = "aaa.tool.requested"
	EventApprovalRequested = "aaa.approval.requested"
	EventApprovalGranted   = "aaa.approval.granted"
	EventApprovalDenied    = "aaa.approval.denied"
	EventApprovalVoted     = "aaa.approval.voted"
	EventApprovalEdited    = "aaa.approval.edited"
	EventApprovalExpired   = "aaa.approval.expired"
	EventToolStarted       = "aaa.tool.started"
	EventToolCompleted     = "aaa.tool.completed"
	EventToolRetrying      = "aaa.tool.retrying"
	EventToolFailed        = "aaa.tool.failed"
	EventRunCompleted      = "aaa.run.completed"
	EventRunFailed         = "aaa.run.failed"
	EventRunCancelled      = "aaa.run.cancelled"
)

// ErrorDetail is an error as recorded in events and reported by workers.
type ErrorDetail struct {
	// Type is short and machine-readable, e.g. "ApprovalDenied", "DeadlineExceeded", "AttemptLost".
	Type string `json:"type"`
	// Message is for humans.
	Message string `json:"message"`
}

// String formats the error as "Type: message".
func (e ErrorDetail) String() string { return e.Type + ": " + e.Message }

// Actor is who caused an event.
type Actor struct {
	// Kind is engine, worker, client, policy or grant.
	Kind ActorKind
	// Name is the worker's identity, the client's name, the policy rule
	// that granted or denied, or the standing grant's id; empty for the engine.
	Name string
	// Principal is, for a worker with auth on, the authenticated principal
	// that served the task (an identity alone is only a label). Empty
	// otherwise: a client's name already is its principal.
	Principal string
}

// Event is one event of a run's append-only log.
type Event struct {
	// RunID is the run the event belongs to.
	RunID string
	// Seq is the event's position in its run: dense, from 1.
	Seq uint64
	// Position is the event's position in the server's global log.
	Position uint64
	// ID is the event's unique id.
	ID string
	// Type is the event type, e.g. "aaa.tool.requested".
	Type string
	// Data is the event's data: a JSON object, exactly as the server sent it.
	Data json.RawMessage
	// Time is when the event was appended (server clock).
	Time time.Time
	// Actor is who caused the event.
	Actor Actor
}

// Decode decodes the event's data into v with DecodeJSON (numbers stay exact).
func (e Event) Decode(v any) error { return DecodeJSON(e.Data, v) }

// Terminal reports whether the event ends its run (aaa.run.completed,
// aaa.run.failed or aaa.run.cancelled).
func (e Event) Terminal() bool {
	return e.Type == EventRunCompleted || e.Type == EventRunFailed || e.Type == EventRunCancelled
}

// Run is a run's summary.
type Run struct {
	// ID is the run's id.
	ID string
	// Status is where the run is in its lifecycle.
	Status RunStatus
	// Task is the task the run was started with.
	Task string
	// Model is "scripted", the name of the worker-served model, or "openai:MODEL@PROVIDER".
	Model string
	// Tools are the names of the tools the run may call.
	Tools []string
	// Labels are the labels given at StartRun.
	Labels map[string]string
	// CreatedAt is when the run started.
	CreatedAt time.Time
	// UpdatedAt is when its last event was appended.
	UpdatedAt time.Time
	// DeadlineAt is when the run's deadline passes; zero if it has none.
	DeadlineAt time.Time
	// LastSeq is the seq of the run's last event.
	LastSeq uint64
	// Result is, for a completed run, the value of aaa.run.completed, e.g. {"text":"..."}.
	Result json.RawMessage
	// Error is, for a failed or cancelled run, why.
	Error *ErrorDetail
	// PendingApprovals are the approvals the run waits for.
	PendingApprovals []Approval
	// Usage is the tokens the run's built-in model calls used (zero for other models).
	Usage TokenUsage
}

// TokenUsage is what a run's model calls used, as the provider reported it.
type TokenUsage struct {
	PromptTokens, CompletionTokens, TotalTokens uint64
}

// Approval is a pending approval request: a tool call waiting for a human decision.
type Approval struct {
	// RunID is the run that waits.
	RunID string
	// CallID is the call to approve or deny.
	CallID string
	// Tool is the tool's name.
	Tool string
	// Arguments are the exact arguments the tool gets if granted (canonical JSON).
	Arguments json.RawMessage
	// ArgumentsSHA256 is the hex SHA-256 of Arguments; pass it to Approve with
	// WithArgumentsSHA256 to grant exactly these arguments.
	ArgumentsSHA256 string
	// RequestedAt is when the request was made.
	RequestedAt time.Time
	// ExpiresAt is when the request expires; zero if it does not.
	ExpiresAt time.Time
	// Labels are the run's labels.
	Labels map[string]string
	// Seq is the seq of the aaa.approval.requested event.
	Seq uint64
	// Position is the global position of the aaa.approval.requested event.
	Position uint64
	// Task is the run's task (its first user message): what the call is for.
	Task string
	// ApprovalsRequired is how many grants from distinct approvers the call needs (1 or more).
	ApprovalsRequired uint32
	// Votes are the grants cast so far, oldest first (fewer than ApprovalsRequired).
	Votes []Vote
	// EditedFrom is, for a call a reviewer edited, the call it replaces.
	EditedFrom string
	// Approvers are the approver groups that may decide the call (from its
	// tool or a policy rule); empty: any approver.
	Approvers []string
}

// DecisionItem is the item of DecideApprovals that decides this request as
// it was shown: its run, its call and the digest of its arguments.
func (a Approval) DecisionItem() DecisionItem {
	return DecisionItem{RunID: a.RunID, CallID: a.CallID, ArgumentsSHA256: a.ArgumentsSHA256}
}

// Vote is one approver's grant of a call that needs several.
type Vote struct {
	// Approver is the authenticated principal with auth on; with auth off the
	// name given with WithApprover (unverified), else the caller's IP address.
	Approver string
	// Time is when the grant was recorded.
	Time time.Time
	// Comment is the grant's comment.
	Comment string
}

// ApprovalVote is a grant of a call that needs several, not yet the last one
// (WatchApprovals' Voted updates).
type ApprovalVote struct {
	// RunID is the run.
	RunID string
	// CallID is the call.
	CallID string
	// Tool is the tool's name.
	Tool string
	// Vote is the grant.
	Vote
	// Votes is how many grants the call has, this one included.
	Votes uint32
	// ApprovalsRequired is how many grants the call needs.
	ApprovalsRequired uint32
	// Seq is the seq of the aaa.approval.voted event.
	Seq uint64
}

// ApprovalResolution says how an approval request was resolved.
type ApprovalResolution struct {
	// RunID is the run.
	RunID string
	// CallID is the call.
	CallID string
	// Tool is the tool's name.
	Tool string
	// Outcome is granted, denied, expired or edited.
	Outcome ApprovalOutcome
	// Reason is the denial's, expiry's or edit's reason, or a grant's comment.
	Reason string
	// Seq is the seq of the resolving event.
	Seq uint64
	// Time is when the request was resolved.
	Time time.Time
	// ReplacedBy is, for OutcomeEdited, the call requested in this one's place.
	ReplacedBy string
}

// Outcome is how a run ended, as returned by Client.Result. A failed or
// cancelled run is an outcome, not an error.
type Outcome struct {
	// RunID is the run.
	RunID string
	// Status is StatusCompleted, StatusFailed or StatusCancelled.
	Status RunStatus
	// Value is, for a completed run, the value of aaa.run.completed, e.g. {"text":"..."}.
	Value json.RawMessage
	// Text is Value's "text" field.
	Text string
	// Error is, for a failed run, why it failed.
	Error *ErrorDetail
	// Reason is, for a cancelled run, the reason given to Cancel.
	Reason string
	// Event is the terminal event.
	Event Event
}

func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func eventFromProto(e *aaav1.Event) Event {
	return Event{
		RunID:    e.GetRunId(),
		Seq:      e.GetSeq(),
		Position: e.GetPosition(),
		ID:       e.GetId(),
		Type:     e.GetType(),
		Data:     json.RawMessage(e.GetDataJson()),
		Time:     timeOf(e.GetTime()),
		Actor:    Actor{Kind: e.GetActor().GetKind(), Name: e.GetActor().GetName(), Principal: e.GetActor().GetPrincipal()},
	}
}

func errorFromProto(e *aaav1.ErrorDetail) *ErrorDetail {
	if e == nil {
		return nil
	}
	return &ErrorDetail{Type: e.GetType(), Message: e.GetMessage()}
}

func runFromProto(r *aaav1.Run) Run {
	run := Run{
		ID:         r.GetRunId(),
		Status:     r.GetStatus(),
		Task:       r.GetTask(),
		Model:      r.GetModel(),
		Tools:      r.GetTools(),
		Labels:     r.GetLabels(),
		CreatedAt:  timeOf(r.GetCreatedAt()),
		UpdatedAt:  timeOf(r.GetUpdatedAt()),
		DeadlineAt: timeOf(r.GetDeadlineAt()),
		LastSeq:    r.GetLastSeq(),
		Error:      errorFromProto(r.GetError()),
		Usage: TokenUsage{
			PromptTokens:     r.GetUsage().GetPromptTokens(),
			CompletionTokens: r.GetUsage().GetCompletionTokens(),
			TotalTokens:      r.GetUsage().GetTotalTokens(),
		},
	}
	if r.GetResultJson() != "" {
		run.Result = json.RawMessage(r.GetResultJson())
	}
	for _, a := range r.GetPendingApprovals() {
		run.PendingApprovals = append(run.PendingApprovals, approvalFromProto(a))
	}
	return run
}

func approvalFromProto(a *aaav1.Approval) Approval {
	approval := Approval{
		RunID:             a.GetRunId(),
		CallID:            a.GetCallId(),
		Tool:              a.GetTool(),
		Arguments:         json.RawMessage(a.GetArgumentsJson()),
		ArgumentsSHA256:   a.GetArgumentsSha256(),
		RequestedAt:       timeOf(a.GetRequestedAt()),
		ExpiresAt:         timeOf(a.GetExpiresAt()),
		Labels:            a.GetLabels(),
		Seq:               a.GetSeq(),
		Position:          a.GetPosition(),
		Task:              a.GetTask(),
		ApprovalsRequired: max(a.GetApprovalsRequired(), 1), // 0 from a server older than N-of-M
		EditedFrom:        a.GetEditedFrom(),
		Approvers:         a.GetApprovers(),
	}
	for _, v := range a.GetVotes() {
		approval.Votes = append(approval.Votes, voteFromProto(v))
	}
	return approval
}

func voteFromProto(v *aaav1.Vote) Vote {
	return Vote{Approver: v.GetApprover(), Time: timeOf(v.GetTime()), Comment: v.GetComment()}
}

func voteUpdateFromProto(v *aaav1.ApprovalVoted) ApprovalVote {
	return ApprovalVote{
		RunID:             v.GetRunId(),
		CallID:            v.GetCallId(),
		Tool:              v.GetTool(),
		Vote:              voteFromProto(v.GetVote()),
		Votes:             v.GetVotes(),
		ApprovalsRequired: v.GetApprovalsRequired(),
		Seq:               v.GetSeq(),
	}
}

func resolutionFromProto(r *aaav1.ApprovalResolution) ApprovalResolution {
	return ApprovalResolution{
		RunID:      r.GetRunId(),
		CallID:     r.GetCallId(),
		Tool:       r.GetTool(),
		Outcome:    r.GetOutcome(),
		Reason:     r.GetReason(),
		Seq:        r.GetSeq(),
		Time:       timeOf(r.GetTime()),
		ReplacedBy: r.GetReplacedBy(),
	}
}

// Policy describes the approval policy a server runs with (Client.GetPolicy,
// Client.ReloadPolicy).
type Policy struct {
	// Loaded is false when the server runs without a policy (the other fields are then empty).
	Loaded bool
	// SHA256 is the hex SHA-256 of the policy file as loaded; events a rule decided carry it.
	SHA256 string
	// Rules are the rules' names, in the order they are tried.
	Rules []string
	// File is the file it was loaded from.
	File string
}

func policyFromProto(p *aaav1.GetPolicyResponse) Policy {
	return Policy{Loaded: p.GetLoaded(), SHA256: p.GetSha256(), Rules: p.GetRules(), File: p.GetFile()}
}

// Grant is a standing grant: an approver's decision made in advance (see
// Client.CreateGrant), and what became of it.
type Grant struct {
	// ID is its id; the calls it grants name it as their actor (kind ActorGrant).
	ID string
	// Tool is the tool whose calls it grants.
	Tool string
	// RunID, Labels and StartedBy are its scope (empty: any run).
	RunID     string
	Labels    map[string]string
	StartedBy string
	// Condition is a CEL expression the call must make true ("": any call).
	Condition string
	// ArgumentsSHA256 is the digest of the only arguments it grants ("": any).
	ArgumentsSHA256 string
	// ExpiresAt is when it stops granting; zero if it does not expire.
	ExpiresAt time.Time
	// MaxUses is how many calls it may grant; 0: any number.
	MaxUses uint64
	// Uses is how many calls it granted so far.
	Uses uint64
	// UsesLeft is how many it may still grant; nil when unlimited.
	UsesLeft *uint64
	// Active: in force (not revoked, expired or used up).
	Active bool
	// Reason is why it exists.
	Reason string
	// CreatedBy is the approver that made it (with auth off, the caller's address).
	CreatedBy string
	// CreatedAt is when it was made.
	CreatedAt time.Time
	// CreatorGroups are, with auth on, the creator's approver groups, which
	// limit the calls it may grant to those they may decide.
	CreatorGroups []string
	// RevokedAt, RevokedBy and RevokeReason are set once it is revoked.
	RevokedAt    time.Time
	RevokedBy    string
	RevokeReason string
}

func grantFromProto(g *aaav1.Grant) Grant {
	var usesLeft *uint64
	if g.UsesLeft != nil {
		n := g.GetUsesLeft()
		usesLeft = &n
	}
	return Grant{
		ID:              g.GetId(),
		Tool:            g.GetTool(),
		RunID:           g.GetScope().GetRunId(),
		Labels:          g.GetScope().GetLabels(),
		StartedBy:       g.GetScope().GetStartedBy(),
		Condition:       g.GetCondition(),
		ArgumentsSHA256: g.GetArgumentsSha256(),
		ExpiresAt:       timeOf(g.GetExpiresAt()),
		MaxUses:         g.GetMaxUses(),
		Uses:            g.GetUses(),
		UsesLeft:        usesLeft,
		Active:          g.GetActive(),
		Reason:          g.GetReason(),
		CreatedBy:       g.GetCreatedBy(),
		CreatedAt:       timeOf(g.GetCreatedAt()),
		CreatorGroups:   g.GetCreatorGroups(),
		RevokedAt:       timeOf(g.GetRevokedAt()),
		RevokedBy:       g.GetRevokedBy(),
		RevokeReason:    g.GetRevokeReason(),
	}
}
