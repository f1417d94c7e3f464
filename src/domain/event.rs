//! The event catalogue: type names and the data each engine-owned type
//! carries. Data is JSON (serde_json with arbitrary precision, so numbers
//! pass through exactly); the fold decodes it into these structs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Attempts one model call gets before the run fails (a worker-served or
/// scripted model; the built-in model's provider sets its own).
pub const MODEL_MAX_ATTEMPTS: u32 = 3;

pub const RUN_STARTED: &str = "aaa.run.started";
pub const RUN_COMPLETED: &str = "aaa.run.completed";
pub const RUN_FAILED: &str = "aaa.run.failed";
pub const RUN_CANCELLED: &str = "aaa.run.cancelled";
pub const LLM_REQUESTED: &str = "aaa.llm.requested";
pub const LLM_COMPLETED: &str = "aaa.llm.completed";
pub const LLM_FAILED: &str = "aaa.llm.failed";
pub const TOOL_REQUESTED: &str = "aaa.tool.requested";
pub const TOOL_STARTED: &str = "aaa.tool.started";
pub const TOOL_COMPLETED: &str = "aaa.tool.completed";
pub const TOOL_RETRYING: &str = "aaa.tool.retrying";
pub const TOOL_FAILED: &str = "aaa.tool.failed";
pub const APPROVAL_REQUESTED: &str = "aaa.approval.requested";
pub const APPROVAL_GRANTED: &str = "aaa.approval.granted";
pub const APPROVAL_DENIED: &str = "aaa.approval.denied";
pub const APPROVAL_EXPIRED: &str = "aaa.approval.expired";
pub const APPROVAL_VOTED: &str = "aaa.approval.voted";
pub const APPROVAL_EDITED: &str = "aaa.approval.edited";
pub const APPROVAL_REMINDED: &str = "aaa.approval.reminded";
pub const APPROVAL_ESCALATED: &str = "aaa.approval.escalated";

/// Is this type one that only the engine may append?
/// The prefix is matched in any case: `AAA.approval.granted` grants nothing,
/// but a consumer that compares types case-insensitively could be fooled.
pub fn is_reserved(event_type: &str) -> bool {
    event_type
        .get(..4)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("aaa."))
        && !is_decision(event_type)
}

/// Is this a type a client appends to decide an approval request?
pub fn is_decision(event_type: &str) -> bool {
    matches!(
        event_type,
        APPROVAL_GRANTED | APPROVAL_DENIED | APPROVAL_EDITED
    )
}

/// One event of a run's log, its data decoded once, here: every type the
/// engine owns with its data, and the application events, which the engine
/// records without reading.
#[derive(Debug, Clone, PartialEq)]
pub enum Typed {
    RunStarted(RunStarted),
    LlmRequested(LlmRequested),
    LlmCompleted(LlmCompleted),
    LlmFailed(LlmFailed),
    ToolRequested(ToolRequested),
    ToolStarted(ToolStarted),
    ToolRetrying(ToolRetrying),
    ToolCompleted(ToolCompleted),
    ToolFailed(ToolFailed),
    ApprovalRequested(ApprovalRequested),
    ApprovalReminded(ApprovalReminded),
    ApprovalEscalated(ApprovalEscalated),
    ApprovalVoted(ApprovalVoted),
    ApprovalEdited(ApprovalEdited),
    ApprovalGranted(ApprovalGranted),
    ApprovalDenied(ApprovalDenied),
    ApprovalExpired(ApprovalExpired),
    RunCompleted(RunCompleted),
    RunFailed(RunFailed),
    RunCancelled(RunCancelled),
    Application,
}

