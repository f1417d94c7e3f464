// Package aaa is the Go SDK of aaa, a gRPC server that runs AI-agent runs as
// durable event streams and never runs a tool marked RequiresApproval until a
// human grants that exact call.
//
// A Client starts runs, follows their events, answers approvals and lists or
// watches the approval inbox. A Worker serves tools and models to the
// server's runs. Both are thin layers over the generated stubs in package
// aaav1, which stay available through Client.RunService and friends.
//
// Tool arguments, tool outputs and event data travel as JSON text, so numbers
// round-trip exactly; decode them with DecodeJSON (or Event.Decode,
// ToolTask.Decode), which keeps integers of any size exact.
package aaa

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"iter"
	"os"
	"time"

	"aaa.dev/clients/go/aaav1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// DefaultAddress is the server address used when Dial gets none and env
// AAA_SERVER is not set.
const DefaultAddress = "127.0.0.1:50051"

// DefaultRetryTimeout is how long calls keep retrying while the server is
// unavailable, unless WithRetryTimeout says otherwise.
const DefaultRetryTimeout = 30 * time.Second

// Client is a connection to an aaa server (or, made by DialCluster, to the
// servers of a cluster). It is safe for concurrent use.
//
// Calls retry while the server is unavailable (a dropped connection, a
// restarting server) for up to the retry timeout. StartRun, Signal and
// DecideApprovals get a fresh request id when the caller gives none, so a
// retried call never starts a second run or appends a second event, and
// answers as the first try did. Event and approval streams resume
// from their cursor after a dropped connection, with no gap and no duplicate.
type Client struct {
	conn          *grpc.ClientConn // nil when the caller owns the connection
	owners        *ownerRoutes     // for DialCluster of several servers: where a run's writes go
	runs          aaav1.RunServiceClient
	approvals     aaav1.ApprovalServiceClient
	workers       aaav1.WorkerServiceClient
	subscriptions aaav1.SubscriptionServiceClient
	policies      aaav1.PolicyServiceClient
	grants        aaav1.GrantServiceClient
	retryTimeout  time.Duration
}

// Option configures a Client.
type Option func(*clientOptions)

type clientOptions struct {
	retryTimeout time.Duration
	dialOptions  []grpc.DialOption
	token        string
	tls          *tls.Config
}

// WithToken makes Dial send "authorization: Bearer TOKEN" with every call.
// Without it, Dial uses env AAA_TOKEN when set.
func WithToken(token string) Option {
	return func(o *clientOptions) { o.token = token }
}

// WithTLS makes Dial connect over TLS with config: RootCAs for a server
// certificate from a private CA, Certificates for a client certificate
// (mTLS). Without it the connection is plaintext.
func WithTLS(config *tls.Config) Option {
	return func(o *clientOptions) { o.tls = config }
}

// bearer is the per-call credentials of WithToken.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: a development server on loopback
// speaks plaintext, and the server decides what it accepts.
func (bearer) RequireTransportSecurity() bool { return false }

// WithRetryTimeout sets how long calls keep retrying while the server is
// unavailable (gRPC code UNAVAILABLE); 0 disables retries.
func WithRetryTimeout(d time.Duration) Option {
	return func(o *clientOptions) { o.retryTimeout = d }
}

// WithDialOptions adds gRPC dial options (credentials, interceptors...) to
// those Dial uses: plaintext, and reconnects backing off to at most 2 s.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *clientOptions) { o.dialOptions = append(o.dialOptions, opts...) }
}

// Dial returns a client of the server at address ("host:port"). An empty
// address means env AAA_SERVER, then DefaultAddress. The connection is made
// lazily; Close releases it.
func Dial(address string, opts ...Option) (*Client, error) {
	if address == "" {
		address = os.Getenv("AAA_SERVER")
	}
	if address == "" {
		address = DefaultAddress
	}
	return dial(address, opts)
}

// clusterScheme is the resolver scheme of the targets of DialCluster.
const clusterScheme = "aaa-cluster"

