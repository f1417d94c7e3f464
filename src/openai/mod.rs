//! The built-in OpenAI-compatible model. It is an in-process consumer of
//! the engine's model tasks, like a worker that lives in the server: it
//! takes the runs' model calls from their own queue, holds each attempt's
//! lease while the HTTP request is out, and reports the reply or the
//! failure through the engine. So attempts, leases, retries and recovery
//! after a restart are the engine's, as for any worker; keys stay in the
//! server's `--models` file and never reach the log.

pub mod chat;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use tokio::sync::Semaphore;

pub use crate::providers::{ModelsConfig, Provider, RetryPolicy, Secret};

use crate::domain::event::{canonical_json, ErrorData, ModelChoice, WorkerId};
use crate::engine::{Engine, Error, QueueKey, Report, Task, Work};
use chat::Outcome;

/// The lease holder's name in the engine (never in events: the built-in
/// model's events are the engine's).
const IDENTITY: &str = "aaa.builtin-model";
/// How long one poll of the queue waits before polling again.
const POLL_WAIT: Duration = Duration::from_secs(30);
/// Largest answer read from a provider.
const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// Replies larger than this (content and arguments) cannot be recorded as
/// one event; they fail the call rather than wedge it.
const MAX_REPLY_BYTES: usize = crate::engine::MAX_EVENT_BYTES - 8 * 1024;

use crate::https::HttpsClient;

/// What every call shares.
struct Ctx {
    engine: Engine,
    models: Option<Arc<ModelsConfig>>,
    /// Built only with a models file: without one no call gets as far as
    /// a request, and a server need not read the system's roots at start.
    client: Option<HttpsClient>,
    /// Requests in flight per provider.
    limits: HashMap<String, Arc<Semaphore>>,
}

/// Starts taking the built-in model's calls until the engine stops. Runs
/// whatever the config: a run whose provider is gone from the file fails
/// with ProviderNotConfigured rather than wait forever. The task ends, its
/// calls with it, soon after the engine's shutdown token fires; it is one
/// of the engine's background tasks ([`Engine::stopped`] awaits it).
pub fn start(engine: Engine, models: Option<Arc<ModelsConfig>>) -> Result<(), String> {
    let limits = models
        .iter()
        .flat_map(|m| m.providers.iter())
        .map(|p| (p.name.clone(), Arc::new(Semaphore::new(p.max_concurrent))))
        .collect();
    let client = match models {
        Some(_) => Some(crate::https::client(None)?),
        None => None,
    };
    let ctx = Arc::new(Ctx {
        engine: engine.clone(),
        models,
        client,
        limits,
    });
    engine.spawn_background(consume(ctx));
    Ok(())
}

/// Takes model calls and serves each in a task of its own; on shutdown,
/// waits for those tasks (they stop at once) so that no engine handle
/// outlives the server.
async fn consume(ctx: Arc<Ctx>) {
    let mut calls = tokio::task::JoinSet::new();
    take_calls(&ctx, &mut calls).await;
    while calls.join_next().await.is_some() {}
}

async fn take_calls(ctx: &Arc<Ctx>, calls: &mut tokio::task::JoinSet<()>) {
    let worker = WorkerId::from(IDENTITY);
    let queue = [QueueKey::BuiltinModel];
    loop {
        while calls.try_join_next().is_some() {}
        match ctx.engine.poll_task(&worker, &queue, POLL_WAIT).await {
            Ok(Some(task)) => {
                calls.spawn(serve(ctx.clone(), task));
            }
            Ok(None) if ctx.engine.shutdown_token().is_cancelled() => return,
            Ok(None) => {}
            Err(Error::ShuttingDown) => return,
            Err(e) => {
                tracing::error!("built-in model: taking a model call failed: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = ctx.engine.shutdown_token().cancelled() => return,
                }
            }
        }
    }
}

/// One attempt: the request while its lease is kept, the wait a retry asks
/// for, then the report. When the run stops wanting it (finished,
/// cancelled, the attempt superseded) or the server stops, the request is
/// dropped and nothing is reported: a restart records the attempt as lost.
async fn serve(ctx: Arc<Ctx>, task: Task) {
    let report = tokio::select! {
        report = attempt(&ctx, &task) => report,
        _ = keep_leased(&ctx.engine, &task) => return,
        _ = ctx.engine.shutdown_token().cancelled() => return,
    };
    match ctx.engine.report_builtin(&task.token, report).await {
        Ok(()) | Err(Error::StaleAttempt { .. } | Error::RunFinished(_) | Error::ShuttingDown) => {}
        // Unrecorded, the attempt's lease runs out and the engine retries it.
        Err(e) => {
            tracing::error!(run = %task.run, call = %task.call_id, "built-in model: recording attempt {} failed: {e}", task.attempt)
        }
    }
}

