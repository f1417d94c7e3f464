package aaa_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/internal/testserver"
)

// testTimeout bounds every test's waits for the server.
const testTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	// The test binary doubles as the doomed worker of TestWorkerFailover.
	if os.Getenv(doomedWorkerEnv) != "" {
		runDoomedWorker()
		return
	}
	os.Exit(m.Run())
}

// env is one test's server, a client of it, and a context that ends with the test.
type env struct {
	server *testserver.Server
	client *aaa.Client
	ctx    context.Context
}

// setup starts a server for the test and connects a client to it.
func setup(t *testing.T) *env {
	t.Helper()
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return &env{server: server, client: dial(t, server.Addr), ctx: ctx}
}

// dial connects a new client (a connection of its own) to addr.
func dial(t *testing.T, addr string) *aaa.Client {
	t.Helper()
	client, err := aaa.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// serve registers and runs a worker until the test ends (or until the
// returned stop is called, which waits for Run to return).
func (e *env) serve(t *testing.T, opts aaa.WorkerOptions) (stop func()) {
	t.Helper()
	return serveWith(t, e.ctx, e.client, opts)
}

func serveWith(t *testing.T, ctx context.Context, client *aaa.Client, opts aaa.WorkerOptions) (stop func()) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	worker := aaa.NewWorker(client, opts)
	if _, err := worker.Register(ctx); err != nil {
		t.Fatalf("register: %v", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// testWriter sends a worker's logs to the test's log (shown on failure or with -v).
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// start starts a run, failing the test on error.
func (e *env) start(t *testing.T, req aaa.StartRunRequest) string {
	t.Helper()
	started, err := e.client.StartRun(e.ctx, req)
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	return started.RunID
}

// result waits for a run's outcome.
func (e *env) result(t *testing.T, runID string) *aaa.Outcome {
	t.Helper()
	outcome, err := e.client.Result(e.ctx, runID)
	if err != nil {
		t.Fatalf("Result: %v\nserver log:\n%s", err, e.server.Log())
	}
	return outcome
}

// events returns all stored events of a run.
func (e *env) events(t *testing.T, runID string) []aaa.Event {
	t.Helper()
	var events []aaa.Event
	for event, err := range e.client.Events(e.ctx, runID, aaa.EventsOptions{}) {
		if err != nil {
			t.Fatalf("Events: %v", err)
		}
		events = append(events, event)
	}
	return events
}

// waitFor returns the first event of this type in a run, waiting for it.
func (e *env) waitFor(t *testing.T, runID, eventType string) aaa.Event {
	t.Helper()
	opts := aaa.EventsOptions{Follow: true, StopAtEnd: true, TypePrefix: eventType}
	for event, err := range e.client.Events(e.ctx, runID, opts) {
		if err != nil {
			t.Fatalf("Events: %v", err)
		}
		if event.Type == eventType {
			return event
		}
	}
	t.Fatalf("run %s ended without %s", runID, eventType)
	return aaa.Event{}
}

// ofType keeps the events of one type.
func ofType(events []aaa.Event, eventType string) []aaa.Event {
	var kept []aaa.Event
	for _, e := range events {
		if e.Type == eventType {
			kept = append(kept, e)
		}
	}
	return kept
}

// types lists the events' types.
func types(events []aaa.Event) []string {
	var ts []string
	for _, e := range events {
		ts = append(ts, e.Type)
	}
	return ts
}

// decode decodes an event's data into a map (numbers as json.Number).
func decode(t *testing.T, e aaa.Event) map[string]any {
	t.Helper()
	var data map[string]any
	if err := e.Decode(&data); err != nil {
		t.Fatalf("decode %s: %v", e.Type, err)
	}
	return data
}

// wantReason checks that err is an *aaa.Error with this reason.
func wantReason(t *testing.T, err error, reason aaa.Reason) *aaa.Error {
	t.Helper()
	if !errors.Is(err, reason) {
		t.Fatalf("got error %v, want reason %s", err, reason)
	}
	var e *aaa.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not an *aaa.Error", err)
	}
	return e
}
