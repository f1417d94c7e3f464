package aaa_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/aaav1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// doomedWorkerEnv, set to a tool name, makes the test binary a worker process
// whose attempts of that tool never finish, until it is killed.
const doomedWorkerEnv = "AAA_TEST_DOOMED_WORKER"

// flakyTool is the tool of the failover test: a 1 s lease, one retry.
func flakyTool(name string, handler aaa.ToolFunc) aaa.Tool {
	return aaa.Tool{
		Name:             name,
		Retry:            &aaa.RetryPolicy{MaxAttempts: 2, InitialBackoff: 100 * time.Millisecond},
		HeartbeatTimeout: time.Second,
		Handler:          handler,
	}
}

// runDoomedWorker serves the tool named by doomedWorkerEnv; it prints
// "ready" once registered and "started ATTEMPT" when an attempt starts.
func runDoomedWorker() {
	client, err := aaa.Dial("")
	if err != nil {
		panic(err)
	}
	tool := flakyTool(os.Getenv(doomedWorkerEnv), func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		fmt.Printf("started %d\n", task.Attempt)
		select {} // hangs until killed, heartbeating all along
	})
	worker := aaa.NewWorker(client, aaa.WorkerOptions{Identity: "doomed", Tools: []aaa.Tool{tool}})
	if _, err := worker.Register(context.Background()); err != nil {
		panic(err)
	}
	fmt.Println("ready")
	_ = worker.Run(context.Background())
}

func TestWorkerFailover(t *testing.T) {
	e := setup(t)
	const name = "flaky"
	doomed := exec.Command(os.Args[0], "-test.run=^$")
	doomed.Env = append(e.server.Env(), doomedWorkerEnv+"="+name)
	stdout, err := doomed.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := doomed.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = doomed.Process.Kill(); _ = doomed.Wait() }()
	lines := make(chan string)
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case line := <-lines:
			if line != want {
				t.Fatalf("doomed worker said %q, want %q", line, want)
			}
		case <-e.ctx.Done():
			t.Fatalf("doomed worker did not say %q", want)
		}
	}
	expect("ready")
	runID := e.start(t, aaa.StartRunRequest{
		Task:  "double 21",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: name, Arguments: map[string]int{"x": 21}}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: name}},
	})
	expect("started 1")
	if err := doomed.Process.Kill(); err != nil { // mid-attempt: no result, no more heartbeats
		t.Fatal(err)
	}

	double := aaa.Typed(func(ctx context.Context, args struct{ X int64 }) (int64, error) { return 2 * args.X, nil })
	e.serve(t, aaa.WorkerOptions{Identity: "rescuer", Tools: []aaa.Tool{flakyTool(name, double)}})
	if out := e.result(t, runID); out.Text != "42" {
		t.Fatalf("outcome: %+v", out)
	}
	var starts []string
	events := e.events(t, runID)
	for _, ev := range ofType(events, aaa.EventToolStarted) {
		d := decode(t, ev)
		starts = append(starts, fmt.Sprintf("%v@%v", d["attempt"], d["worker"]))
	}
	if want := []string{"1@doomed", "2@rescuer"}; !slices.Equal(starts, want) {
		t.Fatalf("attempts: %v, want %v", starts, want)
	}
	completed := ofType(events, aaa.EventToolCompleted)
	if len(completed) != 1 || !strings.Contains(string(completed[0].Data), `"output":42`) {
		t.Fatalf("completions: %+v", completed)
	}
}

func TestWorkerConcurrencyLimit(t *testing.T) {
	e := setup(t)
	var running, peak atomic.Int32
	busy := aaa.Tool{Name: "busy", Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(100 * time.Millisecond) // the work itself
		running.Add(-1)
		return task.Arguments, nil
	}}
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{busy}, Concurrency: 1})
	calls := aaa.CallStep(
		aaa.ToolCallRequest{Name: "busy", Arguments: map[string]int{"i": 1}},
		aaa.ToolCallRequest{Name: "busy", Arguments: map[string]int{"i": 2}},
		aaa.ToolCallRequest{Name: "busy", Arguments: map[string]int{"i": 3}},
	)
	runID := e.start(t, aaa.StartRunRequest{Task: "go", Model: aaa.ScriptedModel(calls, aaa.TextStep("done")), Tools: []aaa.ToolRef{{Name: "busy"}}})
	if out := e.result(t, runID); out.Text != "done" {
		t.Fatalf("outcome: %+v", out)
	}
	if peak.Load() != 1 {
		t.Fatalf("%d tasks ran at once with Concurrency 1", peak.Load())
	}
	if n := len(ofType(e.events(t, runID), aaa.EventToolCompleted)); n != 3 {
		t.Fatalf("%d calls completed", n)
	}
}