// roundRobin is the service config of DialCluster: each call goes to the next
// server whose connection is ready.
const roundRobin = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// DialCluster returns a client of the servers of a cluster (several aaa
// servers sharing one PostgreSQL database), each at "host:port". Calls are
// spread over the servers whose connection is ready (gRPC's round_robin); a
// server that is down is left out and connected again in the background
// until it answers. Host names are resolved at each connection attempt.
// Over TLS each server's certificate is checked against the host of its own
// address, unless the tls.Config names a ServerName. The options are those of
// Dial. One address is the same as Dial(address); none is an error.
func DialCluster(addresses []string, opts ...Option) (*Client, error) {
	switch len(addresses) {
	case 0:
		return nil, errors.New("aaa: DialCluster needs at least one server address")
	case 1:
		return Dial(addresses[0], opts...)
	}
	endpoints := make([]resolver.Endpoint, len(addresses))
	for i, address := range addresses {
		endpoints[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: address, ServerName: address}}}
	}
	// A resolver of this client's own (WithResolvers) that gives the list once.
	static := manual.NewBuilderWithScheme(clusterScheme)
	static.InitialState(resolver.State{Endpoints: endpoints})
	cluster := []grpc.DialOption{grpc.WithResolvers(static), grpc.WithDefaultServiceConfig(roundRobin)}
	// The target names the first server: it is the :authority of the calls.
	o := newOptions(opts)
	conn, err := o.connect(clusterScheme+":///"+addresses[0], cluster)
	if err != nil {
		return nil, err
	}
	c := newClient(conn, o)
	c.conn = conn
	// A run's writes go to its owner, on a connection of that server alone
	// (resolved at each connection attempt, as in the round robin).
	c.owners = newOwnerRoutes(addresses, conn, func(address string) (*grpc.ClientConn, error) {
		return o.connect("passthrough:///"+address, nil)
	})
	return c, nil
}

// newOptions returns the options opts set, over the defaults.
func newOptions(opts []Option) clientOptions {
	o := clientOptions{retryTimeout: DefaultRetryTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// dial makes the client of Dial: a connection to target.
func dial(target string, opts []Option) (*Client, error) {
	o := newOptions(opts)
	conn, err := o.connect(target, nil)
	if err != nil {
		return nil, err
	}
	c := newClient(conn, o)
	c.conn = conn
	return c, nil
}

// connect makes a connection to target with the options the SDK sets, then
// extra, then the caller's.
func (o clientOptions) connect(target string, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	transport := insecure.NewCredentials()
	if o.tls != nil {
		transport = credentials.NewTLS(o.tls)
	}
	if o.token == "" {
		o.token = os.Getenv("AAA_TOKEN")
	}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if o.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearer(o.token)))
	}
	dialOpts = append(dialOpts, extra...)
	return grpc.NewClient(target, append(dialOpts, o.dialOptions...)...)
}

// NewClient returns a client that makes its calls on conn, which the caller
// keeps owning (Close does not close it). Only WithRetryTimeout applies.
func NewClient(conn grpc.ClientConnInterface, opts ...Option) *Client {
	return newClient(conn, newOptions(opts))
}

func newClient(conn grpc.ClientConnInterface, o clientOptions) *Client {
	return &Client{
		runs:          aaav1.NewRunServiceClient(conn),
		approvals:     aaav1.NewApprovalServiceClient(conn),
		workers:       aaav1.NewWorkerServiceClient(conn),
		subscriptions: aaav1.NewSubscriptionServiceClient(conn),
		policies:      aaav1.NewPolicyServiceClient(conn),
		grants:        aaav1.NewGrantServiceClient(conn),
		retryTimeout:  o.retryTimeout,
	}
}

