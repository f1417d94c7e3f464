package aaa

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"aaa.dev/clients/go/aaav1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tool is a tool a Worker serves: its declaration and its handler.
type Tool struct {
	// Name is the tool's name: letters, digits, '_', '-' and '.'.
	Name string
	// Description says what the tool does; models see it.
	Description string
	// Parameters is the JSON schema of the arguments object; nil means {}.
	Parameters json.RawMessage
	// RequiresApproval makes every call wait for a human's grant of that call.
	RequiresApproval bool
	// ApprovalsRequired is how many grants from distinct approvers a gated
	// call needs before it runs (any one denial denies); 0 means 1, at most 16.
	ApprovalsRequired uint32
	// Approvers are the approver groups (groups of the server's auth config)
	// whose members may decide its calls; others get ErrNotAnApproverForCall.
	// Empty: any approver (a policy rule may still name groups). Not enforced
	// when the server runs without auth.
	Approvers []string
	// Retry says how failed or lost attempts are retried; nil means the
	// server's default (gated tools: no retry; others: 3 attempts).
	Retry *RetryPolicy
	// HeartbeatTimeout is how long a started attempt may go without a
	// heartbeat before it is lost; 0 means the server's default (30 s). The
	// worker sends heartbeats at a third of it.
	HeartbeatTimeout time.Duration
	// ApprovalTimeout, when positive, denies an unanswered approval request
	// after this long (reason "timeout").
	ApprovalTimeout time.Duration
	// Handler runs one attempt of a call. Nil in the Tools of a ModelRequest.
	Handler ToolFunc
}

// RetryPolicy says how a tool's failed or lost attempts are retried.
type RetryPolicy struct {
	// MaxAttempts counts all attempts, the first included; 1 means no retry, 0 the default.
	MaxAttempts uint32
	// InitialBackoff is the delay before the second attempt; 0 means 1 s.
	InitialBackoff time.Duration
	// BackoffCoefficient multiplies the delay after each attempt; 0 means 2.
	BackoffCoefficient float64
	// MaxBackoff bounds the delay; 0 means 60 s.
	MaxBackoff time.Duration
}

// ToolFunc runs one attempt of a tool call and returns the tool's output,
// which is encoded with EncodeJSON (return json.RawMessage to send JSON text
// as it is). ctx is cancelled when the run no longer wants the attempt
// (cause ErrAttemptCancelled) or when the worker stops and its grace period
// is over (cause ErrWorkerStopped). Return a *TaskError to choose the error
// type or to skip retries; any other error is reported with type "Error".
type ToolFunc func(ctx context.Context, task *ToolTask) (any, error)

// ModelFunc answers one model call with a reply: text, or tool calls.
// Errors are reported as for ToolFunc.
type ModelFunc func(ctx context.Context, req *ModelRequest) (Reply, error)

// Typed adapts a function of decoded arguments into a ToolFunc: the call's
// arguments are decoded into A with DecodeJSON (use int64, uint64,
// json.Number or *big.Int fields for exact integers); arguments that do not
// decode fail the call without retry (type "InvalidArguments").
// TaskFromContext gives the handler its run, call and attempt.
func Typed[A, R any](fn func(ctx context.Context, args A) (R, error)) ToolFunc {
	return func(ctx context.Context, task *ToolTask) (any, error) {
		var args A
		if err := task.Decode(&args); err != nil {
			return nil, &TaskError{Type: "InvalidArguments", Message: err.Error(), NonRetryable: true}
		}
		return fn(ctx, args)
	}
}

// TaskInfo names the attempt a handler is running.
type TaskInfo struct {
	// RunID is the run the call belongs to.
	RunID string
	// CallID is the call: pass it to the outside world as an idempotency key.
	CallID string
	// Attempt is the attempt number, from 1.
	Attempt uint32
	// HeartbeatTimeout is the attempt's lease; the worker heartbeats it.
	HeartbeatTimeout time.Duration
	// Deadline is when the run's deadline passes; zero if it has none.
	Deadline time.Time
	// Traceparent is the W3C trace context of the server's span of this
	// attempt ("" from an older server).
	Traceparent string
}

// ToolTask is one attempt at a tool call.
type ToolTask struct {
	TaskInfo
	// Name is the tool's name.
	Name string
	// Arguments is the arguments object as JSON text, exactly as requested (and approved).
	Arguments json.RawMessage
}

