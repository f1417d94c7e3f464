//! The built-in OpenAI-compatible model against a fake provider: a small
//! HTTP server on a loopback port that checks every request against the
//! Chat Completions shape (refusing what the real API refuses), records it,
//! and answers as the test scripts it: replies, tool calls, errors, 429
//! with Retry-After, malformed JSON, or no answer at all.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aaa::openai::ModelsConfig;
use aaa::proto::{
    model_spec, Budget, Event, ListRunsRequest, ModelSpec, OpenAiModel, RunStatus, StartRunRequest,
    ToolDefinition, ToolRef,
};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::*;

/// The key the fake accepts. Tests check it never reaches the log.
const KEY: &str = "sk-test-7Hq2ZfW9c4LkP0aaaSECRETbb3";

// ------------------------------------------------------------ the fake

/// How the fake answers one request.
enum Answer {
    /// 200 with this chat completion.
    Completion(Value),
    /// This status, headers and body.
    Status(u16, Vec<(&'static str, &'static str)>, String),
    /// Never answers (the request stays in flight).
    Hang,
}

/// What the fake saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    body: Value,
    at: Instant,
}

type Script = dyn Fn(usize, &Value) -> Answer + Send + Sync;

struct FakeOpenAi {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Requests the fake refused as the real API would: a test fails on any.
    refused: Arc<Mutex<Vec<String>>>,
    arrivals: mpsc::UnboundedReceiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeOpenAi {
    /// Serves `script(n, body)` for the n-th valid request (from 0).
    async fn start(script: impl Fn(usize, &Value) -> Answer + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let (arrived, arrivals) = mpsc::unbounded_channel();
        let script: Arc<Script> = Arc::new(script);
        let (seen_in, refused_in) = (seen.clone(), refused.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let (seen, refused, arrived, script) = (
                    seen_in.clone(),
                    refused_in.clone(),
                    arrived.clone(),
                    script.clone(),
                );
                let service = hyper::service::service_fn(
                    move |request: http::Request<hyper::body::Incoming>| {
                        let (seen, refused, arrived, script) = (
                            seen.clone(),
                            refused.clone(),
                            arrived.clone(),
                            script.clone(),
                        );
                        async move {
                            let (parts, body) = request.into_parts();
                            let body = body.collect().await?.to_bytes();
                            let answer = match check(&parts, &body) {
                                Err((status, message)) => {
                                    refused.lock().unwrap().push(message.clone());
                                    let error = json!({"error": {"message": message, "type": "invalid_request_error"}});
                                    Answer::Status(status, vec![], error.to_string())
                                }
                                Ok(body) => {
                                    let n = {
                                        let mut seen = seen.lock().unwrap();
                                        seen.push(Seen {
                                            body: body.clone(),
                                            at: Instant::now(),
                                        });
                                        seen.len() - 1
                                    };
                                    let _ = arrived.send(n);
                                    script(n, &body)
                                }
                            };
                            let (status, headers, body) = match answer {
                                Answer::Completion(value) => (200, vec![], value.to_string()),
                                Answer::Status(status, headers, body) => (status, headers, body),
                                Answer::Hang => std::future::pending().await,
                            };
                            let mut response = http::Response::builder()
                                .status(status)
                                .header("content-type", "application/json");
                            for (name, value) in headers {
                                response = response.header(name, value);
                            }
                            Ok::<_, hyper::Error>(
                                response.body(Full::new(bytes::Bytes::from(body))).unwrap(),
                            )
                        }
                    },
                );
                tokio::spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(socket);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        FakeOpenAi {
            addr,
            seen,
            refused,
            arrivals,
            task,
        }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits for the next request to arrive; returns its number.
    async fn next_arrival(&mut self) -> usize {
        tokio::time::timeout(WAIT, self.arrivals.recv())
            .await
            .expect("no request reached the fake provider")
            .expect("the fake stopped")
    }

    #[track_caller]
    fn assert_nothing_refused(&self) {
        let refused = self.refused.lock().unwrap().clone();
        assert!(refused.is_empty(), "the fake refused requests: {refused:?}");
    }

    /// A models file naming this fake as provider "fake".
    fn models_toml(&self, key_line: &str, max_attempts: u32) -> String {
        format!(
            "[[provider]]\nname = \"fake\"\nbase_url = \"{}\"\n{key_line}\n\
             default_model = \"fake-model\"\nmax_attempts = {max_attempts}\n\
             initial_backoff_s = 0.01\nmax_backoff_s = 0.05\n\
             headers = {{ \"X-Team\" = \"payments\" }}\n",
            self.base_url()
        )
    }

    /// The models config for an in-process server (the key from a fake env).
    fn models(&self, max_attempts: u32) -> Arc<ModelsConfig> {
        self.models_with(max_attempts, "")
    }

    /// [`FakeOpenAi::models`] with more TOML lines for the provider.
    fn models_with(&self, max_attempts: u32, more: &str) -> Arc<ModelsConfig> {
        let key_line = format!("api_key_env = \"FAKE_KEY\"\n{more}");
        let toml = self.models_toml(&key_line, max_attempts);
        let env = |name: &str| (name == "FAKE_KEY").then(|| KEY.to_string());
        Arc::new(ModelsConfig::parse(&toml, std::path::Path::new("."), env).unwrap())
    }
}

/// Checks a request as the Chat Completions API would; the body on success.
fn check(parts: &http::request::Parts, body: &[u8]) -> Result<Value, (u16, String)> {
    if parts.method != http::Method::POST || parts.uri.path() != "/v1/chat/completions" {
        return Err((404, format!("no route {} {}", parts.method, parts.uri)));
    }
    let authorization = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if authorization != format!("Bearer {KEY}") {
        // As OpenAI does: the key quoted back (here whole, the worst case).
        let quoted = authorization.trim_start_matches("Bearer ");
        return Err((401, format!("Incorrect API key provided: {quoted}")));
    }
    if parts.headers.get("x-team").is_none_or(|v| v != "payments") {
        return Err((400, "the configured extra header is missing".into()));
    }
    let body: Value = serde_json::from_slice(body).map_err(|e| (400, format!("not JSON: {e}")))?;
    chat_request_problem(&body).map_or(Ok(body), |problem| Err((400, problem)))
}

/// What the real API would refuse in a request body, if anything.
fn chat_request_problem(body: &Value) -> Option<String> {
    let string = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
    if body["model"].as_str().is_none_or(str::is_empty) {
        return Some("model: required".into());
    }
    let messages = body["messages"].as_array().filter(|m| !m.is_empty());
    let Some(messages) = messages else {
        return Some("messages: a non-empty array".into());
    };
    // Tool calls still to be answered by tool messages.
    let mut open: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        if role != "tool" && !open.is_empty() {
            return Some(format!(
                "messages[{i}]: an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id': {open:?}"
            ));
        }
        match role {
            "system" | "user" => {
                if !message["content"].is_string() {
                    return Some(format!("messages[{i}].content: a string"));
                }
            }
            "assistant" => {
                let calls = message.get("tool_calls");
                let has_calls = calls.is_some_and(|c| c.as_array().is_some_and(|a| !a.is_empty()));
                let content = &message["content"];
                let null_with_calls = content.is_null() && has_calls;
                if !content.is_string() && !null_with_calls {
                    return Some(format!(
                        "messages[{i}].content: a string, or null with tool_calls"
                    ));
                }
                for (j, call) in calls
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let ok = string(&call["id"])
                        && call["type"] == "function"
                        && string(&call["function"]["name"])
                        && call["function"]["arguments"].is_string();
                    if !ok {
                        return Some(format!("messages[{i}].tool_calls[{j}]: {{id, type: function, function: {{name, arguments: string}}}}"));
                    }
                    open.push(call["id"].as_str().unwrap().to_string());
                }
            }
            "tool" => {
                let Some(id) = message["tool_call_id"].as_str().filter(|id| !id.is_empty()) else {
                    return Some(format!(
                        "messages[{i}]: missing required parameter 'tool_call_id'"
                    ));
                };
                if !message["content"].is_string() {
                    return Some(format!("messages[{i}].content: a string"));
                }
                let Some(at) = open.iter().position(|o| o == id) else {
                    return Some(format!(
                        "messages[{i}]: 'tool' must answer a preceding tool call ({id})"
                    ));
                };
                open.remove(at);
            }
            other => return Some(format!("messages[{i}].role: unknown role '{other}'")),
        }
    }
    if !open.is_empty() {
        return Some(format!("tool calls without results: {open:?}"));
    }
    if let Some(tools) = body.get("tools") {
        for (i, tool) in tools.as_array().into_iter().flatten().enumerate() {
            let name = tool["function"]["name"].as_str().unwrap_or_default();
            let valid_name = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if tool["type"] != "function"
                || !valid_name
                || !tool["function"]["parameters"].is_object()
            {
                return Some(format!(
                    "tools[{i}]: {{type: function, function: {{name, parameters: object}}}}"
                ));
            }
        }
    }
    if let Some(t) = body.get("temperature") {
        if !t.as_f64().is_some_and(|t| (0.0..=2.0).contains(&t)) {
            return Some("temperature: 0 to 2".into());
        }
    }
    None
}

/// A chat completion with text.
fn text(content: &str, prompt_tokens: u64, completion_tokens: u64) -> Answer {
    Answer::Completion(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "fake-model-2026",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }))
}

