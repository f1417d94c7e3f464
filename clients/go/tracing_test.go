package aaa_test

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"

	aaa "aaa.dev/clients/go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// withSpanRecorder makes a recording TracerProvider the global one for the test.
func withSpanRecorder(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	otel.SetTracerProvider(provider)
	t.Cleanup(func() {
		// Back to one that records nothing, as when no provider is set.
		otel.SetTracerProvider(noop.NewTracerProvider())
		_ = provider.Shutdown(context.Background())
	})
	return recorder
}

// parseTraceparent splits a "00-TRACE-SPAN-FLAGS" value into its trace and span ids.
func parseTraceparent(t *testing.T, value string) (trace.TraceID, trace.SpanID) {
	t.Helper()
	parts := strings.Split(value, "-")
	if len(parts) != 4 || parts[0] != "00" {
		t.Fatalf("traceparent %q", value)
	}
	traceID, err := trace.TraceIDFromHex(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	spanID, err := trace.SpanIDFromHex(parts[2])
	if err != nil {
		t.Fatal(err)
	}
	return traceID, spanID
}

// startRunHeaders records the traceparent metadata of each StartRun call.
type startRunHeaders struct {
	mu   sync.Mutex
	sent [][]string
}

func (h *startRunHeaders) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if strings.HasSuffix(method, "/StartRun") {
		md, _ := metadata.FromOutgoingContext(ctx)
		h.mu.Lock()
		h.sent = append(h.sent, md.Get("traceparent"))
		h.mu.Unlock()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// dial connects a client whose StartRun calls h records.
func (h *startRunHeaders) dial(t *testing.T, addr string) *aaa.Client {
	t.Helper()
	client, err := aaa.Dial(addr, aaa.WithDialOptions(grpc.WithChainUnaryInterceptor(h.intercept)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func attributesOf(span sdktrace.ReadOnlySpan) map[string]attribute.Value {
	attrs := map[string]attribute.Value{}
	for _, kv := range span.Attributes() {
		attrs[string(kv.Key)] = kv.Value
	}
	return attrs
}

// payRequest is the reference run: one call of wire_money, then the tool's output as the answer.
func payRequest() aaa.StartRunRequest {
	return aaa.StartRunRequest{
		Task: "Pay ACME $250",
		Model: aaa.ScriptedModel(
			aaa.Step{ToolCalls: []aaa.ToolCallRequest{{Name: "wire_money", Arguments: map[string]any{"amount": 250, "to": "ACME"}}}},
			aaa.EchoStep(),
		),
		Tools: []aaa.ToolRef{{Name: "wire_money"}},
	}
}

func TestWorkerSpanIsAChildOfTheServersSpanInTheCallersTrace(t *testing.T) {
	e := setup(t)
	recorder := withSpanRecorder(t)
	headers := &startRunHeaders{}
	client := headers.dial(t, e.server.Addr)
	tasks := make(chan aaa.TaskInfo, 1)
	wireMoney := aaa.Tool{Name: "wire_money", Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		_, inner := otel.Tracer("test").Start(ctx, "bank.transfer") // the tool's own span
		inner.End()
		tasks <- task.TaskInfo
		return "sent $250 to ACME", nil
	}}
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney}})

	ctx, parent := otel.Tracer("test").Start(e.ctx, "checkout")
	started, err := client.StartRun(ctx, payRequest())
	parent.End()
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	if out := e.result(t, started.RunID); out.Text != "sent $250 to ACME" {
		t.Fatalf("outcome: %+v", out)
	}
	caller := parent.SpanContext()
	want := "00-" + caller.TraceID().String() + "-" + caller.SpanID().String() + "-01"
	if len(headers.sent) != 1 || len(headers.sent[0]) != 1 || headers.sent[0][0] != want {
		t.Fatalf("StartRun sent traceparent %q, want %q", headers.sent, want)
	}

	task := <-tasks
	taskTrace, serverSpan := parseTraceparent(t, task.Traceparent)
	if taskTrace != caller.TraceID() {
		t.Fatalf("the task's trace %s is not the caller's %s", taskTrace, caller.TraceID())
	}
	if serverSpan == caller.SpanID() {
		t.Fatal("the task names the caller's span, not the server's span of the attempt")
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, span := range recorder.Ended() {
		spans[span.Name()] = span
	}
	span, ok := spans["execute_tool wire_money"]
	if !ok {
		t.Fatalf("no worker span among %v", spans)
	}
	if span.SpanKind() != trace.SpanKindInternal {
		t.Errorf("kind %v", span.SpanKind())
	}
	if span.SpanContext().TraceID() != caller.TraceID() {
		t.Errorf("worker span in trace %s, want %s", span.SpanContext().TraceID(), caller.TraceID())
	}
	if span.Parent().SpanID() != serverSpan || !span.Parent().IsRemote() {
		t.Errorf("worker span's parent %s (remote %v), want the server's %s", span.Parent().SpanID(), span.Parent().IsRemote(), serverSpan)
	}
	wantAttrs := map[string]attribute.Value{
		"gen_ai.operation.name": attribute.StringValue("execute_tool"),
		"gen_ai.tool.name":      attribute.StringValue("wire_money"),
		"aaa.run_id":            attribute.StringValue(started.RunID),
		"aaa.call_id":           attribute.StringValue(task.CallID),
		"aaa.attempt":           attribute.Int64Value(1),
	}
	if got := attributesOf(span); !reflect.DeepEqual(got, wantAttrs) {
		t.Errorf("attributes %v, want %v", got, wantAttrs)
	}
	if span.Status().Code != codes.Unset {
		t.Errorf("status %v", span.Status())
	}
	if inner := spans["bank.transfer"]; inner == nil || inner.Parent().SpanID() != span.SpanContext().SpanID() {
		t.Errorf("the tool's span is not a child of the worker's span")
	}
}

func TestModelTasksGetAChatSpanAndFailuresMarkTheSpan(t *testing.T) {
	e := setup(t)
	recorder := withSpanRecorder(t)
	wireMoney := aaa.Tool{Name: "wire_money", Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		return nil, &aaa.TaskError{Type: "BankClosed", Message: "bank closed", NonRetryable: true}
	}}
	model := func(ctx context.Context, req *aaa.ModelRequest) (aaa.Reply, error) {
		if req.Messages[len(req.Messages)-1].Role == aaa.RoleUser {
			return aaa.Reply{ToolCalls: []aaa.ToolCallRequest{{Name: "wire_money", Arguments: map[string]any{"amount": 250}}}}, nil
		}
		return aaa.Reply{Content: "gave up"}, nil
	}
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney}, Models: map[string]aaa.ModelFunc{"m": model}})
	ctx, parent := otel.Tracer("test").Start(e.ctx, "checkout")
	started, err := e.client.StartRun(ctx, aaa.StartRunRequest{Task: "Pay ACME $250", Model: aaa.WorkerModel("m"), Tools: []aaa.ToolRef{{Name: "wire_money"}}})
	parent.End()
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	if out := e.result(t, started.RunID); out.Text != "gave up" {
		t.Fatalf("outcome: %+v", out)
	}
	var chats, tools []sdktrace.ReadOnlySpan
	for _, span := range recorder.Ended() {
		switch span.Name() {
		case "chat m":
			chats = append(chats, span)
		case "execute_tool wire_money":
			tools = append(tools, span)
		}
	}
	if len(chats) != 2 || len(tools) != 1 {
		t.Fatalf("%d chat and %d tool spans", len(chats), len(tools))
	}
	for _, chat := range chats {
		attrs := attributesOf(chat)
		if chat.SpanKind() != trace.SpanKindClient || chat.SpanContext().TraceID() != parent.SpanContext().TraceID() ||
			attrs["gen_ai.operation.name"].AsString() != "chat" || attrs["gen_ai.request.model"].AsString() != "m" ||
			attrs["aaa.run_id"].AsString() != started.RunID {
			t.Errorf("chat span: kind %v, trace %s, attributes %v", chat.SpanKind(), chat.SpanContext().TraceID(), attrs)
		}
	}
	failed := tools[0]
	if failed.Status().Code != codes.Error || attributesOf(failed)["error.type"].AsString() != "BankClosed" {
		t.Errorf("failed tool span: status %v, attributes %v", failed.Status(), attributesOf(failed))
	}
	if events := failed.Events(); len(events) != 1 || events[0].Name != "exception" {
		t.Errorf("failed tool span's events: %v", events)
	}
}

func TestWithoutOpenTelemetrySetUpNothingChanges(t *testing.T) {
	e := setup(t)
	headers := &startRunHeaders{}
	client := headers.dial(t, e.server.Addr)
	tasks := make(chan aaa.TaskInfo, 1)
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{{Name: "wire_money", Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		if trace.SpanFromContext(ctx).IsRecording() {
			t.Error("a recording span without a TracerProvider")
		}
		tasks <- task.TaskInfo
		return "sent $250 to ACME", nil
	}}}})
	// No TracerProvider is set (the API's default records nothing), and ctx has no span.
	started, err := client.StartRun(e.ctx, payRequest())
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	if out := e.result(t, started.RunID); out.Text != "sent $250 to ACME" {
		t.Fatalf("outcome: %+v", out)
	}
	if len(headers.sent) != 1 || len(headers.sent[0]) != 0 {
		t.Fatalf("StartRun sent traceparent %q without a span", headers.sent)
	}
	parseTraceparent(t, (<-tasks).Traceparent) // the run's own trace
}
