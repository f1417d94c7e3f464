//! The in-process worker of the exposed tools, like the built-in model is
//! an in-process consumer of model tasks: it takes the tools' tasks from
//! the engine, holds each attempt's lease while the upstream works, calls
//! the upstream tool once per attempt with exactly the task's arguments
//! (the approved ones, an approver's edit included), and reports what came
//! back. Attempts, leases, retries and recovery are the engine's: a gated
//! tool has one attempt unless its file entry says otherwise.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::CallToolResult;
use serde_json::{json, Value};

use super::Gateway;
use crate::domain::event::{ErrorData, WorkerId};
use crate::engine::{Engine, Error, QueueKey, Report, Task, Work};

/// How long one poll of the queues waits before polling again.
const POLL_WAIT: Duration = Duration::from_secs(30);
/// Outputs larger than this cannot be recorded as one event; they fail
/// the call rather than wedge it.
const MAX_OUTPUT_BYTES: usize = crate::engine::MAX_EVENT_BYTES - 8 * 1024;

/// The worker as the engine knows it (no principal: the server's own).
pub fn identity() -> WorkerId {
    WorkerId::from(super::IDENTITY)
}

/// Takes the exposed tools' tasks until the engine stops, each served in a
/// task of its own; on shutdown waits for them (they stop at once).
pub async fn serve_tools(gateway: Arc<Gateway>, engine: Engine) {
    let worker = identity();
    let queues: Vec<QueueKey> = gateway
        .tools()
        .map(|t| QueueKey::Tool(t.spec.name.clone()))
        .collect();
    let mut calls = tokio::task::JoinSet::new();
    loop {
        while calls.try_join_next().is_some() {}
        match engine.poll_task(&worker, &queues, POLL_WAIT).await {
            Ok(Some(task)) => {
                calls.spawn(serve(gateway.clone(), engine.clone(), task));
            }
            Ok(None) if engine.shutdown_token().is_cancelled() => break,
            Ok(None) => {}
            Err(Error::ShuttingDown) => break,
            Err(e) => {
                tracing::error!("mcp: taking a tool task failed: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = engine.shutdown_token().cancelled() => break,
                }
            }
        }
    }
    while calls.join_next().await.is_some() {}
}

/// One attempt: the upstream call while the lease is kept, then the
/// report. When the run stops wanting it or the server stops, the call is
/// dropped and nothing is reported: a restart records the attempt as lost.
async fn serve(gateway: Arc<Gateway>, engine: Engine, task: Task) {
    let report = tokio::select! {
        report = attempt(&gateway, &task) => report,
        _ = keep_leased(&engine, &task) => return,
        _ = engine.shutdown_token().cancelled() => return,
    };
    match engine.report(&task.token, report, &identity()).await {
        Ok(_) | Err(Error::StaleAttempt { .. } | Error::RunFinished(_) | Error::ShuttingDown) => {}
        Err(e) => {
            tracing::error!(run = %task.run, call = %task.call_id, "mcp: recording attempt {} failed: {e}", task.attempt)
        }
    }
}

/// Heartbeats the attempt's lease; returns when the run no longer wants it.
pub async fn keep_leased(engine: &Engine, task: &Task) {
    let every = (task.heartbeat_timeout / 3).max(Duration::from_millis(50));
    loop {
        tokio::time::sleep(every).await;
        match engine.heartbeat(&task.token, "").await {
            Ok(false) => {}
            Ok(true) | Err(_) => return,
        }
    }
}

/// Calls the upstream tool and says what the run records.
async fn attempt(gateway: &Gateway, task: &Task) -> Report {
    let Work::Tool { name, arguments } = &task.work else {
        return failure("NotAnMcpTool", "this task is not a tool call", false);
    };
    let Some(exposed) = gateway.tool(name) else {
        return failure(
            "ToolNotConfigured",
            &format!("tool '{name}' is not in this server's --mcp file"),
            false,
        );
    };
    // The idempotency hint: an upstream that keeps keys can tell a call
    // sent again (a lost answer, a new attempt) from a new call.
    let meta = json!({
        "aaa/run_id": task.run.to_string(),
        "aaa/call_id": task.call_id,
        "aaa/attempt": task.attempt,
        "aaa/idempotency_key": format!("{}/{}", task.run, task.call_id),
        "traceparent": task.traceparent,
    });
    let Value::Object(meta) = meta else {
        unreachable!("an object")
    };
    let called = exposed
        .connection
        .call(&exposed.upstream_name, arguments, meta)
        .await;
    match called {
        Ok(result) => outcome(result),
        // A gated call is not sent twice unless its tool allows more
        // attempts; an ungated one follows its retry policy.
        Err(unreachable) => failure(
            "UpstreamUnavailable",
            &format!(
                "upstream '{}': {}",
                exposed.connection.upstream.name, unreachable.0
            ),
            true,
        ),
    }
}

/// An upstream's answer as the run records it: the result object itself
/// (content, structuredContent), or for `isError` a failure whose message
/// is the result's text.
fn outcome(result: CallToolResult) -> Report {
    if result.is_error == Some(true) {
        return failure("ToolError", &text_of(&result), false);
    }
    let mut output = serde_json::to_value(&result).expect("a result serializes");
    if let Value::Object(map) = &mut output {
        // Protocol bookkeeping, not the tool's answer.
        map.remove("resultType");
    }
    let size = crate::domain::event::canonical_json(&output).len();
    if size > MAX_OUTPUT_BYTES {
        return failure(
            "ToolOutputTooLarge",
            &format!("the result has {size} bytes, more than the {MAX_OUTPUT_BYTES} a run records"),
            false,
        );
    }
    Report::ToolOutput(output)
}

/// The text blocks of a result, one per line.
pub fn text_of(result: &CallToolResult) -> String {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    match texts.is_empty() {
        true => "the tool reported an error".into(),
        false => texts.join("\n"),
    }
}

fn failure(error_type: &str, message: &str, retryable: bool) -> Report {
    Report::Failure {
        error: ErrorData::new(error_type, crate::domain::clip::prefix(message, 8 * 1024)),
        retryable,
    }
}