// Decode decodes the arguments into v with DecodeJSON (numbers stay exact).
func (t *ToolTask) Decode(v any) error {
	if len(t.Arguments) == 0 {
		return DecodeJSON([]byte("{}"), v)
	}
	return DecodeJSON(t.Arguments, v)
}

// ModelRequest is one model call: the conversation so far and the tools the model may call.
type ModelRequest struct {
	TaskInfo
	// Model is the model's name.
	Model string
	// Messages is the conversation so far.
	Messages []Message
	// Tools are the tools the model may call (Handler is nil).
	Tools []Tool
}

// Message is one message of a run's conversation.
type Message struct {
	// Role says who spoke.
	Role Role
	// Content is the text; for a tool message the tool's output (a JSON
	// string unquoted, anything else as JSON text), or "Type: message" on failure.
	Content string
	// ToolCalls are, for an assistant message, the calls the model asked for.
	ToolCalls []ToolCall
	// CallID is, for a tool message, the call it answers.
	CallID string
	// Name is, for a tool message, the tool's name.
	Name string
	// Error is, for a tool message, set when the call failed (ApprovalDenied included).
	Error *ErrorDetail
}

// ToolCall is a tool call a model made, as recorded in the conversation.
type ToolCall struct {
	// CallID is the call's id, minted by the engine.
	CallID string
	// Name is the tool's name.
	Name string
	// Arguments is the arguments object as JSON text.
	Arguments json.RawMessage
}

// Reply is a model's answer: Content alone ends the run with {"text": Content};
// with ToolCalls the tools run and the model is called again.
type Reply struct {
	// Content is the reply's text.
	Content string
	// ToolCalls are the tool calls to make.
	ToolCalls []ToolCallRequest
}

// TaskError is a handler error that says how the failure is reported.
type TaskError struct {
	// Type is a short machine-readable type, e.g. "Timeout".
	Type string
	// Message is for humans (and models).
	Message string
	// NonRetryable fails the call at once, whatever the retry policy says.
	NonRetryable bool
}

// Error formats the error as "Type: message".
func (e *TaskError) Error() string { return e.Type + ": " + e.Message }

// Errors a handler's context is cancelled with (see context.Cause).
var (
	// ErrAttemptCancelled: the run no longer wants the attempt (cancelled,
	// deadline passed, attempt superseded). Nothing is reported.
	ErrAttemptCancelled = errors.New("aaa: the server no longer wants this attempt")
	// ErrWorkerStopped: the worker stopped and the grace period is over. The
	// attempt is reported failed with type "WorkerStopped" unless the handler
	// still returns a result.
	ErrWorkerStopped = errors.New("aaa: the worker stopped")
)

type taskInfoKey struct{}

// TaskFromContext returns the attempt a handler runs, from the context the
// worker gave it.
func TaskFromContext(ctx context.Context) (TaskInfo, bool) {
	info, ok := ctx.Value(taskInfoKey{}).(TaskInfo)
	return info, ok
}

