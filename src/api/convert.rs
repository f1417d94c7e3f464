//! Wire types <-> engine and store types, with the validation of client
//! input: every refusal names the field it is about.

use serde_json::Value;

use crate::engine::event::{
    Budget, ErrorData, ModelChoice, ProposedCall, RetrySpec, ScriptStep, ToolSpec,
};
use crate::engine::state::Message;
use crate::engine::{self, Error, MAX_EVENT_BYTES};
use crate::proto;
use crate::store::{ApprovalRecord, EventRecord, RunId, RunRecord};

/// Longest name (tool, model, event type, label key, request id).
const MAX_NAME_BYTES: usize = 256;
const DEFAULT_MAX_MODEL_CALLS: u32 = 50;

pub fn timestamp(ms: i64) -> Option<prost_types::Timestamp> {
    (ms > 0).then(|| prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    })
}

pub fn run_id(field: &str, text: &str) -> Result<RunId, Error> {
    if text.is_empty() {
        return Err(Error::invalid(field, "required"));
    }
    RunId::parse(text).ok_or_else(|| Error::RunNotFound(text.to_string()))
}

fn run_id_text(bytes: &[u8]) -> String {
    RunId::from_slice(bytes).map_or_else(String::new, |id| id.to_string())
}

fn check_size(field: &str, text: &str, limit: usize) -> Result<(), Error> {
    if text.len() > limit {
        return Err(Error::PayloadTooLarge {
            field: field.to_string(),
            size: text.len(),
            limit,
        });
    }
    Ok(())
}

/// A name: non-empty, at most 256 bytes, letters, digits and `_-.:/`.
pub fn name(field: &str, text: &str) -> Result<(), Error> {
    if text.is_empty() {
        return Err(Error::invalid(field, "required"));
    }
    check_size(field, text, MAX_NAME_BYTES)?;
    if let Some(bad) = text
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.:/".contains(*c)))
    {
        return Err(Error::invalid(
            field,
            format!("'{text}' contains '{bad}'; use letters, digits and _ - . : /"),
        ));
    }
    Ok(())
}

/// Any JSON value, as text.
pub fn json_value(field: &str, text: &str) -> Result<Value, Error> {
    check_size(field, text, MAX_EVENT_BYTES)?;
    serde_json::from_str(text).map_err(|e| Error::invalid(field, format!("not valid JSON: {e}")))
}

/// A JSON object as text; empty text means {}.
pub fn json_object(field: &str, text: &str) -> Result<Value, Error> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    let value = json_value(field, text)?;
    if !value.is_object() {
        return Err(Error::invalid(field, "must be a JSON object"));
    }
    Ok(value)
}

fn finite_non_negative(field: &str, value: f64) -> Result<f64, Error> {
    if !value.is_finite() || value < 0.0 {
        return Err(Error::invalid(
            field,
            format!("{value} is not a number of seconds >= 0"),
        ));
    }
    Ok(value)
}

pub fn start_run(request: proto::StartRunRequest) -> Result<engine::StartRun, Error> {
    if request.task.is_empty() {
        return Err(Error::invalid("task", "required"));
    }
    check_size("task", &request.task, MAX_EVENT_BYTES / 2)?;
    check_size("system", &request.system, MAX_EVENT_BYTES / 4)?;
    let model = match request.model.and_then(|m| m.kind) {
        None => {
            return Err(Error::invalid(
                "model",
                "required: set model.worker (a worker-served model) or model.scripted",
            ))
        }
        Some(proto::model_spec::Kind::Worker(model)) => {
            name("model.worker", &model)?;
            ModelChoice::Worker(model)
        }
        Some(proto::model_spec::Kind::Scripted(script)) => {
            ModelChoice::Scripted(script_steps(script.steps)?)
        }
    };
    let tools = request
        .tools
        .into_iter()
        .enumerate()
        .map(|(i, tool)| {
            name(&format!("tools[{i}].name"), &tool.name)?;
            Ok(engine::ToolRef {
                name: tool.name,
                requires_approval: tool.requires_approval,
                approval_timeout_s: finite_non_negative(
                    &format!("tools[{i}].approval_timeout_s"),
                    tool.approval_timeout_s,
                )?,
            })
        })
        .collect::<Result<_, Error>>()?;
    let budget = request.budget.unwrap_or_default();
    let budget = Budget {
        deadline_s: finite_non_negative("budget.deadline_s", budget.deadline_s)?,
        max_model_calls: match budget.max_model_calls {
            0 => DEFAULT_MAX_MODEL_CALLS,
            n => n,
        },
    };
    for (key, value) in &request.labels {
        name("labels", key)?;
        check_size(&format!("labels[{key}]"), value, MAX_NAME_BYTES)?;
    }
    check_size("request_id", &request.request_id, MAX_NAME_BYTES)?;
    Ok(engine::StartRun {
        task: request.task,
        system: request.system,
        model,
        tools,
        budget,
        labels: request.labels.into_iter().collect(),
        request_id: request.request_id,
    })
}