impl Typed {
    /// The event of type `event_type` whose data is `data_json`.
    pub fn decode(event_type: &str, data_json: &str) -> Result<Typed, serde_json::Error> {
        Ok(match event_type {
            RUN_STARTED => Typed::RunStarted(serde_json::from_str(data_json)?),
            LLM_REQUESTED => Typed::LlmRequested(serde_json::from_str(data_json)?),
            LLM_COMPLETED => Typed::LlmCompleted(serde_json::from_str(data_json)?),
            LLM_FAILED => Typed::LlmFailed(serde_json::from_str(data_json)?),
            TOOL_REQUESTED => Typed::ToolRequested(serde_json::from_str(data_json)?),
            TOOL_STARTED => Typed::ToolStarted(serde_json::from_str(data_json)?),
            TOOL_RETRYING => Typed::ToolRetrying(serde_json::from_str(data_json)?),
            TOOL_COMPLETED => Typed::ToolCompleted(serde_json::from_str(data_json)?),
            TOOL_FAILED => Typed::ToolFailed(serde_json::from_str(data_json)?),
            APPROVAL_REQUESTED => Typed::ApprovalRequested(serde_json::from_str(data_json)?),
            APPROVAL_REMINDED => Typed::ApprovalReminded(serde_json::from_str(data_json)?),
            APPROVAL_ESCALATED => Typed::ApprovalEscalated(serde_json::from_str(data_json)?),
            APPROVAL_VOTED => Typed::ApprovalVoted(serde_json::from_str(data_json)?),
            APPROVAL_EDITED => Typed::ApprovalEdited(serde_json::from_str(data_json)?),
            APPROVAL_GRANTED => Typed::ApprovalGranted(serde_json::from_str(data_json)?),
            APPROVAL_DENIED => Typed::ApprovalDenied(serde_json::from_str(data_json)?),
            APPROVAL_EXPIRED => Typed::ApprovalExpired(serde_json::from_str(data_json)?),
            RUN_COMPLETED => Typed::RunCompleted(serde_json::from_str(data_json)?),
            RUN_FAILED => Typed::RunFailed(serde_json::from_str(data_json)?),
            RUN_CANCELLED => Typed::RunCancelled(serde_json::from_str(data_json)?),
            _ => Typed::Application,
        })
    }
}

/// Who caused an event (the wire ActorKind numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    Engine,
    Worker(WorkerId),
    Client(String),
    /// The approval policy, by the rule that decided.
    Policy(String),
    /// A standing grant, by its id.
    Grant(String),
}

/// A worker as events name it: the identity it chose and, with auth on, the
/// principal that authenticated it (empty without auth).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerId {
    pub identity: String,
    pub principal: String,
}

impl From<&str> for WorkerId {
    /// A worker without a principal (auth off).
    fn from(identity: &str) -> Self {
        WorkerId {
            identity: identity.to_string(),
            principal: String::new(),
        }
    }
}

impl Actor {
    pub fn kind(&self) -> i32 {
        match self {
            Actor::Engine => 1,
            Actor::Worker(_) => 2,
            Actor::Client(_) => 3,
            Actor::Policy(_) => 4,
            Actor::Grant(_) => 5,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Actor::Engine => "",
            Actor::Worker(worker) => &worker.identity,
            Actor::Client(name) | Actor::Policy(name) | Actor::Grant(name) => name,
        }
    }

    /// The principal behind a worker; empty for others (a client's name is
    /// already its principal when auth is on).
    pub fn principal(&self) -> &str {
        match self {
            Actor::Worker(worker) => &worker.principal,
            Actor::Engine | Actor::Client(_) | Actor::Policy(_) | Actor::Grant(_) => "",
        }
    }
}

/// An event about to be appended: its seq, id and time are set by the driver.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub event_type: String,
    pub data: Value,
    pub actor: Actor,
}

impl NewEvent {
    /// An engine-owned event with typed data.
    pub fn engine(event_type: &str, data: impl Serialize) -> Self {
        NewEvent {
            event_type: event_type.to_string(),
            data: serde_json::to_value(data).expect("event data serializes"),
            actor: Actor::Engine,
        }
    }

    pub fn by(mut self, actor: Actor) -> Self {
        self.actor = actor;
        self
    }
}

/// An error as recorded in events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorData {
    #[serde(rename = "type")]
    pub error_type: String,
    pub message: String,
}

impl ErrorData {
    pub fn new(error_type: &str, message: impl Into<String>) -> Self {
        ErrorData {
            error_type: error_type.to_string(),
            message: message.into(),
        }
    }
}

/// A tool as a run knows it: snapshotted into aaa.run.started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: Value,
    pub requires_approval: bool,
    pub retry: RetrySpec,
    pub heartbeat_timeout_s: f64,
    pub approval_timeout_s: f64,
    /// Grants from distinct approvers a gated call needs (logs written
    /// before this field existed mean 1).
    #[serde(default = "one")]
    pub approvals_required: u32,
    /// The approver groups that may decide its calls; empty: any approver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// Reminders and escalation of its requests nobody answers.
    #[serde(default, skip_serializing_if = "Nudging::is_off")]
    pub nudging: Nudging,
    /// Who last set the gate fields (see `engine::gate`), a first
    /// declaration included, and when; None for a tool declared ungated
    /// whose gate nobody changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_changed: Option<GateChange>,
}