// WorkerOptions configures a Worker.
type WorkerOptions struct {
	// Identity names the worker in the events it causes; default "go-HOST-PID".
	// With auth on it belongs to the principal that first uses it: another
	// principal gets ErrIdentityTaken.
	Identity string
	// Tools are the tools to serve.
	Tools []Tool
	// Models maps model names to their handlers.
	Models map[string]ModelFunc
	// Concurrency is how many tasks may run at once; 0 means 10.
	Concurrency int
	// PollWait is the longest wait of one PollTask; 0 means the server's cap.
	PollWait time.Duration
	// StopTimeout is how long running tasks may finish once Run's context is
	// done, before their contexts are cancelled; 0 means 30 s.
	StopTimeout time.Duration
	// Logger receives the worker's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Worker serves tools and models to the runs of a server: it registers them,
// then polls for tasks, each one exclusive attempt, and runs up to
// Concurrency of them at once with heartbeats.
type Worker struct {
	client *Client
	opts   WorkerOptions
	tools  map[string]Tool
	log    *slog.Logger
}

// NewWorker returns a worker using client's connection. Start it with Run.
func NewWorker(client *Client, opts WorkerOptions) *Worker {
	if opts.Identity == "" {
		host, _ := os.Hostname()
		opts.Identity = fmt.Sprintf("go-%s-%d", host, os.Getpid())
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 10
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 30 * time.Second
	}
	w := &Worker{client: client, opts: opts, tools: map[string]Tool{}, log: opts.Logger}
	if w.log == nil {
		w.log = slog.Default()
	}
	for _, t := range opts.Tools {
		w.tools[t.Name] = t
	}
	return w
}

// Identity returns the worker's name.
func (w *Worker) Identity() string { return w.opts.Identity }

// Register declares the worker's tools and models to the server. Run does it
// too; call it first when runs naming the tools must start before Run has
// begun. It returns the tools as stored. A declaration looser than a tool's
// stored gate is refused (INVALID_FIELD naming the field) unless the worker
// authenticates as an admin: see docs/auth.md.
func (w *Worker) Register(ctx context.Context) ([]Tool, error) {
	req := &aaav1.RegisterWorkerRequest{Identity: w.opts.Identity}
	for _, t := range w.opts.Tools {
		req.Tools = append(req.Tools, t.toProto())
	}
	for name := range w.opts.Models {
		req.Models = append(req.Models, name)
	}
	var resp *aaav1.RegisterWorkerResponse
	err := w.client.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = w.client.workers.RegisterWorker(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	var tools []Tool
	for _, t := range resp.GetTools() {
		tools = append(tools, toolFromProto(t))
	}
	return tools, nil
}

// Run registers the worker, then serves tasks until ctx is done. Then it
// stops polling, lets running tasks finish for up to StopTimeout, cancels
// those still running (reporting them failed with type "WorkerStopped"),
// and returns nil. It returns an error only when registration fails; ctx
// ending during registration is a stop like any other (nil).
func (w *Worker) Run(ctx context.Context) error {
	if _, err := w.Register(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	req := &aaav1.PollTaskRequest{Identity: w.opts.Identity, WaitS: w.opts.PollWait.Seconds()}
	for name := range w.tools {
		req.Tools = append(req.Tools, name)
	}
	for name := range w.opts.Models {
		req.Models = append(req.Models, name)
	}
	// Tasks outlive ctx by the grace period: they get a context of their own.
	tasksCtx, stopTasks := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopTasks(nil)
	var running sync.WaitGroup
	slots := make(chan struct{}, w.opts.Concurrency)
	wait := newBackoff(forever, time.Second) // a worker keeps trying
poll:
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break poll
		}
		resp, err := w.client.workers.PollTask(ctx, req)
		if err == nil {
			wait.reset()
		}
		if err != nil || resp.GetTask() == nil {
			<-slots
			if ctx.Err() != nil {
				break poll
			}
			if err != nil {
				w.log.Warn("aaa worker: PollTask failed", "worker", w.opts.Identity, "err", FromGRPC(err))
				if !wait.sleep(ctx) {
					break poll
				}
			}
			continue
		}
		running.Add(1)
		go func(task *aaav1.Task) {
			defer func() { <-slots; running.Done() }()
			w.handle(tasksCtx, task)
		}(resp.GetTask())
	}
	done := make(chan struct{})
	go func() { running.Wait(); close(done) }()
	grace := time.NewTimer(w.opts.StopTimeout)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		stopTasks(ErrWorkerStopped)
		<-done
	}
	return nil
}

// handle runs one attempt with heartbeats, then reports it.
func (w *Worker) handle(parent context.Context, task *aaav1.Task) {
	info := TaskInfo{
		RunID:            task.GetRunId(),
		CallID:           task.GetCallId(),
		Attempt:          task.GetAttempt(),
		HeartbeatTimeout: seconds(task.GetHeartbeatTimeoutS()),
		Deadline:         timeOf(task.GetDeadlineAt()),
		Traceparent:      task.GetTraceparent(),
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(parent, taskInfoKey{}, info))
	defer cancel(nil)
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		w.heartbeat(ctx, info.RunID, task.GetToken(), info.HeartbeatTimeout, cancel)
	}()
	complete, fail := w.execute(ctx, info, task)
	cause := context.Cause(ctx)
	cancel(nil)
	<-beating
	if errors.Is(cause, ErrAttemptCancelled) {
		w.log.Info("aaa worker: attempt abandoned", "run", info.RunID, "call", info.CallID, "attempt", info.Attempt)
		return
	}
	if fail != nil && errors.Is(cause, ErrWorkerStopped) {
		fail.Error = &aaav1.ErrorDetail{Type: "WorkerStopped", Message: "worker " + w.opts.Identity + " stopped"}
	}
	// Report even when the worker is stopping: the result is done work.
	recorded, err := w.report(context.WithoutCancel(parent), info.RunID, complete, fail)
	switch {
	case err != nil:
		// A superseded attempt or a finished run: nothing more to do.
		w.log.Info("aaa worker: result refused", "run", info.RunID, "call", info.CallID, "attempt", info.Attempt, "err", err)
	case recorded:
		w.log.Debug("aaa worker: result recorded already (an earlier reply was lost)", "run", info.RunID, "call", info.CallID, "attempt", info.Attempt)
	}
}