/// A chat completion with tool calls, (name, arguments text) each.
fn tool_calls(calls: &[(&str, &str)], prompt_tokens: u64, completion_tokens: u64) -> Answer {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({"id": format!("call_fake{i}"), "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    Answer::Completion(json!({
        "id": "chatcmpl-2", "object": "chat.completion", "model": "fake-model-2026",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls},
                     "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }))
}

/// The reference model: a user message last -> wire_money(250, ACME);
/// otherwise reply with the last message's content.
fn reference_model(_: usize, body: &Value) -> Answer {
    let last = body["messages"].as_array().unwrap().last().unwrap();
    match last["role"].as_str() {
        Some("user") => tool_calls(&[("wire_money", REFERENCE_ARGS)], 20, 10),
        _ => text(last["content"].as_str().unwrap_or_default(), 30, 5),
    }
}

// ------------------------------------------------------------ runs

fn openai_run(task: &str, tools: &[&str]) -> StartRunRequest {
    StartRunRequest {
        task: task.into(),
        system: "You move money carefully.".into(),
        model: Some(ModelSpec {
            kind: Some(model_spec::Kind::Openai(OpenAiModel {
                model: "fake-model".into(),
                provider: "fake".into(),
                temperature: Some(0.2),
                max_tokens: 256,
            })),
        }),
        tools: tools
            .iter()
            .map(|name| ToolRef {
                name: name.to_string(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn lookup_vendor() -> ToolDefinition {
    ToolDefinition {
        name: "lookup_vendor".into(),
        description: "Find a vendor's account".into(),
        parameters_json: r#"{"type":"object","properties":{"name":{"type":"string"}}}"#.into(),
        ..Default::default()
    }
}

fn of_type(events: &[Event], ty: &str) -> Vec<Value> {
    events.iter().filter(|e| e.r#type == ty).map(data).collect()
}

fn messages(seen: &Seen) -> Vec<Value> {
    seen.body["messages"].as_array().unwrap().clone()
}

// ------------------------------------------------------------ tests

#[test]
fn the_fake_refuses_what_the_real_api_refuses() {
    let valid = json!({"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]});
    assert_eq!(chat_request_problem(&valid), None);
    let mut no_id = valid.clone();
    no_id["messages"][2]
        .as_object_mut()
        .unwrap()
        .remove("tool_call_id");
    assert!(chat_request_problem(&no_id)
        .unwrap()
        .contains("tool_call_id"));
    let mut unanswered = valid.clone();
    unanswered["messages"].as_array_mut().unwrap().pop();
    assert!(chat_request_problem(&unanswered)
        .unwrap()
        .contains("without results"));
    let mut no_content = valid.clone();
    no_content["messages"][1]["tool_calls"] = json!([]);
    assert!(chat_request_problem(&no_content)
        .unwrap()
        .contains("content"));
    let bad_tool = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "has.dot", "parameters": {}}}]});
    assert!(chat_request_problem(&bad_tool).is_some());
}

/// DESIGN.md §1 with the built-in model: it proposes wire_money, a human
/// grants it, the worker runs it, and the model echoes the result.
#[tokio::test(flavor = "multi_thread")]
async fn the_reference_story_with_the_built_in_model() {
    let fake = FakeOpenAi::start(reference_model).await;
    let models = fake.models(3);
    let server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;

    let run_id = start_run(&mut runs, openai_run("Pay ACME $250", &["wire_money"])).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    assert_eq!(
        worker.tool_tasks_of(&run_id).len(),
        0,
        "nothing runs before the grant"
    );
    grant(&mut runs, &run_id, &call_id).await;
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(types(&events), REFERENCE_TYPES);
    assert_eq!(completed_text(&events), REFERENCE_TEXT);
    let tool_requested = data(find(&events, "aaa.tool.requested"));
    assert_eq!(
        tool_requested["arguments"],
        json!({"amount": 250, "to": "ACME"})
    );
    let started = data(find(&events, "aaa.run.started"));
    assert_eq!(
        started["model"],
        json!({"openai": {"provider": "fake", "model": "fake-model", "temperature": 0.2,
                          "max_tokens": 256, "max_attempts": 3}})
    );

    // Each model call: attempt 1, usage, the provider's model name, why it stopped.
    let completed = of_type(&events, "aaa.llm.completed");
    assert_eq!(completed[0]["attempt"], 1);
    assert_eq!(
        completed[0]["usage"],
        json!({"prompt_tokens": 20, "completion_tokens": 10})
    );
    assert_eq!(completed[0]["model"], "fake-model-2026");
    assert_eq!(completed[0]["finish_reason"], "tool_calls");
    assert!(completed[0]["latency_ms"].is_u64());
    assert_eq!(completed[1]["finish_reason"], "stop");
    for requested in of_type(&events, "aaa.llm.requested") {
        assert_eq!(requested["model"], "openai:fake-model@fake");
    }

    // What the provider got: the tools, then the whole conversation.
    fake.assert_nothing_refused();
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    let first = &seen[0].body;
    assert_eq!(first["model"], "fake-model");
    assert_eq!(first["temperature"], 0.2);
    assert_eq!(first["max_tokens"], 256);
    assert_eq!(first["tools"][0]["function"]["name"], "wire_money");
    assert_eq!(
        first["tools"][0]["function"]["parameters"]["required"],
        json!(["amount", "to"])
    );
    assert_eq!(
        messages(&seen[0]),
        vec![
            json!({"role": "system", "content": "You move money carefully."}),
            json!({"role": "user", "content": "Pay ACME $250"}),
        ]
    );
    let second = messages(&seen[1]);
    assert_eq!(second[2]["tool_calls"][0]["id"], call_id);
    assert_eq!(
        second[2]["tool_calls"][0]["function"]["arguments"],
        REFERENCE_ARGS
    );
    assert_eq!(
        second[3],
        json!({"role": "tool", "tool_call_id": call_id, "content": REFERENCE_TEXT})
    );

    // Usage totals in GetRun and ListRuns.
    let run = get_run(&mut runs, &run_id).await;
    let usage = run.usage.expect("usage");
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.total_tokens
        ),
        (50, 15, 65)
    );
    assert_eq!(run.model, "openai:fake-model@fake");
    let listed = runs
        .list_runs(ListRunsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let listed = listed.runs.iter().find(|r| r.run_id == run_id).unwrap();
    assert_eq!(listed.usage.unwrap().total_tokens, 65);
    worker.stop().await;
    server.shutdown().await;
}

/// A denial is the tool's result, which the model reads.
#[tokio::test(flavor = "multi_thread")]
async fn the_model_reads_a_denial() {
    let fake = FakeOpenAi::start(reference_model).await;
    let models = fake.models(3);
    let server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;

    let run_id = start_run(&mut runs, openai_run("Pay ACME $250", &["wire_money"])).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    deny(&mut runs, &run_id, &call_id, "not this vendor").await;
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(count(&events, "aaa.tool.started"), 0);
    assert_eq!(completed_text(&events), "ApprovalDenied: not this vendor");
    let seen = fake.seen();
    let tool = &messages(&seen[1])[3];
    assert_eq!(tool["tool_call_id"], call_id);
    assert_eq!(tool["content"], "ApprovalDenied: not this vendor");
    fake.assert_nothing_refused();
    server.shutdown().await;
}

/// One reply, three calls: a gated one waits for its grant, an ungated one
/// runs at once, and one whose arguments are not JSON goes back to the
/// model as a tool error without anyone being asked.
#[tokio::test(flavor = "multi_thread")]
async fn several_tool_calls_in_one_reply_each_gated_on_its_own() {
    let fake = FakeOpenAi::start(|n, body| match n {
        0 => tool_calls(
            &[
                ("wire_money", REFERENCE_ARGS),
                ("lookup_vendor", r#"{"name":"ACME"}"#),
                ("wire_money", r#"{"amount": 250, "to": "ACME""#),
            ],
            40,
            30,
        ),
        _ => {
            let results: Vec<&str> = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap())
                .collect();
            text(&results.join(" | "), 50, 10)
        }
    })
    .await;
    let models = fake.models(3);
    let server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let mut runs = server.runs().await;
    register(
        &mut server.workers().await,
        vec![wire_money(), lookup_vendor()],
        &[],
    )
    .await;
    let worker = Worker::spawn(&server, "w", &["wire_money", "lookup_vendor"], &[]).await;

    let run_id = start_run(
        &mut runs,
        openai_run("Pay ACME", &["wire_money", "lookup_vendor"]),
    )
    .await;
    // The ungated call runs while the gated one waits.
    let events = wait_for_event(&mut runs, &run_id, "aaa.tool.completed").await;
    let requested = of_type(&events, "aaa.tool.requested");
    assert_eq!(requested.len(), 3);
    assert_eq!(
        requested[2]["arguments"],
        json!(r#"{"amount": 250, "to": "ACME""#)
    );
    let approvals = of_type(&events, "aaa.approval.requested");
    assert_eq!(
        approvals.len(),
        1,
        "only the valid gated call is shown to a human"
    );
    assert_eq!(approvals[0]["call_id"], "call-1");
    assert_eq!(data(events.last().unwrap())["call_id"], "call-2");
    let failed = of_type(&events, "aaa.tool.failed");
    assert_eq!(failed[0]["call_id"], "call-3");
    assert_eq!(failed[0]["error"]["type"], "InvalidArguments");
    assert_eq!(
        get_run(&mut runs, &run_id).await.status,
        RunStatus::WaitingForApproval as i32
    );
    assert_eq!(
        fake.seen().len(),
        1,
        "the model waits for every result of its turn"
    );

    grant(&mut runs, &run_id, "call-1").await;
    let events = wait_for_end(&mut runs, &run_id).await;
    let text = completed_text(&events);
    let mut results: Vec<&str> = text.split(" | ").collect();
    results.sort();
    assert_eq!(results.len(), 3, "{text}");
    assert!(
        results[0]
            .starts_with("InvalidArguments: the arguments of wire_money are not a JSON object"),
        "{text}"
    );
    assert_eq!(results[1..], [REFERENCE_TEXT, REFERENCE_TEXT]);
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    let second = messages(&seen[1]);
    let ids: Vec<&Value> = second[2]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["id"])
        .collect();
    assert_eq!(ids, [&json!("call-1"), &json!("call-2"), &json!("call-3")]);
    assert_eq!(
        second[2]["tool_calls"][2]["function"]["arguments"], r#"{"amount": 250, "to": "ACME""#,
        "the model's own text goes back as it was"
    );
    fake.assert_nothing_refused();
    assert_eq!(worker.stop().await.len(), 2);
    server.shutdown().await;
}

/// 5xx, 429 with Retry-After and a malformed answer are retried, each as a
/// numbered attempt that records why the one before failed.
#[tokio::test(flavor = "multi_thread")]
async fn failed_attempts_are_retried_as_numbered_attempts() {
    let fake = FakeOpenAi::start(|n, _| match n {
        0 => Answer::Status(503, vec![], r#"{"error":{"message":"overloaded"}}"#.into()),
        1 => Answer::Status(
            429,
            vec![("retry-after", "1")],
            r#"{"error":{"message":"slow down"}}"#.into(),
        ),
        2 => Answer::Status(200, vec![], "{not a completion".into()),
        _ => text("done", 5, 1),
    })
    .await;
    let models = fake.models(4);
    let server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, openai_run("hello", &[])).await;
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(completed_text(&events), "done");
    let requested = of_type(&events, "aaa.llm.requested");
    let attempts: Vec<&Value> = requested.iter().map(|r| &r["attempt"]).collect();
    assert_eq!(attempts, [&json!(1), &json!(2), &json!(3), &json!(4)]);
    let why: Vec<&Value> = requested
        .iter()
        .map(|r| &r["previous_error"]["type"])
        .collect();
    assert_eq!(
        why,
        [
            &Value::Null,
            &json!("ProviderUnavailable"),
            &json!("RateLimited"),
            &json!("MalformedResponse")
        ]
    );
    assert!(requested[1]["previous_error"]["message"]
        .as_str()
        .unwrap()
        .contains("overloaded"));
    assert_eq!(of_type(&events, "aaa.llm.completed")[0]["attempt"], 4);
    let seen = fake.seen();
    assert_eq!(seen.len(), 4);
    assert!(
        seen[2].at - seen[1].at >= Duration::from_secs(1),
        "Retry-After: 1 was honoured"
    );
    fake.assert_nothing_refused();
    server.shutdown().await;
}

/// A provider that does not answer within `timeout_s`: the attempt ends
/// and the next one is made.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_provider_times_out_and_the_call_is_made_again() {
    let fake = FakeOpenAi::start(|n, _| match n {
        0 => Answer::Hang,
        _ => text("in time", 1, 1),
    })
    .await;
    let models = fake.models_with(3, "timeout_s = 0.3");
    let server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, openai_run("hello", &[])).await;
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(completed_text(&events), "in time");
    let requested = of_type(&events, "aaa.llm.requested");
    assert_eq!(requested[1]["attempt"], 2);
    assert_eq!(requested[1]["previous_error"]["type"], "ProviderTimeout");
    assert_eq!(fake.seen().len(), 2);
    server.shutdown().await;
}

/// What fails for good fails at once, typed: a 4xx with the provider's
/// words, a reply cut at its token limit, a run over its token budget, and
/// a call whose attempts are all spent.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_call_fails_for_good_with_a_typed_error() {
    let fake = FakeOpenAi::start(|_, body| {
        match body["messages"][1]["content"].as_str().unwrap() {
            "bad request" => Answer::Status(400, vec![], r#"{"error":{"message":"Invalid 'messages': too long"}}"#.into()),
            "cut" => Answer::Completion(json!({"model": "m", "choices": [{"message": {"content": "abc"}, "finish_reason": "length"}]})),
            "filtered" => Answer::Completion(json!({"model": "m", "choices": [{"message": {"content": ""}, "finish_reason": "content_filter"}]})),
            "expensive" => tool_calls(&[("wire_money", REFERENCE_ARGS)], 900, 200),
            _ => Answer::Status(500, vec![], "down".into()),
        }
    })
    .await;
    let models = fake.models(2);
    let server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let failure = |task: &'static str, budget: Option<Budget>| {
        let mut runs = runs.clone();
        async move {
            let mut request = openai_run(task, &["wire_money"]);
            request.budget = budget;
            let run_id = start_run(&mut runs, request).await;
            let events = wait_for_end(&mut runs, &run_id).await;
            let run = get_run(&mut runs, &run_id).await;
            assert_eq!(run.status, RunStatus::Failed as i32, "{task}");
            (events, run.error.unwrap())
        }
    };
    let (events, error) = failure("bad request", None).await;
    assert_eq!(error.r#type, "ModelFailed");
    assert_eq!(
        error.message,
        "ProviderRejected: the provider answered 400 Bad Request: Invalid 'messages': too long"
    );
    assert_eq!(
        count(&events, "aaa.llm.requested"),
        1,
        "a 4xx is not retried"
    );
    let (_, error) = failure("cut", None).await;
    assert_eq!(error.r#type, "ModelOutputTruncated");
    let (_, error) = failure("filtered", None).await;
    assert_eq!(error.r#type, "ModelContentFiltered");
    let budget = Budget {
        max_tokens: 1000,
        ..Default::default()
    };
    let (events, error) = failure("expensive", Some(budget)).await;
    assert_eq!(error.r#type, "BudgetExceeded");
    assert_eq!(
        count(&events, "aaa.tool.requested"),
        0,
        "no call of a run over its budget runs"
    );
    let (events, error) = failure("down", None).await;
    assert_eq!(error.r#type, "ModelFailed");
    assert!(
        error.message.starts_with("ProviderUnavailable: "),
        "{}",
        error.message
    );
    assert_eq!(count(&events, "aaa.llm.requested"), 2, "max_attempts = 2");
    fake.assert_nothing_refused();
    server.shutdown().await;
}

/// A run names a provider the server has, or is refused by field.
#[tokio::test(flavor = "multi_thread")]
async fn start_run_checks_the_provider() {
    let fake = FakeOpenAi::start(reference_model).await;
    let models = fake.models(3);
    let server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let mut runs = server.runs().await;
    let mut request = openai_run("x", &[]);
    if let Some(model_spec::Kind::Openai(openai)) =
        request.model.as_mut().and_then(|m| m.kind.as_mut())
    {
        openai.provider = "elsewhere".into();
    }
    let status = expect_err(runs.start_run(request).await);
    let info = assert_error(&status, tonic::Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "model.openai.provider");
    assert!(
        status.message().contains("this server has: fake"),
        "{}",
        status.message()
    );
    let mut request = openai_run("x", &[]);
    if let Some(model_spec::Kind::Openai(openai)) =
        request.model.as_mut().and_then(|m| m.kind.as_mut())
    {
        openai.temperature = Some(7.0);
    }
    let status = expect_err(runs.start_run(request).await);
    let info = assert_error(&status, tonic::Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "model.openai.temperature");
    // The provider and model may be left to the file's defaults.
    let mut request = openai_run("defaults", &[]);
    request.model = Some(ModelSpec {
        kind: Some(model_spec::Kind::Openai(OpenAiModel::default())),
    });
    let run_id = start_run(&mut runs, request).await;
    wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        get_run(&mut runs, &run_id).await.model,
        "openai:fake-model@fake"
    );
    server.shutdown().await;

    // A server without --models refuses the kind, saying how to get it.
    let server = TestServer::start().await;
    let status = expect_err(server.runs().await.start_run(openai_run("x", &[])).await);
    let info = assert_error(&status, tonic::Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "model.openai");
    assert!(
        status.message().contains("--models"),
        "{}",
        status.message()
    );
    server.shutdown().await;
}

/// kill -9 while the provider has the request: the restarted server
/// records the attempt as lost and makes the call again as attempt 2,
/// once. The key is in no event, no file of the data dir and no log line.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_mid_call_retries_it_once_as_the_next_attempt() {
    let mut fake = FakeOpenAi::start(|n, _| match n {
        0 => Answer::Hang,
        _ => text("answered after the restart", 7, 3),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key"), format!("{KEY}\n")).unwrap();
    let models = dir.path().join("models.toml");
    std::fs::write(&models, fake.models_toml("api_key_file = \"key\"", 3)).unwrap();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--models",
        models.to_str().unwrap(),
    ];

    let server = ChildServer::start_args(dir.path(), &args).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, openai_run("hello", &[])).await;
    assert_eq!(fake.next_arrival().await, 0);
    let requested = wait_for_event(&mut runs, &run_id, "aaa.llm.requested").await;
    assert_eq!(data(requested.last().unwrap())["attempt"], 1);
    server.kill9();

    let server = ChildServer::start_args(dir.path(), &args).await;
    let mut runs = server.runs().await;
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        types(&events),
        [
            "aaa.run.started",
            "aaa.llm.requested",
            "aaa.llm.requested",
            "aaa.llm.completed",
            "aaa.run.completed"
        ]
    );
    let requested = of_type(&events, "aaa.llm.requested");
    assert_eq!(requested[1]["attempt"], 2);
    assert_eq!(requested[1]["previous_error"]["type"], "AttemptLost");
    assert_eq!(of_type(&events, "aaa.llm.completed")[0]["attempt"], 2);
    assert_eq!(completed_text(&events), "answered after the restart");
    assert_eq!(fake.seen().len(), 2, "one request per attempt");

    // A provider that quotes a wrong key back: the run's error leaves it out.
    let wrong = dir.path().join("wrong.toml");
    let toml = fake.models_toml("api_key_file = \"wrong-key\"", 3);
    std::fs::write(
        dir.path().join("wrong-key"),
        "sk-wrong-8c1F0e4Q2zzWRONGKEYx9\n",
    )
    .unwrap();
    std::fs::write(&wrong, toml).unwrap();
    server.stop();
    let server = ChildServer::start_args(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--models",
            wrong.to_str().unwrap(),
        ],
    )
    .await;
    let mut runs = server.runs().await;
    let refused_run = start_run(&mut runs, openai_run("hello", &[])).await;
    wait_for_end(&mut runs, &refused_run).await;
    let error = get_run(&mut runs, &refused_run).await.error.unwrap();
    assert!(error.message.contains("401"), "{}", error.message);
    assert!(
        error.message.contains("Incorrect API key provided"),
        "{}",
        error.message
    );
    assert!(!error.message.contains("WRONGKEY"), "{}", error.message);

    // No key anywhere: the events, the data dir, the log.
    for run in [&run_id, &refused_run] {
        for event in history(&mut runs, run).await {
            assert!(!event.data_json.contains(KEY) && !event.data_json.contains("WRONGKEY"));
        }
    }
    server.stop();
    let mut files = vec![dir.path().join("server.log")];
    let mut dirs = vec![dir.path().join("data")];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path)
            } else {
                files.push(path)
            }
        }
    }
    if !on_postgres() {
        assert!(files.len() > 1, "the data dir has files: {files:?}");
    }
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        for secret in [KEY.as_bytes(), b"WRONGKEY"] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret),
                "{} holds a key",
                file.display()
            );
        }
    }
}