// Close closes the connection made by Dial; calls in flight fail.
func (c *Client) Close() error {
	if c.owners != nil {
		c.owners.close()
	}
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// RunService returns the generated RunService stub, for what the SDK does not wrap.
func (c *Client) RunService() aaav1.RunServiceClient { return c.runs }

// runWrites returns the RunService stub for the writes of one run: on its
// owner's connection when known (see ownerRoutes), else round robin.
func (c *Client) runWrites(runID string) aaav1.RunServiceClient {
	if c.owners == nil {
		return c.runs
	}
	return aaav1.NewRunServiceClient(c.owners.of(runID))
}

// taskWrites returns the WorkerService stub for the writes of a task of
// one run (heartbeats and results), as runWrites does.
func (c *Client) taskWrites(runID string) aaav1.WorkerServiceClient {
	if c.owners == nil {
		return c.workers
	}
	return aaav1.NewWorkerServiceClient(c.owners.of(runID))
}

// ApprovalService returns the generated ApprovalService stub.
func (c *Client) ApprovalService() aaav1.ApprovalServiceClient { return c.approvals }

// WorkerService returns the generated WorkerService stub.
func (c *Client) WorkerService() aaav1.WorkerServiceClient { return c.workers }

// PolicyService returns the generated PolicyService stub.
func (c *Client) PolicyService() aaav1.PolicyServiceClient { return c.policies }

// StartRunRequest describes a run to start.
type StartRunRequest struct {
	// Task is the conversation's first user message. Required.
	Task string
	// System is optional instructions, given to models as the first message.
	System string
	// Model drives the run: WorkerModel(name), OpenAI(model, provider) or ScriptedModel(steps...). Required.
	Model Model
	// Tools are the tools the run may call; they must have been registered by a worker.
	Tools []ToolRef
	// Budget limits the run.
	Budget Budget
	// Labels are for filtering runs and approvals.
	Labels map[string]string
	// RequestID is an idempotency key: a retry with the same id returns the
	// run the first call started. Generated when empty.
	RequestID string
}

// Model says which model drives a run. Make one with WorkerModel, OpenAI or ScriptedModel.
type Model struct {
	// Worker is the name of a model served by workers.
	Worker string
	// OpenAI is the server's built-in OpenAI-compatible model, used when Worker is empty.
	OpenAI *OpenAISpec
	// Script holds the steps of the built-in scripted model, used when Worker is empty and OpenAI nil.
	Script []Step
}

// OpenAISpec is the server's built-in OpenAI-compatible model (see docs/models.md).
// The server calls the provider itself; API keys never leave it.
type OpenAISpec struct {
	// Model is what the provider serves, e.g. "gpt-4.1-mini"; "" for the provider's default_model.
	Model string
	// Provider names a provider of the server's --models file; "" for its default.
	Provider string
	// Temperature is the sampling temperature (0 to 2); nil for the provider's default.
	Temperature *float64
	// MaxTokens caps one reply's tokens; 0 sends no cap.
	MaxTokens uint32
}

// OpenAI is the server's built-in OpenAI-compatible model: model as the
// provider names it, provider one of the server's --models file ("" for
// either: the defaults).
func OpenAI(model, provider string) Model {
	return Model{OpenAI: &OpenAISpec{Model: model, Provider: provider}}
}

// WorkerModel is the model of that name served by workers.
func WorkerModel(name string) Model { return Model{Worker: name} }

// ScriptedModel is the server's built-in scripted model: the n-th model call
// returns the n-th step, so tests and demos need no LLM.
func ScriptedModel(steps ...Step) Model { return Model{Script: steps} }

// Step is one reply of the scripted model: Echo, else ToolCalls if any, else Text.
type Step struct {
	// Text is a literal reply; a reply without tool calls completes the run with {"text": Text}.
	Text string
	// ToolCalls are tool calls to make.
	ToolCalls []ToolCallRequest
	// Echo replies with the content of the conversation's last message.
	Echo bool
}

// TextStep is a scripted reply with this text.
func TextStep(text string) Step { return Step{Text: text} }

// EchoStep is a scripted reply that repeats the conversation's last message.
func EchoStep() Step { return Step{Echo: true} }

// CallStep is a scripted reply making these tool calls.
func CallStep(calls ...ToolCallRequest) Step { return Step{ToolCalls: calls} }

// ToolCallRequest is a tool call a model asks for (in a Reply or a scripted Step).
type ToolCallRequest struct {
	// Name is the tool's name.
	Name string
	// Arguments is the arguments object, encoded with EncodeJSON: a map, a
	// struct, or json.RawMessage text used as it is.
	Arguments any
}

// ToolRef names a tool a run may call.
type ToolRef struct {
	// Name is the name a worker registered the tool under.
	Name string
	// RequiresApproval gates the tool's calls in this run even if its worker does not.
	RequiresApproval bool
	// ApprovalTimeout, when positive, is the tool's approval timeout in this run:
	// shorter than the tool's, or one where it has none (longer is refused,
	// INVALID_FIELD: a run may tighten a gate, never loosen it).
	ApprovalTimeout time.Duration
	// ApprovalsRequired, when above the tool's, raises the grants its calls
	// need in this run (a run can ask for more approvers, never fewer).
	ApprovalsRequired uint32
}

// Budget limits a run.
type Budget struct {
	// Deadline fails the run with DeadlineExceeded this long after it starts; 0 means none.
	Deadline time.Duration
	// MaxModelCalls fails the run with BudgetExceeded past this many model calls; 0 means 50.
	MaxModelCalls uint32
	// MaxTokens fails the run with BudgetExceeded once its built-in model calls used this many tokens; 0 means no limit.
	MaxTokens uint64
}

// StartedRun is StartRun's answer.
type StartedRun struct {
	// RunID is the run's id.
	RunID string
	// Created is false when RequestID matched an earlier StartRun.
	Created bool
}

// StartRun starts a run.
func (c *Client) StartRun(ctx context.Context, req StartRunRequest) (StartedRun, error) {
	pb := &aaav1.StartRunRequest{
		Task:      req.Task,
		System:    req.System,
		Labels:    req.Labels,
		RequestId: req.RequestID,
	}
	if pb.RequestId == "" {
		pb.RequestId = newID()
	}
	model, err := req.Model.toProto()
	if err != nil {
		return StartedRun{}, err
	}
	pb.Model = model
	for _, t := range req.Tools {
		pb.Tools = append(pb.Tools, &aaav1.ToolRef{
			Name:              t.Name,
			RequiresApproval:  t.RequiresApproval,
			ApprovalTimeoutS:  t.ApprovalTimeout.Seconds(),
			ApprovalsRequired: t.ApprovalsRequired,
		})
	}
	if req.Budget != (Budget{}) {
		pb.Budget = &aaav1.Budget{
			DeadlineS:     req.Budget.Deadline.Seconds(),
			MaxModelCalls: req.Budget.MaxModelCalls,
			MaxTokens:     req.Budget.MaxTokens,
		}
	}
	// With OpenTelemetry set up and a span in ctx, the run's spans join its trace.
	ctx = withTraceparent(ctx)
	var resp *aaav1.StartRunResponse
	err = c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.runs.StartRun(ctx, pb)
		return err
	})
	if err != nil {
		return StartedRun{}, err
	}
	return StartedRun{RunID: resp.GetRunId(), Created: resp.GetCreated()}, nil
}