const (
	// reportTimeout bounds the sending of one result, tries and waits between them.
	reportTimeout = 30 * time.Second
	// reportTryTimeout bounds one try of CompleteTask or FailTask.
	reportTryTimeout = 10 * time.Second
)

// report sends CompleteTask (complete) or FailTask (fail) of a task of run
// runID. While the reply is lost (UNAVAILABLE, DEADLINE_EXCEEDED) it sends
// the same token and result again, with backoff, for up to reportTimeout: the
// server records a result once and answers a repeat with already_recorded,
// which report returns.
func (w *Worker) report(ctx context.Context, runID string, complete *aaav1.CompleteTaskRequest, fail *aaav1.FailTaskRequest) (alreadyRecorded bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	wait := newBackoff(forever, time.Second) // ctx bounds it
	for {
		try, cancelTry := context.WithTimeout(ctx, reportTryTimeout)
		if complete != nil {
			var resp *aaav1.CompleteTaskResponse
			resp, err = w.client.taskWrites(runID).CompleteTask(try, complete)
			alreadyRecorded = resp.GetAlreadyRecorded()
		} else {
			var resp *aaav1.FailTaskResponse
			resp, err = w.client.taskWrites(runID).FailTask(try, fail)
			alreadyRecorded = resp.GetAlreadyRecorded()
		}
		cancelTry()
		if err == nil {
			return alreadyRecorded, nil
		}
		code := status.Code(err)
		lost := code == codes.Unavailable || code == codes.DeadlineExceeded
		if !lost || !wait.sleep(ctx) {
			return false, FromGRPC(err)
		}
	}
}

// heartbeat keeps the attempt's lease alive until ctx ends; when the server
// no longer wants the attempt, it cancels ctx with ErrAttemptCancelled.
func (w *Worker) heartbeat(ctx context.Context, runID, token string, timeout time.Duration, cancel context.CancelCauseFunc) {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	interval := timeout / 3
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		hctx, hcancel := context.WithTimeout(ctx, interval)
		resp, err := w.client.taskWrites(runID).HeartbeatTask(hctx, &aaav1.HeartbeatTaskRequest{Token: token})
		hcancel()
		switch status.Code(err) {
		case codes.OK:
			if resp.GetCancelRequested() {
				cancel(ErrAttemptCancelled)
				return
			}
		case codes.FailedPrecondition, codes.NotFound, codes.InvalidArgument:
			cancel(ErrAttemptCancelled)
			return
		default: // transient: the next heartbeat may get through
		}
	}
}

// execute runs the handler and returns the report to send: one of complete and fail.
func (w *Worker) execute(ctx context.Context, info TaskInfo, task *aaav1.Task) (complete *aaav1.CompleteTaskRequest, fail *aaav1.FailTaskRequest) {
	token := task.GetToken()
	// With OpenTelemetry set up, the handler runs in a span under the server's
	// span of this attempt, so the handler's own spans join the run's trace.
	ctx, span := startTaskSpan(ctx, task)
	defer span.End() // after the recover below has marked a panic
	failWith := func(err error) {
		te := &TaskError{Type: "Error", Message: err.Error()}
		errors.As(err, &te)
		fail = &aaav1.FailTaskRequest{
			Token:        token,
			Error:        &aaav1.ErrorDetail{Type: te.Type, Message: te.Message},
			NonRetryable: te.NonRetryable,
		}
		failSpan(span, err, te.Type)
	}
	defer func() {
		if r := recover(); r != nil {
			complete = nil
			failWith(&TaskError{Type: "Panic", Message: fmt.Sprint(r)})
		}
	}()
	switch kind := task.GetKind().(type) {
	case *aaav1.Task_Tool:
		tool, ok := w.tools[kind.Tool.GetName()]
		if !ok || tool.Handler == nil {
			failWith(&TaskError{Type: "ToolNotServed", Message: "worker " + w.opts.Identity + " does not serve tool " + kind.Tool.GetName(), NonRetryable: true})
			return
		}
		output, err := tool.Handler(ctx, &ToolTask{TaskInfo: info, Name: kind.Tool.GetName(), Arguments: json.RawMessage(kind.Tool.GetArgumentsJson())})
		if err != nil {
			failWith(err)
			return
		}
		out, err := EncodeJSON(output)
		if err != nil {
			failWith(&TaskError{Type: "InvalidOutput", Message: err.Error(), NonRetryable: true})
			return
		}
		return &aaav1.CompleteTaskRequest{Token: token, Result: &aaav1.CompleteTaskRequest_OutputJson{OutputJson: string(out)}}, nil
	case *aaav1.Task_Model:
		handler, ok := w.opts.Models[kind.Model.GetModel()]
		if !ok || handler == nil {
			failWith(&TaskError{Type: "ModelNotServed", Message: "worker " + w.opts.Identity + " does not serve model " + kind.Model.GetModel(), NonRetryable: true})
			return
		}
		reply, err := handler(ctx, modelRequestFromProto(info, kind.Model))
		if err != nil {
			failWith(err)
			return
		}
		pb := &aaav1.ModelReply{Content: reply.Content}
		for _, call := range reply.ToolCalls {
			args, err := encodeObject(call.Arguments)
			if err != nil {
				failWith(&TaskError{Type: "InvalidReply", Message: err.Error(), NonRetryable: true})
				return
			}
			pb.ToolCalls = append(pb.ToolCalls, &aaav1.ModelToolCall{Name: call.Name, ArgumentsJson: args})
		}
		return &aaav1.CompleteTaskRequest{Token: token, Result: &aaav1.CompleteTaskRequest_Reply{Reply: pb}}, nil
	default:
		failWith(&TaskError{Type: "UnknownTask", Message: "a task of a kind this SDK does not know", NonRetryable: true})
		return
	}
}

