//! The spans of a run, made from its events as they commit (see
//! [`crate::otel`]): each event that ends something (a model call, a tool
//! attempt, an approval's wait, the run) is looked at with the run's state
//! from just before it, and gives the span of what it ended. The spans are
//! handed to the tracer once their batch is durable.
//!
//! Names and attributes follow OpenTelemetry's GenAI conventions where
//! they have one (`gen_ai.*`); the approval's are aaa's own (`aaa.*`).

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use serde::Deserialize;

use super::state::{Phase, RunState};
use crate::domain::event::*;
use crate::otel::{context, TraceContext, Tracer};
use crate::store::EventRecord;

impl RunState {
    /// The trace the run's spans belong to.
    pub fn trace(&self) -> TraceContext {
        self.spec
            .traceparent
            .as_deref()
            .and_then(|text| TraceContext::parse(text).ok())
            .unwrap_or_else(|| TraceContext::of_run(self.id))
    }
}

/// The span `event` ends, if any, given the run just before it.
pub(super) fn span(tracer: &Tracer, state: &RunState, event: &EventRecord) -> Option<SpanData> {
    let trace = state.trace();
    if !tracer.samples(&trace) {
        return None;
    }
    let run = state.id;
    let parent = Some(context::run_span(run));
    let made = match event.event_type.as_str() {
        RUN_COMPLETED | RUN_FAILED | RUN_CANCELLED => {
            let status = match event.event_type.as_str() {
                RUN_COMPLETED => "completed",
                RUN_FAILED => "failed",
                _ => "cancelled",
            };
            let mut attributes = vec![
                KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                KeyValue::new("gen_ai.agent.id", run.to_string()),
                KeyValue::new("gen_ai.request.model", state.spec.model.name()),
                KeyValue::new("aaa.run.status", status),
            ];
            if state.usage.total() > 0 {
                attributes.extend(usage(
                    state.usage.prompt_tokens,
                    state.usage.completion_tokens,
                ));
            }
            Made {
                name: "invoke_agent".into(),
                id: context::run_span(run),
                parent: trace.parent,
                kind: SpanKind::Server,
                start_ms: state.created_ms,
                attributes,
                error: (status != "completed").then(|| status.to_string()),
            }
        }
        LLM_COMPLETED | LLM_FAILED => {
            let pending = state.model_call.as_ref()?;
            let model = state.spec.model.name();
            let mut attributes = vec![
                KeyValue::new("gen_ai.operation.name", "chat"),
                KeyValue::new("gen_ai.request.model", model.clone()),
                KeyValue::new("aaa.call_id", pending.call_id.clone()),
                KeyValue::new("aaa.attempt", i64::from(pending.attempt)),
            ];
            let mut error = None;
            if event.event_type == LLM_COMPLETED {
                let done: ModelDone = serde_json::from_str(&event.data_json).ok()?;
                if let Some(used) = done.usage {
                    attributes.extend(usage(used.prompt_tokens, used.completion_tokens));
                }
                if !done.model.is_empty() {
                    attributes.push(KeyValue::new("gen_ai.response.model", done.model));
                }
            } else {
                error = Some(failure_type(event));
            }
            Made {
                name: format!("chat {model}").into(),
                id: context::chat_span(run, &pending.call_id),
                parent,
                kind: SpanKind::Client,
                start_ms: pending.requested_ms,
                attributes,
                error,
            }
        }
        TOOL_COMPLETED | TOOL_RETRYING | TOOL_FAILED => {
            let facts: CallFacts = serde_json::from_str(&event.data_json).ok()?;
            let call = state.call(&facts.call_id)?;
            if call.phase != Phase::Running {
                return None;
            }
            let attributes = vec![
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", call.name.clone()),
                KeyValue::new("gen_ai.tool.call.id", call.answers.clone()),
                KeyValue::new("aaa.call_id", call.call_id.clone()),
                KeyValue::new("aaa.attempt", i64::from(call.attempt)),
                KeyValue::new("aaa.worker", call.worker.clone()),
            ];
            Made {
                name: format!("execute_tool {}", call.name).into(),
                id: context::attempt_span(run, &call.call_id, call.attempt),
                parent,
                kind: SpanKind::Internal,
                start_ms: call.started_ms,
                attributes,
                error: (event.event_type != TOOL_COMPLETED).then(|| failure_type(event)),
            }
        }
        APPROVAL_GRANTED | APPROVAL_DENIED | APPROVAL_EXPIRED | APPROVAL_EDITED => {
            let facts: DecisionFacts = serde_json::from_str(&event.data_json).ok()?;
            let call = state.call(&facts.call_id)?;
            let waited = call.approval_seq > 0 && call.decision.is_none();
            let decision = match event.event_type.as_str() {
                APPROVAL_GRANTED => "granted",
                APPROVAL_DENIED if event.actor_kind == 1 => "expired",
                APPROVAL_DENIED => "denied",
                APPROVAL_EXPIRED => "expired",
                _ => "edited",
            };
            // The name the decision gives (with auth on the engine allows
            // only the caller's own), else who the actor is.
            let approver = match (facts.approver, event.actor_principal.as_str()) {
                (Some(name), _) => name,
                (None, "") => event.actor_name.clone(),
                (None, principal) => principal.to_string(),
            };
            let digest = facts
                .arguments_sha256
                .unwrap_or_else(|| sha256_hex(&call.arguments));
            let mut attributes = vec![
                KeyValue::new("gen_ai.tool.name", call.name.clone()),
                KeyValue::new("gen_ai.tool.call.id", call.answers.clone()),
                KeyValue::new("aaa.call_id", call.call_id.clone()),
                KeyValue::new("aaa.approval.decision", decision),
                KeyValue::new(
                    "aaa.approval.actor_kind",
                    super::observed::actor_kind(event.actor_kind),
                ),
                KeyValue::new("aaa.approval.approver", approver),
                KeyValue::new("aaa.approval.arguments_sha256", digest),
                KeyValue::new("aaa.approval.waited", waited),
            ];
            if !facts.approvers.is_empty() {
                let approvers: Vec<opentelemetry::StringValue> =
                    facts.approvers.into_iter().map(Into::into).collect();
                attributes.push(KeyValue::new(
                    "aaa.approval.approvers",
                    opentelemetry::Value::Array(approvers.into()),
                ));
            }
            if let Some(policy) = facts.policy {
                attributes.push(KeyValue::new("aaa.approval.rule", policy.rule));
            }
            if let Some(grant) = facts.grant {
                attributes.push(KeyValue::new("aaa.approval.grant", grant.id));
            }
            Made {
                name: format!("aaa.approval {}", call.name).into(),
                id: context::approval_span(run, &call.call_id),
                parent,
                kind: SpanKind::Internal,
                start_ms: if waited {
                    call.requested_ms
                } else {
                    event.time_ms
                },
                attributes,
                error: None,
            }
        }
        _ => return None,
    };
    Some(made.into_span(tracer, &trace, event.time_ms))
}

