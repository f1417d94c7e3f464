package aaa

import (
	"context"

	"aaa.dev/clients/go/aaav1"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/metadata"
)

// OpenTelemetry: StartRun sends the W3C traceparent of the span in its
// context, so the run's spans join the caller's trace, and a Worker runs each
// handler in a span that is a child of the server's span of the attempt
// (Task.traceparent), from the global TracerProvider. Until the application
// registers one (otel.SetTracerProvider), the API records nothing.

// traceContext writes and reads traceparent. The server reads W3C
// traceparent only, so this propagator is used rather than the global one,
// which is a no-op until the application sets it, or may be another format.
var traceContext = propagation.TraceContext{}

// withTraceparent adds the traceparent of ctx's span to ctx's outgoing
// metadata; ctx as it is when it has no valid span.
func withTraceparent(ctx context.Context) context.Context {
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	if value := carrier.Get("traceparent"); value != "" {
		return metadata.AppendToOutgoingContext(ctx, "traceparent", value)
	}
	return ctx
}

// startTaskSpan starts the worker's span of task when the task names the
// server's span of the attempt: "execute_tool NAME" (internal) for a tool,
// "chat MODEL" (client) for a model, a child of the server's span, current in
// the returned context so the handler's spans nest under it. Otherwise ctx
// and a span that records nothing.
func startTaskSpan(ctx context.Context, task *aaav1.Task) (context.Context, trace.Span) {
	if task.GetTraceparent() == "" {
		return ctx, noop.Span{}
	}
	parent := traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": task.GetTraceparent()})
	if !trace.SpanContextFromContext(parent).IsRemote() {
		return ctx, noop.Span{} // not a valid traceparent
	}
	operation, kind := "chat", trace.SpanKindClient
	name := attribute.String("gen_ai.request.model", task.GetModel().GetModel())
	if tool := task.GetTool(); tool != nil {
		operation, kind = "execute_tool", trace.SpanKindInternal
		name = attribute.String("gen_ai.tool.name", tool.GetName())
	}
	return otel.Tracer("aaa.dev/clients/go").Start(parent, operation+" "+name.Value.AsString(),
		trace.WithSpanKind(kind),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", operation),
			name,
			attribute.String("aaa.run_id", task.GetRunId()),
			attribute.String("aaa.call_id", task.GetCallId()),
			attribute.Int64("aaa.attempt", int64(task.GetAttempt())),
		))
}

// failSpan marks span failed by err, reported with error type errorType.
func failSpan(span trace.Span, err error, errorType string) {
	span.RecordError(err)
	span.SetAttributes(attribute.String("error.type", errorType))
	span.SetStatus(otelcodes.Error, err.Error())
}