/// Heartbeats the attempt's lease; returns when the run no longer wants it.
async fn keep_leased(engine: &Engine, task: &Task) {
    let every = (task.heartbeat_timeout / 3).max(Duration::from_millis(50));
    loop {
        tokio::time::sleep(every).await;
        match engine.heartbeat(&task.token, "").await {
            Ok(false) => {}
            Ok(true) | Err(_) => return,
        }
    }
}

/// The HTTP request of this attempt and, when it is to be retried, the
/// backoff before the next one (this attempt stays leased meanwhile).
async fn attempt(ctx: &Ctx, task: &Task) -> Report {
    let Work::Model {
        messages,
        tools,
        spec: ModelChoice::Openai(choice),
        ..
    } = &task.work
    else {
        return fail("NotABuiltinModel", "this call is not the built-in model's");
    };
    let provider = match ctx.models.as_deref().map(|m| m.provider(&choice.provider)) {
        Some(Ok(provider)) => provider,
        _ => {
            return fail(
                "ProviderNotConfigured",
                &format!(
                    "provider '{}' is not in this server's --models file",
                    choice.provider
                ),
            )
        }
    };
    let body = chat::request_body(choice, messages, tools);
    let client = ctx
        .client
        .as_ref()
        .expect("a provider comes from a models file, and the client with it");
    let outcome = match ctx.limits.get(&provider.name) {
        Some(limit) => {
            let _permit = limit.acquire().await;
            request(client, provider, &body).await
        }
        None => request(client, provider, &body).await,
    };
    match outcome {
        (
            Outcome::Reply {
                content,
                calls,
                mut facts,
            },
            latency,
        ) => {
            let size = content.len()
                + calls
                    .iter()
                    .map(|c| c.name.len() + canonical_json(&c.arguments).len())
                    .sum::<usize>();
            if size > MAX_REPLY_BYTES {
                return fail(
                    "ModelReplyTooLarge",
                    &format!(
                        "the reply has {size} bytes, more than the {MAX_REPLY_BYTES} a run records"
                    ),
                );
            }
            facts.attempt = Some(task.attempt);
            facts.latency_ms = Some(latency.as_millis() as u64);
            Report::ModelReply {
                content,
                calls,
                facts,
            }
        }
        (Outcome::Retry { error, retry_after }, _) => {
            if task.attempt < choice.max_attempts {
                tokio::time::sleep(provider.retry.delay(task.attempt, retry_after)).await;
            }
            Report::Failure {
                error,
                retryable: true,
            }
        }
        (Outcome::Fail(error), _) => Report::Failure {
            error,
            retryable: false,
        },
    }
}

fn fail(error_type: &str, message: &str) -> Report {
    Report::Failure {
        error: ErrorData::new(error_type, message),
        retryable: false,
    }
}

/// POSTs the body to the provider's chat completions; the outcome and the
/// time the answer took.
async fn request(
    client: &HttpsClient,
    provider: &Provider,
    body: &serde_json::Value,
) -> (Outcome, Duration) {
    let secret = provider.api_key.as_ref().map(Secret::expose);
    let started = Instant::now();
    let retry = |error_type: &str, message: String| Outcome::Retry {
        error: ErrorData::new(error_type, chat::redact(&message, secret)),
        retry_after: None,
    };
    let request = match build(provider, body) {
        Ok(request) => request,
        Err(e) => {
            return (
                Outcome::Fail(ErrorData::new("ProviderRejected", e)),
                started.elapsed(),
            )
        }
    };
    let exchange = async {
        let response = client.request(request).await.map_err(|e| {
            // The cause (refused, reset, DNS...) is in the source chain.
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            message
        })?;
        let status = response.status();
        let wait = chat::retry_after(response.headers());
        let bytes = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok::<_, String>((status, wait, bytes))
    };
    let outcome = match tokio::time::timeout(provider.timeout, exchange).await {
        Err(_) => retry(
            "ProviderTimeout",
            format!(
                "provider '{}' did not answer within {:?}",
                provider.name, provider.timeout
            ),
        ),
        Ok(Err(e)) => retry(
            "ProviderUnreachable",
            format!("provider '{}': {e}", provider.name),
        ),
        Ok(Ok((status, wait, bytes))) => chat::outcome(status, wait, &bytes, secret),
    };
    (outcome, started.elapsed())
}

fn build(
    provider: &Provider,
    body: &serde_json::Value,
) -> Result<http::Request<Full<Bytes>>, String> {
    let mut request = http::Request::post(format!("{}/chat/completions", provider.base_url))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json");
    for (name, value) in &provider.headers {
        request = request.header(name, value);
    }
    if let Some(key) = &provider.api_key {
        let (name, value) = match &provider.api_key_header {
            Some(name) => (name.clone(), key.expose().to_string()),
            None => (
                http::header::AUTHORIZATION,
                format!("Bearer {}", key.expose()),
            ),
        };
        let mut value = http::HeaderValue::from_str(&value)
            .map_err(|_| "the API key is not valid in a header".to_string())?;
        value.set_sensitive(true);
        request = request.header(name, value);
    }
    let body = serde_json::to_vec(body).expect("JSON values serialize");
    request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad request: {e}"))
}