fn script_steps(steps: Vec<proto::ScriptedStep>) -> Result<Vec<ScriptStep>, Error> {
    use proto::scripted_step::Reply;
    if steps.is_empty() {
        return Err(Error::invalid(
            "model.scripted.steps",
            "needs at least one step",
        ));
    }
    steps
        .into_iter()
        .enumerate()
        .map(|(i, step)| {
            let field = format!("model.scripted.steps[{i}]");
            Ok(match step.reply {
                None => return Err(Error::invalid(&field, "set one of text, tool_calls, echo")),
                Some(Reply::Text(text)) => ScriptStep::Text(text),
                Some(Reply::Echo(())) => ScriptStep::Echo,
                Some(Reply::ToolCalls(calls)) => {
                    if calls.calls.is_empty() {
                        return Err(Error::invalid(
                            &format!("{field}.tool_calls.calls"),
                            "needs at least one call",
                        ));
                    }
                    let calls = calls
                        .calls
                        .into_iter()
                        .enumerate()
                        .map(|(j, call)| {
                            let field = format!("{field}.tool_calls.calls[{j}]");
                            proposed_call(&field, call.name, &call.arguments_json)
                        })
                        .collect::<Result<_, Error>>()?;
                    ScriptStep::ToolCalls(calls)
                }
            })
        })
        .collect()
}

fn proposed_call(field: &str, tool: String, arguments_json: &str) -> Result<ProposedCall, Error> {
    name(&format!("{field}.name"), &tool)?;
    let arguments = json_object(&format!("{field}.arguments_json"), arguments_json)?;
    Ok(ProposedCall {
        name: tool,
        arguments,
    })
}

pub fn model_reply(reply: proto::ModelReply) -> Result<engine::Report, Error> {
    check_size("reply.content", &reply.content, MAX_EVENT_BYTES / 2)?;
    let calls = reply
        .tool_calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| {
            proposed_call(
                &format!("reply.tool_calls[{i}]"),
                call.name,
                &call.arguments_json,
            )
        })
        .collect::<Result<_, Error>>()?;
    Ok(engine::Report::ModelReply {
        content: reply.content,
        calls,
    })
}

pub fn tool_definition(i: usize, tool: proto::ToolDefinition) -> Result<ToolSpec, Error> {
    let field = |f: &str| format!("tools[{i}].{f}");
    name(&field("name"), &tool.name)?;
    check_size(&field("description"), &tool.description, 8 * 1024)?;
    check_size(&field("parameters_json"), &tool.parameters_json, 16 * 1024)?;
    let parameters = json_object(&field("parameters_json"), &tool.parameters_json)?;
    let retry = tool.retry.unwrap_or_default();
    let default_attempts = if tool.requires_approval { 1 } else { 3 };
    let or = |value: f64, f: &str, default: f64| -> Result<f64, Error> {
        let value = finite_non_negative(&field(f), value)?;
        Ok(if value == 0.0 { default } else { value })
    };
    Ok(ToolSpec {
        name: tool.name.clone(),
        description: tool.description.clone(),
        parameters,
        requires_approval: tool.requires_approval,
        retry: RetrySpec {
            max_attempts: match retry.max_attempts {
                0 => default_attempts,
                n => n,
            },
            initial_backoff_s: or(retry.initial_backoff_s, "retry.initial_backoff_s", 1.0)?,
            backoff_coefficient: or(retry.backoff_coefficient, "retry.backoff_coefficient", 2.0)?,
            max_backoff_s: or(retry.max_backoff_s, "retry.max_backoff_s", 60.0)?,
        },
        heartbeat_timeout_s: finite_non_negative(
            &field("heartbeat_timeout_s"),
            tool.heartbeat_timeout_s,
        )?,
        approval_timeout_s: finite_non_negative(
            &field("approval_timeout_s"),
            tool.approval_timeout_s,
        )?,
    })
}