func TestWorkerGracefulStop(t *testing.T) {
	e := setup(t)
	entered, release := make(chan struct{}), make(chan struct{})
	held := aaa.Tool{Name: "held", Handler: aaa.Typed(func(ctx context.Context, args struct{ X int64 }) (int64, error) {
		close(entered)
		<-release
		return args.X, nil
	})}
	stop := e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{held}})
	runID := e.start(t, aaa.StartRunRequest{
		Task:  "go",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "held", Arguments: map[string]int{"x": 7}}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: "held"}},
	})
	<-entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("the worker stopped before its running task finished")
	default:
	}
	close(release)
	<-stopped
	if out := e.result(t, runID); out.Text != "7" {
		t.Fatalf("outcome: %+v", out)
	}
}

func TestWorkerStopTimeoutFailsTheAttempt(t *testing.T) {
	e := setup(t)
	entered := make(chan struct{})
	cause := make(chan error, 1)
	stuck := aaa.Tool{Name: "stuck", Retry: &aaa.RetryPolicy{MaxAttempts: 1}, Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		close(entered)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}}
	stop := e.serve(t, aaa.WorkerOptions{Identity: "w1", Tools: []aaa.Tool{stuck}, StopTimeout: 50 * time.Millisecond})
	runID := e.start(t, aaa.StartRunRequest{
		Task:  "go",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "stuck"}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: "stuck"}},
	})
	<-entered
	stop()
	if err := <-cause; !errors.Is(err, aaa.ErrWorkerStopped) {
		t.Fatalf("handler's context cause: %v", err)
	}
	if out := e.result(t, runID); out.Text != "WorkerStopped: worker w1 stopped" {
		t.Fatalf("outcome: %+v", out)
	}
}

func TestHeartbeatsAndCancellation(t *testing.T) {
	e := setup(t)
	long := aaa.Tool{Name: "long", HeartbeatTimeout: 500 * time.Millisecond, Retry: &aaa.RetryPolicy{MaxAttempts: 1},
		Handler: aaa.Typed(func(ctx context.Context, args struct{ X int64 }) (int64, error) {
			time.Sleep(1500 * time.Millisecond) // the work itself: three leases long
			return args.X, nil
		})}
	entered := make(chan struct{})
	cause := make(chan error, 1)
	endless := aaa.Tool{Name: "endless", HeartbeatTimeout: 300 * time.Millisecond, Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		close(entered)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}}
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{long, endless}})

	runID := e.start(t, aaa.StartRunRequest{
		Task:  "go",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "long", Arguments: map[string]int{"x": 5}}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: "long"}},
	})
	if out := e.result(t, runID); out.Text != "5" {
		t.Fatalf("outcome: %+v", out)
	}
	if n := len(ofType(e.events(t, runID), aaa.EventToolStarted)); n != 1 {
		t.Fatalf("%d attempts: heartbeats did not keep the lease", n)
	}

	// Cancelling the run cancels the running attempt through its heartbeat.
	cancelled := e.start(t, aaa.StartRunRequest{
		Task:  "go",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "endless"}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: "endless"}},
	})
	<-entered
	if _, err := e.client.Cancel(e.ctx, cancelled, "stop"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, aaa.ErrAttemptCancelled) {
			t.Fatalf("handler's context cause: %v", err)
		}
	case <-e.ctx.Done():
		t.Fatal("the attempt of a cancelled run was not cancelled")
	}
	if out := e.result(t, cancelled); out.Status != aaa.StatusCancelled {
		t.Fatalf("outcome: %+v", out)
	}
}