/// A span's own parts; the rest is the run's.
struct Made {
    name: Cow<'static, str>,
    id: [u8; 8],
    parent: Option<[u8; 8]>,
    kind: SpanKind,
    start_ms: i64,
    attributes: Vec<KeyValue>,
    /// The error type of a span that ended in failure.
    error: Option<String>,
}

impl Made {
    fn into_span(self, tracer: &Tracer, trace: &TraceContext, end_ms: i64) -> SpanData {
        let mut attributes = self.attributes;
        let status = match self.error {
            Some(error) => {
                attributes.push(KeyValue::new("error.type", error.clone()));
                Status::error(error)
            }
            None => Status::Unset,
        };
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(trace.trace_id),
                SpanId::from_bytes(self.id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: self.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
            parent_span_is_remote: self.parent.is_some() && self.parent == trace.parent,
            span_kind: self.kind,
            name: self.name,
            start_time: time(self.start_ms.min(end_ms)),
            end_time: time(end_ms),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: tracer.scope().clone(),
        }
    }
}

fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

fn usage(input: u64, output: u64) -> [KeyValue; 2] {
    [
        KeyValue::new("gen_ai.usage.input_tokens", input as i64),
        KeyValue::new("gen_ai.usage.output_tokens", output as i64),
    ]
}

/// The error type a failure event names (`ToolError`, `AttemptLost`...).
fn failure_type(event: &EventRecord) -> String {
    #[derive(Deserialize)]
    struct Failed {
        error: ErrorData,
    }
    serde_json::from_str::<Failed>(&event.data_json)
        .map(|f| f.error.error_type)
        .unwrap_or_else(|_| "error".to_string())
}

#[derive(Deserialize)]
struct CallFacts {
    call_id: String,
}

#[derive(Deserialize)]
struct ModelDone {
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    model: String,
}

/// What any decision event says about who decided what.
#[derive(Deserialize)]
struct DecisionFacts {
    call_id: String,
    #[serde(default)]
    arguments_sha256: Option<String>,
    #[serde(default)]
    approver: Option<String>,
    #[serde(default)]
    approvers: Vec<String>,
    #[serde(default)]
    policy: Option<PolicyStamp>,
    #[serde(default)]
    grant: Option<GrantStamp>,
}
