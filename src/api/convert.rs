//! Wire types <-> engine and store types, with the validation of client
//! input: every refusal names the field it is about.

use serde_json::Value;

use crate::domain::check::{check_size, name, MAX_NAME_BYTES};
use crate::domain::event::{
    Budget, ErrorData, ModelChoice, Nudging, OpenAiChoice, ProposedCall, RetrySpec, ScriptStep,
    ToolSpec,
};
use crate::engine::state::Message;
use crate::engine::{self, Error, MAX_EVENT_BYTES};
use crate::proto;
use crate::seconds;
use crate::store::{ApprovalRecord, EventRecord, RunId, RunRecord};

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

/// Label keys are names; values are text up to a name's size.
pub fn labels(
    field: &str,
    labels: &std::collections::HashMap<String, String>,
) -> Result<(), Error> {
    for (key, value) in labels {
        name(field, key)?;
        check_size(&format!("{field}[{key}]"), value, MAX_NAME_BYTES)?;
    }
    Ok(())
}

/// Deepest nesting of arrays and objects accepted in JSON text: deep enough
/// for any real arguments, shallow enough that recursive code (the fold,
/// serializers, SDKs) never runs out of stack on client input.
pub const MAX_JSON_DEPTH: usize = 64;

/// Any JSON value, as text.
pub fn json_value(field: &str, text: &str) -> Result<Value, Error> {
    check_size(field, text, MAX_EVENT_BYTES)?;
    check_depth(field, text)?;
    serde_json::from_str(text).map_err(|e| Error::invalid(field, format!("not valid JSON: {e}")))
}

/// Refuses JSON text nested deeper than [`MAX_JSON_DEPTH`], scanning the
/// text (brackets outside strings) before any recursive parse.
fn check_depth(field: &str, text: &str) -> Result<(), Error> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for byte in text.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(Error::invalid(
                        field,
                        format!("JSON nested deeper than {MAX_JSON_DEPTH} levels"),
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
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

/// A seconds field, checked against its range (see [`crate::seconds`]).
pub fn seconds(field: &str, value: f64, range: seconds::Range) -> Result<f64, Error> {
    range
        .check(value)
        .map_err(|message| Error::invalid(field, message))
}

pub fn start_run(request: proto::StartRunRequest) -> Result<engine::StartRun, Error> {
    if request.task.is_empty() {
        return Err(Error::invalid("task", "required"));
    }
    check_size("task", &request.task, MAX_EVENT_BYTES / 2)?;
    check_size("system", &request.system, MAX_EVENT_BYTES / 4)?;
    let model = match request.model.and_then(|m| m.kind) {
        None => return Err(Error::invalid(
            "model",
            "required: set model.worker (a worker-served model), model.scripted or model.openai",
        )),
        Some(proto::model_spec::Kind::Openai(openai)) => ModelChoice::Openai(openai_model(openai)?),
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
                approval_timeout_s: seconds(
                    &format!("tools[{i}].approval_timeout_s"),
                    tool.approval_timeout_s,
                    seconds::APPROVAL_TIMEOUT,
                )?,
                approvals_required: approvals_required(
                    &format!("tools[{i}].approvals_required"),
                    tool.approvals_required,
                )?,
            })
        })
        .collect::<Result<_, Error>>()?;
    let budget = request.budget.unwrap_or_default();
    let budget = Budget {
        deadline_s: seconds("budget.deadline_s", budget.deadline_s, seconds::DEADLINE)?,
        max_model_calls: match budget.max_model_calls {
            0 => DEFAULT_MAX_MODEL_CALLS,
            n => n,
        },
        max_tokens: budget.max_tokens,
    };
    labels("labels", &request.labels)?;
    if let Some(text) = request.labels.get(crate::domain::RETENTION_LABEL) {
        let field = format!("labels[{}]", crate::domain::RETENTION_LABEL);
        crate::domain::Retention::parse(text).map_err(|message| Error::invalid(&field, message))?;
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
        // Set by the handler, which knows the caller.
        principal: String::new(),
        traceparent: None,
    })
}