func TestFailuresReachTheModel(t *testing.T) {
	e := setup(t)
	var attempts atomic.Int32
	tools := []aaa.Tool{
		{Name: "boom", Retry: &aaa.RetryPolicy{MaxAttempts: 1}, Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
			return nil, errors.New("bad input")
		}},
		{Name: "second_try", Retry: &aaa.RetryPolicy{MaxAttempts: 3, InitialBackoff: 100 * time.Millisecond}, Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
			attempts.Add(1)
			info, _ := aaa.TaskFromContext(ctx)
			if info.Attempt == 1 {
				return nil, errors.New("transient")
			}
			return "ok", nil
		}},
		{Name: "fatal", Retry: &aaa.RetryPolicy{MaxAttempts: 3}, Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
			return nil, &aaa.TaskError{Type: "Refused", Message: "no way", NonRetryable: true}
		}},
		{Name: "panics", Retry: &aaa.RetryPolicy{MaxAttempts: 1}, Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
			panic("oops")
		}},
	}
	model := func(ctx context.Context, req *aaa.ModelRequest) (aaa.Reply, error) {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == aaa.RoleUser {
			var calls []aaa.ToolCallRequest
			for _, tool := range req.Tools {
				calls = append(calls, aaa.ToolCallRequest{Name: tool.Name})
			}
			return aaa.Reply{ToolCalls: calls}, nil
		}
		var parts []string
		for _, m := range req.Messages {
			if m.Role == aaa.RoleTool {
				if m.Error != nil {
					parts = append(parts, m.Name+"="+m.Error.String())
				} else {
					parts = append(parts, m.Name+"="+m.Content)
				}
			}
		}
		sort.Strings(parts)
		return aaa.Reply{Content: strings.Join(parts, " | ")}, nil
	}
	e.serve(t, aaa.WorkerOptions{Tools: tools, Models: map[string]aaa.ModelFunc{"m": model}})
	var refs []aaa.ToolRef
	for _, tool := range tools {
		refs = append(refs, aaa.ToolRef{Name: tool.Name})
	}
	runID := e.start(t, aaa.StartRunRequest{Task: "go", Model: aaa.WorkerModel("m"), Tools: refs})
	want := "boom=Error: bad input | fatal=Refused: no way | panics=Panic: oops | second_try=ok"
	if out := e.result(t, runID); out.Text != want {
		t.Fatalf("outcome: %q, want %q", out.Text, want)
	}
	if attempts.Load() != 2 {
		t.Fatalf("second_try ran %d times", attempts.Load())
	}
}

func TestStaleAttemptIsRefused(t *testing.T) {
	e := setup(t)
	lease := aaa.Tool{Name: "lease", HeartbeatTimeout: 500 * time.Millisecond, Retry: &aaa.RetryPolicy{MaxAttempts: 2, InitialBackoff: 100 * time.Millisecond}}
	if _, err := aaa.NewWorker(e.client, aaa.WorkerOptions{Tools: []aaa.Tool{lease}}).Register(e.ctx); err != nil {
		t.Fatal(err)
	}
	runID := e.start(t, aaa.StartRunRequest{
		Task:  "go",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "lease", Arguments: map[string]int{"x": 1}}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: "lease"}},
	})
	poll := func() *aaav1.Task {
		t.Helper()
		for {
			resp, err := e.client.WorkerService().PollTask(e.ctx, &aaav1.PollTaskRequest{Identity: "raw", Tools: []string{"lease"}, WaitS: 5})
			if err != nil {
				t.Fatal(aaa.FromGRPC(err))
			}
			if resp.GetTask() != nil {
				return resp.GetTask()
			}
		}
	}
	first := poll()
	second := poll() // no heartbeat: the lease ran out, this is the retry
	if first.GetAttempt() != 1 || second.GetAttempt() != 2 || second.GetCallId() != first.GetCallId() {
		t.Fatalf("attempts %d and %d", first.GetAttempt(), second.GetAttempt())
	}
	workers := e.client.WorkerService()
	_, err := workers.CompleteTask(e.ctx, &aaav1.CompleteTaskRequest{Token: first.GetToken(), Result: &aaav1.CompleteTaskRequest_OutputJson{OutputJson: "1"}})
	wantReason(t, aaa.FromGRPC(err), aaa.ErrStaleAttempt)
	_, err = workers.HeartbeatTask(e.ctx, &aaav1.HeartbeatTaskRequest{Token: first.GetToken()})
	wantReason(t, aaa.FromGRPC(err), aaa.ErrStaleAttempt)
	_, err = workers.CompleteTask(e.ctx, &aaav1.CompleteTaskRequest{Token: second.GetToken(), Result: &aaav1.CompleteTaskRequest_OutputJson{OutputJson: "1"}})
	if err != nil {
		t.Fatal(aaa.FromGRPC(err))
	}
	if out := e.result(t, runID); string(out.Value) != `{"text":"1"}` {
		t.Fatalf("outcome: %+v", out)
	}
}

