//! OpenTelemetry traces: an OTLP receiver made from the official
//! `opentelemetry-proto` definitions gets the spans of the reference story
//! (started with the caller's `traceparent`), as a tree under the caller's
//! span; the approval span says who granted what; the worker's task names
//! its attempt's span. A collector that cannot be reached fails no run, and
//! the spans it did not take are counted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aaa::otel::{context, Sampler, Tracer};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;

use crate::auth::{auth_toml, signal_request, token};
use crate::metrics::{scrape, value};
use crate::support::*;

/// Hands every span it receives (with its resource's service name) to the test.
struct Receiver {
    spans: mpsc::UnboundedSender<(String, Span)>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    let _ = self.spans.send((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .filter_map(|kv| Some((kv.key.clone(), text(kv.value.as_ref()?.value.as_ref()?)?)))
        .collect()
}

/// An OTLP/gRPC receiver on a loopback port: its endpoint and its spans.
async fn receiver() -> (String, mpsc::UnboundedReceiver<(String, Span)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let (spans, received) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver { spans }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (endpoint, received)
}

/// A server whose spans go to `endpoint`.
async fn traced_server(endpoint: String) -> TestServer {
    TestServer::start_with(move |config| {
        let tracer =
            Tracer::start(&endpoint, Sampler::AlwaysOn, config.metrics.clone()).expect("tracer");
        config.tracer = Some(Arc::new(tracer));
    })
    .await
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_story_is_one_trace_under_the_callers_span() {
    let (endpoint, mut received) = receiver().await;
    let auth = Arc::new(
        aaa::auth::AuthConfig::parse(&auth_toml(false), std::path::Path::new("."))
            .expect("auth config"),
    );
    let server = TestServer::start_with(move |config| {
        config.auth = Some(auth.clone());
        let tracer =
            Tracer::start(&endpoint, Sampler::AlwaysOn, config.metrics.clone()).expect("tracer");
        config.tracer = Some(Arc::new(tracer));
    })
    .await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let mut approver = Clients::with_token(&server, &token("approver")).await;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    let register = aaa::proto::RegisterWorkerRequest {
        identity: "payments-1".into(),
        tools: vec![wire_money()],
        models: vec![],
    };
    worker
        .workers
        .register_worker(register)
        .await
        .expect("RegisterWorker");

    let mut request = tonic::Request::new(scripted_reference_run());
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("metadata"));
    let run_id = runner
        .runs
        .start_run(request)
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let events = runner
        .wait_for_event(&run_id, "aaa.approval.requested")
        .await;
    let call_id = call_id(events.last().expect("the request"));
    server.clock().advance(Duration::from_secs(30));
    let grant = serde_json::json!({ "call_id": call_id });
    approver
        .runs
        .signal(signal_request(&run_id, "aaa.approval.granted", grant))
        .await
        .expect("grant");
    let poll = aaa::proto::PollTaskRequest {
        identity: "payments-1".into(),
        tools: vec!["wire_money".into()],
        models: vec![],
        wait_s: WAIT.as_secs_f64(),
    };
    let task = worker
        .workers
        .poll_task(poll)
        .await
        .expect("PollTask")
        .into_inner()
        .task
        .expect("a task");
    let run = aaa::domain::RunId::parse(&run_id).expect("run id");
    let attempt_span = hex::encode(context::attempt_span(run, &call_id, 1));
    assert_eq!(
        task.traceparent,
        format!("00-{CALLER_TRACE}-{attempt_span}-01"),
        "the worker's task names its attempt's span in the caller's trace"
    );
    let complete = aaa::proto::CompleteTaskRequest {
        token: task.token,
        result: Some(aaa::proto::complete_task_request::Result::OutputJson(
            REFERENCE_OUTPUT.into(),
        )),
    };
    worker
        .workers
        .complete_task(complete)
        .await
        .expect("CompleteTask");
    runner.wait_for_event(&run_id, "aaa.run.completed").await;

    // The run span is exported last, when the run ends.
    let mut spans = HashMap::new();
    let mut chats = Vec::new();
    while !spans.contains_key("invoke_agent") {
        let (service, span) = tokio::time::timeout(WAIT, received.recv())
            .await
            .expect("spans within the wait")
            .expect("receiver open");
        assert_eq!(service, "aaa");
        if span.name.starts_with("chat ") {
            chats.push(span.clone());
        }
        spans.insert(span.name.clone(), span);
    }
    let run_span = &spans["invoke_agent"];
    for span in spans.values() {
        assert_eq!(hex::encode(&span.trace_id), CALLER_TRACE, "{}", span.name);
    }
    assert_eq!(hex::encode(&run_span.parent_span_id), CALLER_SPAN);
    assert_eq!(run_span.span_id, context::run_span(run).to_vec());
    let run_attributes = attributes(run_span);
    assert_eq!(run_attributes["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(run_attributes["gen_ai.agent.id"], run_id);
    assert_eq!(run_attributes["aaa.run.status"], "completed");

    // The scripted model's two turns.
    assert_eq!(chats.len(), 2, "{:?}", spans.keys());
    assert_ne!(chats[0].span_id, chats[1].span_id);
    for chat in &chats {
        assert_eq!(chat.parent_span_id, run_span.span_id);
        assert_eq!(attributes(chat)["gen_ai.operation.name"], "chat");
    }

    let tool = &spans["execute_tool wire_money"];
    assert_eq!(tool.parent_span_id, run_span.span_id);
    assert_eq!(hex::encode(&tool.span_id), attempt_span);
    let tool_attributes = attributes(tool);
    assert_eq!(tool_attributes["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool_attributes["gen_ai.tool.name"], "wire_money");
    assert_eq!(tool_attributes["gen_ai.tool.call.id"], call_id);
    assert_eq!(tool_attributes["aaa.attempt"], "1");

    let approval = &spans["aaa.approval wire_money"];
    assert_eq!(approval.parent_span_id, run_span.span_id);
    let waited_ns = approval.end_time_unix_nano - approval.start_time_unix_nano;
    assert!(waited_ns >= 30_000_000_000, "the wait spans the 30 s");
    let approval_attributes = attributes(approval);
    assert_eq!(approval_attributes["aaa.approval.decision"], "granted");
    assert_eq!(approval_attributes["aaa.approval.approver"], "approver");
    assert_eq!(approval_attributes["aaa.approval.actor_kind"], "client");
    assert_eq!(
        approval_attributes["aaa.approval.arguments_sha256"],
        hex::encode(Sha256::digest(REFERENCE_ARGS.as_bytes()))
    );
    assert_eq!(approval_attributes["aaa.approval.waited"], "true");
    assert!(approval.start_time_unix_nano >= run_span.start_time_unix_nano);
    assert!(run_span.end_time_unix_nano >= tool.end_time_unix_nano);
    // `AAA_TRACE_SVG=docs/trace.svg` draws the trace for the docs.
    if let Ok(path) = std::env::var("AAA_TRACE_SVG") {
        let mut all: Vec<&Span> = spans
            .values()
            .filter(|s| !s.name.starts_with("chat "))
            .collect();
        all.extend(chats.iter());
        std::fs::write(&path, waterfall(&all)).expect("write the picture");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_without_a_traceparent_gets_a_trace_of_its_own() {
    let (endpoint, mut received) = receiver().await;
    let server = traced_server(endpoint).await;
    let mut runs = server.runs().await;
    let mut request = tonic::Request::new(scripted_run_without_tools());
    // A malformed traceparent is ignored, as the W3C spec asks.
    request.metadata_mut().insert(
        "traceparent",
        "00-not-a-trace-01".parse().expect("metadata"),
    );
    let run_id = runs
        .start_run(request)
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    wait_for_end(&mut runs, &run_id).await;
    let run = aaa::domain::RunId::parse(&run_id).expect("run id");
    loop {
        let (_, span) = tokio::time::timeout(WAIT, received.recv())
            .await
            .expect("spans within the wait")
            .expect("receiver open");
        assert_eq!(span.trace_id, run.as_bytes().to_vec());
        if span.name == "invoke_agent" {
            assert!(span.parent_span_id.is_empty(), "a root span");
            break;
        }
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_collector_fails_no_run_and_its_spans_are_counted() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let server = traced_server(format!("http://127.0.0.1:{port}")).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, scripted_run_without_tools()).await;
    wait_for_end(&mut runs, &run_id).await;
    // The export fails on its own schedule: wait for the count.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let dropped = value(&scrape(&server).await, "aaa_trace_spans_dropped_total");
        if dropped.is_some_and(|n| n >= 1.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no span counted as dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.shutdown().await;
}

/// A run of the scripted model that answers at once, with no tool.
fn scripted_run_without_tools() -> aaa::proto::StartRunRequest {
    let mut request = scripted_reference_run();
    request.tools.clear();
    if let Some(aaa::proto::model_spec::Kind::Scripted(script)) =
        request.model.as_mut().and_then(|m| m.kind.as_mut())
    {
        script.steps = vec![echo_step()];
    }
    request
}

/// The spans of one trace as an SVG waterfall: a bar per span from its
/// start to its end, in start order, children indented under the root.
fn waterfall(spans: &[&Span]) -> String {
    let mut spans = spans.to_vec();
    spans.sort_by_key(|s| (s.start_time_unix_nano, s.name.clone()));
    let start = spans
        .iter()
        .map(|s| s.start_time_unix_nano)
        .min()
        .unwrap_or(0);
    let end = spans
        .iter()
        .map(|s| s.end_time_unix_nano)
        .max()
        .unwrap_or(1);
    let total = (end - start).max(1) as f64;
    let (label_width, bar_width, row) = (300.0, 560.0, 28.0);
    let height = row * (spans.len() as f64 + 1.5);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        w = label_width + bar_width + 120.0
    );
    for (i, span) in spans.iter().enumerate() {
        let y = row * (i as f64 + 0.5);
        let root = span.name == "invoke_agent";
        let x = label_width + bar_width * (span.start_time_unix_nano - start) as f64 / total;
        let width = (bar_width * (span.end_time_unix_nano - span.start_time_unix_nano) as f64
            / total)
            .max(2.0);
        let millis = (span.end_time_unix_nano - span.start_time_unix_nano) as f64 / 1e6;
        let color = match span.name.split(' ').next() {
            Some("invoke_agent") => "#6c7a89",
            Some("aaa.approval") => "#e67e22",
            Some("execute_tool") => "#27ae60",
            _ => "#2e86de",
        };
        let indent = if root { 8.0 } else { 24.0 };
        svg.push_str(&format!(
            "<text x=\"{indent}\" y=\"{ty}\">{name}</text>\n\
             <rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{width:.1}\" height=\"18\" rx=\"3\" fill=\"{color}\"/>\n\
             <text x=\"{tx:.1}\" y=\"{ty}\" fill=\"#333\">{millis:.1} ms</text>\n",
            ty = y + 14.0,
            name = span.name,
            tx = x + width + 6.0,
        ));
    }
    svg.push_str(&format!(
        "<text x=\"8\" y=\"{y}\" fill=\"#666\">one trace of the reference story; the approval waited for a human (the test moved the clock 30 s)</text>\n</svg>\n",
        y = height - 8.0
    ));
    svg
}