/// The caller's `traceparent` metadata, if it is a valid W3C trace
/// context. An invalid one is ignored (the run gets a trace of its own),
/// as the W3C spec asks: a caller's tracing must not stop its run.
pub fn traceparent(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    let text = metadata.get("traceparent")?.to_str().ok()?;
    match crate::otel::TraceContext::parse(text) {
        Ok(_) => Some(text.trim().to_string()),
        Err(e) => {
            tracing::debug!("ignored: {e}");
            None
        }
    }
}

/// The built-in model as StartRun asks for it; the engine checks the
/// provider and fills in its defaults.
fn openai_model(openai: proto::OpenAiModel) -> Result<OpenAiChoice, Error> {
    if !openai.model.is_empty() {
        check_size("model.openai.model", &openai.model, MAX_NAME_BYTES)?;
    }
    if !openai.provider.is_empty() {
        name("model.openai.provider", &openai.provider)?;
    }
    if let Some(t) = openai.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(Error::invalid(
                "model.openai.temperature",
                format!("{t} is out of range: 0 to 2"),
            ));
        }
    }
    Ok(OpenAiChoice {
        provider: openai.provider,
        model: openai.model,
        temperature: openai.temperature,
        max_tokens: (openai.max_tokens > 0).then_some(openai.max_tokens),
        max_attempts: 0,
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
        facts: Default::default(),
    })
}

pub fn tool_definition(i: usize, tool: proto::ToolDefinition) -> Result<ToolSpec, Error> {
    let field = |f: &str| format!("tools[{i}].{f}");
    name(&field("name"), &tool.name)?;
    check_size(&field("description"), &tool.description, 8 * 1024)?;
    check_size(&field("parameters_json"), &tool.parameters_json, 16 * 1024)?;
    let parameters = json_object(&field("parameters_json"), &tool.parameters_json)?;
    engine::schema::check(&parameters).map_err(|why| {
        Error::invalid(
            &field("parameters_json"),
            format!("is not a JSON Schema this server can check calls against: {why}"),
        )
    })?;
    let retry = tool.retry.unwrap_or_default();
    let default_attempts = if tool.requires_approval { 1 } else { 3 };
    let backoff = |value: f64, f: &str, default: f64| -> Result<f64, Error> {
        let value = seconds(&field(f), value, seconds::BACKOFF)?;
        Ok(if value == 0.0 { default } else { value })
    };
    let coefficient = match retry.backoff_coefficient {
        0.0 => 2.0,
        c if (1.0..=100.0).contains(&c) => c,
        c => {
            return Err(Error::invalid(
                &field("retry.backoff_coefficient"),
                format!("{c} is out of range: a number >= 1 and <= 100, or 0 for the default (2)"),
            ))
        }
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
            initial_backoff_s: backoff(retry.initial_backoff_s, "retry.initial_backoff_s", 1.0)?,
            backoff_coefficient: coefficient,
            max_backoff_s: backoff(retry.max_backoff_s, "retry.max_backoff_s", 60.0)?,
        },
        heartbeat_timeout_s: seconds(
            &field("heartbeat_timeout_s"),
            tool.heartbeat_timeout_s,
            seconds::HEARTBEAT_TIMEOUT,
        )?,
        approval_timeout_s: seconds(
            &field("approval_timeout_s"),
            tool.approval_timeout_s,
            seconds::APPROVAL_TIMEOUT,
        )?,
        approvals_required: approvals_required(
            &field("approvals_required"),
            tool.approvals_required,
        )?
        .max(1),
        approvers: approver_groups(&field("approvers"), tool.approvers)?,
        nudging: Nudging {
            remind_after_s: seconds(
                &field("remind_after_s"),
                tool.remind_after_s,
                seconds::APPROVAL_TIMEOUT,
            )?,
            reminders: match tool.reminders {
                n if n > crate::policy::MAX_REMINDERS => {
                    return Err(Error::invalid(
                        &field("reminders"),
                        format!("{n} is more than {}", crate::policy::MAX_REMINDERS),
                    ))
                }
                0 if tool.remind_after_s > 0.0 => 1,
                n => n,
            },
            escalate_after_s: seconds(
                &field("escalate_after_s"),
                tool.escalate_after_s,
                seconds::APPROVAL_TIMEOUT,
            )?,
            escalate_to: approver_groups(&field("escalate_to"), tool.escalate_to)?,
        },
        // Set by the engine when it stores the definition.
        gate_changed: None,
    })
}