// losesFirstReplies is a connection that sends the first CompleteTask and the
// first FailTask to the server, then fails them as if the reply were lost
// (lost gives the code of each); it keeps the server's answers.
type losesFirstReplies struct {
	grpc.ClientConnInterface
	lost    map[string]codes.Code
	mu      sync.Mutex
	answers map[string][]bool // already_recorded of each answer, by method
}

func (c *losesFirstReplies) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	code, watched := c.lost[method]
	err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
	if !watched || err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answers[method] = append(c.answers[method], reply.(interface{ GetAlreadyRecorded() bool }).GetAlreadyRecorded())
	if len(c.answers[method]) == 1 {
		return status.Error(code, "reply lost")
	}
	return nil
}

func TestResultWhoseReplyWasLostIsSentAgain(t *testing.T) {
	e := setup(t)
	conn, err := grpc.NewClient(e.server.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	complete, fail := aaav1.WorkerService_CompleteTask_FullMethodName, aaav1.WorkerService_FailTask_FullMethodName
	wrapped := &losesFirstReplies{
		ClientConnInterface: conn,
		lost:                map[string]codes.Code{complete: codes.DeadlineExceeded, fail: codes.Unavailable},
		answers:             map[string][]bool{},
	}
	works := aaa.Tool{Name: "works", Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) { return 1, nil }}
	refuses := aaa.Tool{Name: "refuses", Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		return nil, &aaa.TaskError{Type: "No", Message: "not 2", NonRetryable: true}
	}}
	var logs lockedLog
	stop := serveWith(t, e.ctx, aaa.NewClient(wrapped), aaa.WorkerOptions{
		Tools:  []aaa.Tool{works, refuses},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	runID := e.start(t, aaa.StartRunRequest{
		Task:  "go",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "works"}, aaa.ToolCallRequest{Name: "refuses"}), aaa.TextStep("done")),
		Tools: []aaa.ToolRef{{Name: "works"}, {Name: "refuses"}},
	})
	if outcome := e.result(t, runID); outcome.Text != "done" {
		t.Fatalf("outcome: %+v", outcome)
	}
	stop() // waits for the reports, which may still be sending again
	// Sent again with the same token and result: the server had it, and says so.
	wrapped.mu.Lock()
	for _, method := range []string{complete, fail} {
		if got := wrapped.answers[method]; !slices.Equal(got, []bool{false, true}) {
			t.Errorf("%s answers (already_recorded): %v, want [false true]", method, got)
		}
	}
	wrapped.mu.Unlock()
	events := e.events(t, runID)
	if n, m := len(ofType(events, aaa.EventToolCompleted)), len(ofType(events, aaa.EventToolFailed)); n != 1 || m != 1 {
		t.Fatalf("%d tool.completed and %d tool.failed, want one each: %v", n, m, types(events))
	}
	if n := strings.Count(logs.String(), "result recorded already"); n != 2 {
		t.Errorf("%d debug lines about a result recorded already, want 2:\n%s", n, logs.String())
	}
}

// lockedLog collects a worker's log lines.
type lockedLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A worker stopped while it registers has stopped, not failed (a test's
// cleanup could cancel Run before its registration answered).
func TestRunStoppedDuringRegistrationReturnsNil(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	worker := aaa.NewWorker(e.client, aaa.WorkerOptions{Identity: "stopped", Tools: []aaa.Tool{wireMoney(&ran)}})
	if err := worker.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