func (m Model) toProto() (*aaav1.ModelSpec, error) {
	if m.Worker != "" {
		return &aaav1.ModelSpec{Kind: &aaav1.ModelSpec_Worker{Worker: m.Worker}}, nil
	}
	if o := m.OpenAI; o != nil {
		spec := &aaav1.OpenAiModel{Model: o.Model, Provider: o.Provider, Temperature: o.Temperature, MaxTokens: o.MaxTokens}
		return &aaav1.ModelSpec{Kind: &aaav1.ModelSpec_Openai{Openai: spec}}, nil
	}
	if m.Script == nil {
		return nil, nil // the server answers INVALID_FIELD
	}
	scripted := &aaav1.ScriptedModel{}
	for _, s := range m.Script {
		step := &aaav1.ScriptedStep{}
		switch {
		case s.Echo:
			step.Reply = &aaav1.ScriptedStep_Echo{Echo: &emptypb.Empty{}}
		case len(s.ToolCalls) > 0:
			calls := &aaav1.ScriptedToolCalls{}
			for _, call := range s.ToolCalls {
				args, err := encodeObject(call.Arguments)
				if err != nil {
					return nil, err
				}
				calls.Calls = append(calls.Calls, &aaav1.ScriptedToolCall{Name: call.Name, ArgumentsJson: args})
			}
			step.Reply = &aaav1.ScriptedStep_ToolCalls{ToolCalls: calls}
		default:
			step.Reply = &aaav1.ScriptedStep_Text{Text: s.Text}
		}
		scripted.Steps = append(scripted.Steps, step)
	}
	return &aaav1.ModelSpec{Kind: &aaav1.ModelSpec_Scripted{Scripted: scripted}}, nil
}