/// Most grants a call may need: more distinct approvers than any team
/// would ask for is a typo.
pub const MAX_APPROVALS_REQUIRED: u32 = 16;

fn approvals_required(field: &str, n: u32) -> Result<u32, Error> {
    if n > MAX_APPROVALS_REQUIRED {
        return Err(Error::invalid(
            field,
            format!("{n} is more than {MAX_APPROVALS_REQUIRED} approvers"),
        ));
    }
    Ok(n)
}

pub fn tool_definition_out(spec: &ToolSpec) -> proto::ToolDefinition {
    proto::ToolDefinition {
        name: spec.name.clone(),
        description: spec.description.clone(),
        parameters_json: crate::domain::event::canonical_json(&spec.parameters),
        requires_approval: spec.requires_approval,
        retry: Some(proto::RetryPolicy {
            max_attempts: spec.retry.max_attempts,
            initial_backoff_s: spec.retry.initial_backoff_s,
            backoff_coefficient: spec.retry.backoff_coefficient,
            max_backoff_s: spec.retry.max_backoff_s,
        }),
        heartbeat_timeout_s: spec.heartbeat_timeout_s,
        approval_timeout_s: spec.approval_timeout_s,
        approvals_required: spec.approvals_required,
        approvers: spec.approvers.clone(),
        remind_after_s: spec.nudging.remind_after_s,
        reminders: spec.nudging.reminders,
        escalate_after_s: spec.nudging.escalate_after_s,
        escalate_to: spec.nudging.escalate_to.clone(),
    }
}

/// Approver group names: names as RegisterWorker takes them, each once.
fn approver_groups(field: &str, mut groups: Vec<String>) -> Result<Vec<String>, Error> {
    if groups.len() > 64 {
        return Err(Error::invalid(field, "more than 64 groups"));
    }
    for (i, group) in groups.iter().enumerate() {
        name(&format!("{field}[{i}]"), group)?;
    }
    groups.sort();
    groups.dedup();
    Ok(groups)
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
            principal: record.actor_principal,
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
        usage: Some(proto::TokenUsage {
            prompt_tokens: record.prompt_tokens,
            completion_tokens: record.completion_tokens,
            total_tokens: record
                .prompt_tokens
                .saturating_add(record.completion_tokens),
        }),
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
        task: record.task,
        approvals_required: record.approvals_required.max(1),
        votes: record.votes.into_iter().map(vote).collect(),
        edited_from: record.edited_from,
        approvers: record.approvers,
    }
}