/// A change of a tool's gate: who registered it (a principal, or with
/// auth off the worker's identity) and when (Unix milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateChange {
    pub by: String,
    pub at_ms: i64,
}

/// Reminders (`aaa.approval.reminded`, `reminders` of them, one every
/// `remind_after_s`) and an escalation (`aaa.approval.escalated` after
/// `escalate_after_s`, adding `escalate_to` to the approver groups) of a
/// request nobody answers. Zero seconds: none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Nudging {
    #[serde(default)]
    pub remind_after_s: f64,
    #[serde(default)]
    pub reminders: u32,
    #[serde(default)]
    pub escalate_after_s: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalate_to: Vec<String>,
}

impl Nudging {
    pub fn is_off(&self) -> bool {
        self.remind_after_s == 0.0 && self.escalate_after_s == 0.0
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Resolved retry policy (no zero "defaults" left in it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrySpec {
    pub max_attempts: u32,
    pub initial_backoff_s: f64,
    pub backoff_coefficient: f64,
    pub max_backoff_s: f64,
}

impl RetrySpec {
    /// Delay before attempt `attempt + 1`, after attempt `attempt` failed.
    pub fn delay_after(&self, attempt: u32) -> f64 {
        let exponent = attempt.saturating_sub(1).min(64) as i32;
        (self.initial_backoff_s * self.backoff_coefficient.powi(exponent)).min(self.max_backoff_s)
    }
}

/// The model driving a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelChoice {
    /// Served by workers under this name.
    Worker(String),
    /// The built-in scripted model with its steps.
    Scripted(Vec<ScriptStep>),
    /// The built-in OpenAI-compatible model, called by the server itself.
    Openai(OpenAiChoice),
}

impl ModelChoice {
    pub fn name(&self) -> String {
        match self {
            ModelChoice::Worker(name) => name.clone(),
            ModelChoice::Scripted(_) => "scripted".to_string(),
            ModelChoice::Openai(choice) => format!("openai:{}@{}", choice.model, choice.provider),
        }
    }

    /// Attempts one model call gets before the run fails.
    pub fn max_attempts(&self) -> u32 {
        match self {
            ModelChoice::Openai(choice) => choice.max_attempts.max(1),
            _ => MODEL_MAX_ATTEMPTS,
        }
    }
}

/// The built-in OpenAI-compatible model as a run snapshots it: the provider
/// by name (its URL and key stay in the server's config, never in the log)
/// and what the provider's retry policy allowed when the run started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenAiChoice {
    pub provider: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    pub max_attempts: u32,
}

/// Tokens a model call used, as its provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
    }
}

/// What a built-in model reports with a reply, beyond the message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplyFacts {
    pub attempt: Option<u32>,
    pub usage: Option<Usage>,
    pub model: String,
    pub finish_reason: String,
    pub latency_ms: Option<u64>,
}

/// One reply of the scripted model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptStep {
    Text(String),
    ToolCalls(Vec<ProposedCall>),
    Echo,
}

/// A tool call as a model proposes it, before the engine gives it an id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposedCall {
    pub name: String,
    pub arguments: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub deadline_s: f64,
    pub max_model_calls: u32,
    /// Tokens the run's model calls may use; 0: no limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStarted {
    pub task: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub system: String,
    pub model: ModelChoice,
    pub tools: Vec<ToolSpec>,
    pub budget: Budget,
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at_ms: Option<i64>,
    /// The W3C trace context the starter sent (see [`crate::otel`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmRequested {
    pub call_id: String,
    pub model: String,
    pub attempt: u32,
    /// For a retry: why the attempt before it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_error: Option<ErrorData>,
}

/// A tool call with the id the engine gave it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallData {
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    pub content: String,
    pub tool_calls: Vec<ToolCallData>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmCompleted {
    pub call_id: String,
    pub message: AssistantMessage,
    /// The rest is what built-in models report (absent for the others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The model that answered, as the provider names it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub finish_reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
}