// GetRun returns a run's summary, with its pending approvals.
func (c *Client) GetRun(ctx context.Context, runID string) (*Run, error) {
	var resp *aaav1.GetRunResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.runs.GetRun(ctx, &aaav1.GetRunRequest{RunId: runID})
		return err
	})
	if err != nil {
		return nil, err
	}
	run := runFromProto(resp.GetRun())
	return &run, nil
}

// RunFilter selects runs for ListRuns.
type RunFilter struct {
	// Status keeps runs in this status; zero for any.
	Status RunStatus
	// Labels keeps runs carrying all of these labels.
	Labels map[string]string
	// PageSize is how many runs each call fetches; 0 means the server's default (50).
	PageSize uint32
}

// ListRuns iterates over the runs that match the filter, newest first,
// fetching pages as the loop goes. It stops after yielding an error.
func (c *Client) ListRuns(ctx context.Context, filter RunFilter) iter.Seq2[Run, error] {
	return func(yield func(Run, error) bool) {
		req := &aaav1.ListRunsRequest{Status: filter.Status, Labels: filter.Labels, PageSize: filter.PageSize}
		for {
			var resp *aaav1.ListRunsResponse
			err := c.retry(ctx, func(ctx context.Context) (err error) {
				resp, err = c.runs.ListRuns(ctx, req)
				return err
			})
			if err != nil {
				yield(Run{}, err)
				return
			}
			for _, r := range resp.GetRuns() {
				if !yield(runFromProto(r), nil) {
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

// EventsOptions says which events Events yields.
type EventsOptions struct {
	// AfterSeq is an exclusive cursor: only events with a greater seq. Pass the
	// seq of the last event handled to resume.
	AfterSeq uint64
	// Follow keeps yielding live events after the stored history.
	Follow bool
	// TypePrefix keeps only events whose type starts with it.
	TypePrefix string
	// StopAtEnd ends the iteration after the run's terminal event.
	StopAtEnd bool
}

// Events iterates over a run's events with seq greater than opts.AfterSeq:
// the stored history, then (with Follow) live events as they become durable.
// A dropped connection is resumed from the last event yielded, so no event is
// skipped or repeated. Breaking out of the loop ends the stream. It stops
// after yielding an error.
func (c *Client) Events(ctx context.Context, runID string, opts EventsOptions) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cursor := opts.AfterSeq
		wait := c.newBackoff()
		for {
			stream, err := c.runs.StreamEvents(ctx, &aaav1.StreamEventsRequest{
				RunId:      runID,
				AfterSeq:   cursor,
				Follow:     opts.Follow,
				TypePrefix: opts.TypePrefix,
				StopAtEnd:  opts.StopAtEnd,
			})
			for err == nil {
				var item *aaav1.StreamEventsResponse
				if item, err = stream.Recv(); err != nil {
					break
				}
				wait.reset()
				if up := item.GetCaughtUp(); up != nil {
					cursor = max(cursor, up.GetLastSeq())
					continue
				}
				pb := item.GetEvent()
				if pb == nil || pb.GetSeq() <= cursor {
					continue // sent before a reconnect
				}
				cursor = pb.GetSeq()
				event := eventFromProto(pb)
				if !yield(event, nil) || (opts.StopAtEnd && event.Terminal()) {
					return
				}
			}
			if errors.Is(err, io.EOF) {
				return
			}
			if transient(err) && wait.sleep(ctx) {
				continue
			}
			yield(Event{}, giveUp(ctx, err))
			return
		}
	}
}

// Result waits for the run to end and returns how it ended. A failed or
// cancelled run is an Outcome, not an error.
func (c *Client) Result(ctx context.Context, runID string) (*Outcome, error) {
	for event, err := range c.Events(ctx, runID, EventsOptions{Follow: true, StopAtEnd: true, TypePrefix: "aaa.run."}) {
		if err != nil {
			return nil, err
		}
		if !event.Terminal() {
			continue
		}
		outcome := &Outcome{RunID: runID, Event: event}
		var data struct {
			Value  json.RawMessage `json:"value"`
			Error  *ErrorDetail    `json:"error"`
			Reason string          `json:"reason"`
		}
		if err := event.Decode(&data); err != nil {
			return nil, err
		}
		switch event.Type {
		case EventRunCompleted:
			outcome.Status = StatusCompleted
			outcome.Value = data.Value
			var value struct {
				Text string `json:"text"`
			}
			if len(data.Value) > 0 {
				_ = DecodeJSON(data.Value, &value) // a value without text has Text ""
			}
			outcome.Text = value.Text
		case EventRunFailed:
			outcome.Status = StatusFailed
			outcome.Error = data.Error
		default:
			outcome.Status = StatusCancelled
			outcome.Reason = data.Reason
		}
		return outcome, nil
	}
	return nil, ErrNoOutcome
}

// Cancel cancels a run: pending approvals expire, workers are told through
// their heartbeats, and the run ends with aaa.run.cancelled. It returns the
// seq of that event, 0 when the run was already cancelled.
func (c *Client) Cancel(ctx context.Context, runID, reason string) (uint64, error) {
	var resp *aaav1.CancelRunResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.runWrites(runID).CancelRun(ctx, &aaav1.CancelRunRequest{RunId: runID, Reason: reason})
		return err
	})
	if err != nil {
		return 0, err
	}
	return resp.GetSeq(), nil
}

// retry calls call until it succeeds, fails for good, or the server stays
// unavailable for longer than the retry timeout; errors come back as *Error.
func (c *Client) retry(ctx context.Context, call func(context.Context) error) error {
	wait := c.newBackoff()
	for {
		err := call(ctx)
		if err == nil {
			return nil
		}
		if !transient(err) || !wait.sleep(ctx) {
			return giveUp(ctx, err)
		}
	}
}

// giveUp returns the error to report after err: ctx's own error (as an
// *Error) when ctx ended while waiting to retry, else err as an *Error.
func giveUp(ctx context.Context, err error) error {
	if ctx.Err() != nil && transient(err) {
		return FromGRPC(status.FromContextError(ctx.Err()).Err())
	}
	return FromGRPC(err)
}

// transient reports whether err is worth retrying: the server was unreachable
// or is going away (a restart).
func transient(err error) bool {
	return status.Code(err) == codes.Unavailable
}

// retryBackoff is an exponential backoff (50 ms doubling up to maxDelay)
// within a time budget.
type retryBackoff struct {
	budget   time.Duration
	maxDelay time.Duration
	delay    time.Duration
	deadline time.Time
}

// forever is a budget that does not run out.
const forever = 100 * 365 * 24 * time.Hour

func (c *Client) newBackoff() *retryBackoff { return newBackoff(c.retryTimeout, time.Second) }

func newBackoff(budget, maxDelay time.Duration) *retryBackoff {
	b := &retryBackoff{budget: budget, maxDelay: maxDelay}
	b.reset()
	return b
}

// reset starts over: the full budget and a short delay.
func (b *retryBackoff) reset() {
	b.delay = 50 * time.Millisecond
	b.deadline = time.Now().Add(b.budget)
}

// sleep waits before the next try; false when the budget is spent or ctx ends.
func (b *retryBackoff) sleep(ctx context.Context) bool {
	if time.Now().Add(b.delay).After(b.deadline) {
		return false
	}
	t := time.NewTimer(b.delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	b.delay = min(2*b.delay, b.maxDelay)
	return true
}

// newID returns a random id for request_id fields.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