pub fn tool_definition_out(spec: &ToolSpec) -> proto::ToolDefinition {
    proto::ToolDefinition {
        name: spec.name.clone(),
        description: spec.description.clone(),
        parameters_json: crate::engine::event::canonical_json(&spec.parameters),
        requires_approval: spec.requires_approval,
        retry: Some(proto::RetryPolicy {
            max_attempts: spec.retry.max_attempts,
            initial_backoff_s: spec.retry.initial_backoff_s,
            backoff_coefficient: spec.retry.backoff_coefficient,
            max_backoff_s: spec.retry.max_backoff_s,
        }),
        heartbeat_timeout_s: spec.heartbeat_timeout_s,
        approval_timeout_s: spec.approval_timeout_s,
    }
}

pub fn error_detail(error: Option<proto::ErrorDetail>) -> Result<ErrorData, Error> {
    let error = error.unwrap_or_default();
    check_size("error.message", &error.message, MAX_EVENT_BYTES / 2)?;
    check_size("error.type", &error.r#type, MAX_NAME_BYTES)?;
    let error_type = if error.r#type.is_empty() {
        "Error".to_string()
    } else {
        error.r#type
    };
    Ok(ErrorData {
        error_type,
        message: error.message,
    })
}

pub fn event(record: EventRecord) -> proto::Event {
    proto::Event {
        run_id: run_id_text(&record.run_id),
        seq: record.seq,
        position: record.position,
        id: uuid::Uuid::from_slice(&record.id)
            .map(|id| id.to_string())
            .unwrap_or_default(),
        r#type: record.event_type,
        data_json: record.data_json,
        time: timestamp(record.time_ms),
        actor: Some(proto::Actor {
            kind: record.actor_kind,
            name: record.actor_name,
        }),
    }
}

pub fn run(record: RunRecord) -> proto::Run {
    let error = (!record.error_type.is_empty()).then_some(proto::ErrorDetail {
        r#type: record.error_type,
        message: record.error_message,
    });
    proto::Run {
        run_id: run_id_text(&record.run_id),
        status: record.status,
        task: record.task,
        model: record.model,
        tools: record.tools,
        labels: record.labels.into_iter().collect(),
        created_at: timestamp(record.created_ms),
        updated_at: timestamp(record.updated_ms),
        deadline_at: timestamp(record.deadline_ms),
        last_seq: record.last_seq,
        result_json: record.result_json,
        error,
        pending_approvals: Vec::new(),
    }
}

pub fn approval(record: ApprovalRecord) -> proto::Approval {
    proto::Approval {
        run_id: run_id_text(&record.run_id),
        call_id: record.call_id,
        tool: record.tool,
        arguments_json: record.arguments_json,
        arguments_sha256: record.arguments_sha256,
        requested_at: timestamp(record.requested_ms),
        expires_at: timestamp(record.expires_ms),
        labels: record.labels.into_iter().collect(),
        seq: record.seq,
        position: record.position,
    }
}

pub fn message(message: &Message) -> proto::Message {
    let mut out = proto::Message::default();
    match message {
        Message::System(text) => {
            out.role = proto::Role::System as i32;
            out.content = text.clone();
        }
        Message::User(text) => {
            out.role = proto::Role::User as i32;
            out.content = text.clone();
        }
        Message::Assistant(reply) => {
            out.role = proto::Role::Assistant as i32;
            out.content = reply.content.clone();
            out.tool_calls = reply
                .tool_calls
                .iter()
                .map(|call| proto::ToolCall {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments_json: crate::engine::event::canonical_json(&call.arguments),
                })
                .collect();
        }
        Message::Tool {
            call_id,
            name,
            content,
            error,
        } => {
            out.role = proto::Role::Tool as i32;
            out.call_id = call_id.clone();
            out.name = name.clone();
            out.content = content.clone();
            out.error = error.as_ref().map(|e| proto::ErrorDetail {
                r#type: e.error_type.clone(),
                message: e.message.clone(),
            });
        }
    }
    out
}

pub fn task(task: engine::Task) -> proto::Task {
    let kind = match task.work {
        engine::Work::Tool { name, arguments } => proto::task::Kind::Tool(proto::ToolTask {
            name,
            arguments_json: crate::engine::event::canonical_json(&arguments),
        }),
        engine::Work::Model {
            model,
            messages,
            tools,
        } => proto::task::Kind::Model(proto::ModelTask {
            model,
            messages: messages.iter().map(message).collect(),
            tools: tools.iter().map(tool_definition_out).collect(),
        }),
    };
    proto::Task {
        token: task.token,
        run_id: task.run.to_string(),
        call_id: task.call_id,
        attempt: task.attempt,
        heartbeat_timeout_s: task.heartbeat_timeout.as_secs_f64(),
        deadline_at: task.deadline_at_ms.and_then(timestamp),
        kind: Some(kind),
    }
}