pub fn vote(vote: crate::domain::VoteRecord) -> proto::Vote {
    proto::Vote {
        approver: vote.approver,
        time: timestamp(vote.time_ms),
        comment: vote.comment,
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
                    arguments_json: crate::domain::event::canonical_json(&call.arguments),
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
            arguments_json: crate::domain::event::canonical_json(&arguments),
        }),
        engine::Work::Model {
            model,
            messages,
            tools,
            ..
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
        traceparent: task.traceparent,
        kind: Some(kind),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Depth of a parsed value, counted like `check_depth` counts brackets.
    fn depth(value: &Value) -> usize {
        match value {
            Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
            Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    fn field_of(error: &Error) -> &str {
        match error {
            Error::InvalidField { field, .. } | Error::PayloadTooLarge { field, .. } => field,
            other => panic!("not a refusal naming a field: {other:?}"),
        }
    }

    #[test]
    fn depth_limit_is_64_and_brackets_in_strings_do_not_count() {
        assert!(json_value("f", &nested(MAX_JSON_DEPTH)).is_ok());
        let error = json_value("f", &nested(MAX_JSON_DEPTH + 1)).unwrap_err();
        assert_eq!(field_of(&error), "f");
        // Far past serde_json's own recursion limit: still our clear refusal.
        let error = json_object("data_json", &nested(10_000)).unwrap_err();
        assert!(error.to_string().contains("64 levels"), "{error}");
        let text = format!(r#"{{"a":"{}\"[{{"}}"#, "[".repeat(200));
        assert!(json_value("f", &text).is_ok());
    }

    /// Any JSON value, numbers included as written (big ones too).
    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "-?[1-9][0-9]{0,40}(\\.[0-9]{1,5})?".prop_map(|n| serde_json::from_str(&n).unwrap()),
            ".{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(6, 48, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// `inner` wrapped in `levels` arrays or objects.
    fn wrapped(inner: Value, levels: usize, arrays: bool) -> Value {
        (0..levels).fold(inner, |v, _| {
            if arrays {
                Value::Array(vec![v])
            } else {
                serde_json::json!({ "k": v })
            }
        })
    }

    proptest! {
        #[test]
        fn json_text_never_panics_and_refusals_name_the_field(text in ".{0,200}") {
            match json_value("arguments_json", &text) {
                Ok(value) => prop_assert!(depth(&value) <= MAX_JSON_DEPTH),
                Err(error) => prop_assert_eq!(field_of(&error), "arguments_json"),
            }
            match json_object("data_json", &text) {
                Ok(value) => prop_assert!(value.is_object()),
                Err(error) => prop_assert_eq!(field_of(&error), "data_json"),
            }
        }

        #[test]
        fn valid_json_is_accepted_exactly_when_shallow_enough(
            value in json(),
            levels in 50usize..80,
            arrays in any::<bool>(),
        ) {
            let value = wrapped(value, levels, arrays);
            let text = serde_json::to_string(&value).unwrap();
            let accepted = json_value("f", &text);
            prop_assert_eq!(accepted.is_ok(), depth(&value) <= MAX_JSON_DEPTH);
            if let Ok(parsed) = accepted {
                // Numbers and strings come back exactly as written.
                prop_assert_eq!(serde_json::to_string(&parsed).unwrap(), text);
            }
        }

        #[test]
        fn random_model_replies_are_converted_or_refused_naming_a_field(
            content in ".{0,20}",
            calls in prop::collection::vec((".{0,10}", ".{0,60}"), 0..4),
        ) {
            let reply = proto::ModelReply {
                content,
                tool_calls: calls
                    .into_iter()
                    .map(|(name, arguments_json)| proto::ModelToolCall { name, arguments_json })
                    .collect(),
            };
            if let Err(error) = model_reply(reply) {
                prop_assert!(field_of(&error).starts_with("reply."), "{error}");
            }
        }

        #[test]
        fn random_start_requests_are_converted_or_refused_naming_a_field(
            task in ".{0,10}",
            tool in ".{0,10}",
            arguments_json in ".{0,60}",
            deadline_s in any::<f64>(),
        ) {
            let request = proto::StartRunRequest {
                task,
                model: Some(proto::ModelSpec {
                    kind: Some(proto::model_spec::Kind::Scripted(proto::ScriptedModel {
                        steps: vec![proto::ScriptedStep {
                            reply: Some(proto::scripted_step::Reply::ToolCalls(
                                proto::ScriptedToolCalls {
                                    calls: vec![proto::ScriptedToolCall {
                                        name: tool,
                                        arguments_json,
                                    }],
                                },
                            )),
                        }],
                    })),
                }),
                budget: Some(proto::Budget { deadline_s, ..Default::default() }),
                ..Default::default()
            };
            if let Err(error) = start_run(request) {
                prop_assert!(!field_of(&error).is_empty());
            }
        }
    }
}