/// A graceful stop while the provider has the request: the server stops
/// without waiting for it, and the call goes on as attempt 2 after it
/// comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_restart_mid_call_goes_on_as_the_next_attempt() {
    let mut fake = FakeOpenAi::start(|n, _| match n {
        0 => Answer::Hang,
        _ => text("answered", 1, 1),
    })
    .await;
    let models = fake.models(3);
    let mut server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let run_id = start_run(&mut server.runs().await, openai_run("hello", &[])).await;
    assert_eq!(fake.next_arrival().await, 0);
    server.restart().await;
    let events = wait_for_end(&mut server.runs().await, &run_id).await;
    let requested = of_type(&events, "aaa.llm.requested");
    assert_eq!(requested.len(), 2);
    assert_eq!(requested[1]["attempt"], 2);
    assert_eq!(requested[1]["previous_error"]["type"], "AttemptLost");
    assert_eq!(completed_text(&events), "answered");
    assert_eq!(fake.seen().len(), 2);
    server.shutdown().await;
}

/// `aaa runs start --model openai:MODEL@PROVIDER`, and the run's tokens in
/// `aaa runs show`.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_starts_a_run_on_the_built_in_model() {
    let fake = FakeOpenAi::start(reference_model).await;
    let models = fake.models(3);
    let server = TestServer::start_with(move |c| c.models = Some(models.clone())).await;
    let cli = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_aaa"))
            .args(args)
            .env("AAA_SERVER", format!("http://{}", server.addr()))
            .env_remove("AAA_TOKEN")
            .output()
            .expect("run aaa");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "aaa {args:?}: {stderr}");
        String::from_utf8(output.stdout).unwrap()
    };
    let run_id = tokio::task::block_in_place(|| {
        cli(&[
            "runs",
            "start",
            "Pay ACME $250",
            "--model",
            "openai:fake-model@fake",
            "--max-tokens",
            "100000",
        ])
    });
    let run_id = run_id.trim();
    let events = wait_for_end(&mut server.runs().await, run_id).await;
    let started = data(find(&events, "aaa.run.started"));
    assert_eq!(started["model"]["openai"]["model"], "fake-model");
    assert_eq!(started["budget"]["max_tokens"], 100000);
    let shown = tokio::task::block_in_place(|| cli(&["runs", "show", run_id, "--json"]));
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["model"], "openai:fake-model@fake");
    assert_eq!(
        shown["usage"],
        json!({"prompt_tokens": 50, "completion_tokens": 15, "total_tokens": 65})
    );
    let text = tokio::task::block_in_place(|| cli(&["runs", "show", run_id]));
    assert!(
        text.contains("tokens    65 (50 prompt, 15 completion)"),
        "{text}"
    );
    server.shutdown().await;
}