impl LlmCompleted {
    pub fn new(call_id: String, message: AssistantMessage, facts: ReplyFacts) -> Self {
        LlmCompleted {
            call_id,
            message,
            attempt: facts.attempt,
            usage: facts.usage,
            model: facts.model,
            finish_reason: facts.finish_reason,
            latency_ms: facts.latency_ms,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmFailed {
    pub call_id: String,
    pub attempt: u32,
    pub error: ErrorData,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolRequested {
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
    pub requires_approval: bool,
    /// For a call a reviewer edited: the call it replaces.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub edited_from: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequested {
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
    pub arguments_sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub approvals_required: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub edited_from: String,
    /// The approver groups that may decide the call; empty: any approver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// The approval timeout a policy rule set (else the tool's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_s: Option<f64>,
    /// Reminders and escalation while nobody answers (the tool's, or a
    /// policy rule's).
    #[serde(default, skip_serializing_if = "Nudging::is_off")]
    pub nudging: Nudging,
    /// The policy rule that set these requirements, or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyStamp>,
}

/// Which policy decided (or set what a decision needs), in the event that
/// records it: the rule, the policy file's sha256, and for a rule that
/// could not be evaluated, why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyStamp {
    pub rule: String,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalGranted {
    pub call_id: String,
    /// The tool's name, filled in by the engine.
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// With auth off, the name the approver gives (unverified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// For a call that needs several grants: every approver, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// A grant by the policy: the rule that allowed the call (or, with a
    /// standing grant, the `require` rule that matched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyStamp>,
    /// A grant by a standing grant: which one, and who made it why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<GrantStamp>,
}

/// The standing grant that granted a call, as its event records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrantStamp {
    pub id: String,
    pub reason: String,
    pub created_by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDenied {
    pub call_id: String,
    /// The tool's name, filled in by the engine.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_sha256: Option<String>,
    /// With auth off, the name the approver gives (unverified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// A denial by the policy: the rule that denied the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyStamp>,
}

/// A request nobody has answered yet: reminder `reminder` of `reminders`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalReminded {
    pub call_id: String,
    pub name: String,
    pub reminder: u32,
    pub reminders: u32,
    /// Seconds since the request.
    pub waiting_s: f64,
}

/// A request nobody answered in time: `approvers` may decide it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalEscalated {
    pub call_id: String,
    pub name: String,
    /// The approver groups from now on (the old ones and `escalate_to`).
    pub approvers: Vec<String>,
    pub waiting_s: f64,
}

/// A grant that is not yet the last one the call needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalVoted {
    pub call_id: String,
    pub name: String,
    pub arguments_sha256: String,
    pub approver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    pub votes: u32,
    pub approvals_required: u32,
}

/// An edit as a client sends it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EditRequest {
    pub call_id: String,
    pub arguments: Value,
    #[serde(default)]
    pub arguments_sha256: Option<String>,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub grant: bool,
    #[serde(default)]
    pub approver: Option<String>,
}

/// An edit as recorded: `call_id` never runs, `new_call_id` takes its place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalEdited {
    pub call_id: String,
    pub name: String,
    pub arguments_sha256: String,
    pub new_call_id: String,
    pub new_arguments: Value,
    pub new_arguments_sha256: String,
    #[serde(default)]
    pub reason: String,
    /// The editor's grant of the new arguments goes with the edit.
    #[serde(default)]
    pub grant: bool,
    /// The editor's name for that vote (the principal with auth on).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub approver: String,
    /// The editor's approver groups with auth on (None with auth off):
    /// their grant of the new call counts only if the groups allow it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver_groups: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalExpired {
    pub call_id: String,
    /// The tool's name, filled in by the engine.
    #[serde(default)]
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolStarted {
    pub call_id: String,
    pub attempt: u32,
    pub worker: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCompleted {
    pub call_id: String,
    pub attempt: u32,
    pub output: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolRetrying {
    pub call_id: String,
    pub attempt: u32,
    pub error: ErrorData,
    pub delay_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolFailed {
    pub call_id: String,
    /// 0 when no attempt ran (denied, unknown tool).
    pub attempt: u32,
    pub error: ErrorData,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCompleted {
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFailed {
    pub error: ErrorData,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCancelled {
    pub reason: String,
}

/// Canonical JSON text: object keys sorted, no whitespace, numbers as given.
pub fn canonical_json(value: &Value) -> String {
    // serde_json's Map is a BTreeMap (no preserve_order feature), so keys
    // serialize sorted.
    serde_json::to_string(value).expect("JSON values serialize")
}

/// Hex SHA-256 of the canonical JSON of `value`.
pub fn sha256_hex(value: &Value) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(canonical_json(value).as_bytes()))
}