func (t Tool) toProto() *aaav1.ToolDefinition {
	pb := &aaav1.ToolDefinition{
		Name:              t.Name,
		Description:       t.Description,
		ParametersJson:    string(t.Parameters),
		RequiresApproval:  t.RequiresApproval,
		ApprovalsRequired: t.ApprovalsRequired,
		Approvers:         t.Approvers,
		HeartbeatTimeoutS: t.HeartbeatTimeout.Seconds(),
		ApprovalTimeoutS:  t.ApprovalTimeout.Seconds(),
	}
	if r := t.Retry; r != nil {
		pb.Retry = &aaav1.RetryPolicy{
			MaxAttempts:        r.MaxAttempts,
			InitialBackoffS:    r.InitialBackoff.Seconds(),
			BackoffCoefficient: r.BackoffCoefficient,
			MaxBackoffS:        r.MaxBackoff.Seconds(),
		}
	}
	return pb
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func toolFromProto(t *aaav1.ToolDefinition) Tool {
	tool := Tool{
		Name:              t.GetName(),
		Description:       t.GetDescription(),
		RequiresApproval:  t.GetRequiresApproval(),
		ApprovalsRequired: t.GetApprovalsRequired(),
		Approvers:         t.GetApprovers(),
		HeartbeatTimeout:  seconds(t.GetHeartbeatTimeoutS()),
		ApprovalTimeout:   seconds(t.GetApprovalTimeoutS()),
	}
	if p := t.GetParametersJson(); p != "" {
		tool.Parameters = json.RawMessage(p)
	}
	if r := t.GetRetry(); r != nil {
		tool.Retry = &RetryPolicy{
			MaxAttempts:        r.GetMaxAttempts(),
			InitialBackoff:     seconds(r.GetInitialBackoffS()),
			BackoffCoefficient: r.GetBackoffCoefficient(),
			MaxBackoff:         seconds(r.GetMaxBackoffS()),
		}
	}
	return tool
}

func modelRequestFromProto(info TaskInfo, m *aaav1.ModelTask) *ModelRequest {
	req := &ModelRequest{TaskInfo: info, Model: m.GetModel()}
	for _, msg := range m.GetMessages() {
		message := Message{
			Role:    msg.GetRole(),
			Content: msg.GetContent(),
			CallID:  msg.GetCallId(),
			Name:    msg.GetName(),
			Error:   errorFromProto(msg.GetError()),
		}
		for _, call := range msg.GetToolCalls() {
			message.ToolCalls = append(message.ToolCalls, ToolCall{CallID: call.GetCallId(), Name: call.GetName(), Arguments: json.RawMessage(call.GetArgumentsJson())})
		}
		req.Messages = append(req.Messages, message)
	}
	for _, t := range m.GetTools() {
		req.Tools = append(req.Tools, toolFromProto(t))
	}
	return req
}
