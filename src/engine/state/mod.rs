//! A run's state and the pure fold over its events.
//!
//! `RunState::apply` takes one event and returns the actions it implies:
//! follow-up events the engine appends in the same batch, index changes
//! committed with them, and effects the driver performs once the batch is
//! durable. The `decide_*` functions turn an input (a signal, a worker's
//! result, a fired timer) into the events that record it, or refuse it.
//! Nothing here does I/O or reads a clock: times come from the events.

mod approval;
mod model;
mod run;
mod tool;

use serde_json::{json, Value};

use super::error::Error;
use crate::domain::event::*;
use crate::policy::{Decide, Requirements, Verdict};
use crate::seconds;
use crate::store::{EventRecord, RunId, RunRecord};

/// Timer names (the durable timer key carries them).
pub const DEADLINE_TIMER: &str = "deadline";
const APPROVAL_TIMER: &str = "approval/";
const REMIND_TIMER: &str = "remind/";
const ESCALATE_TIMER: &str = "escalate/";
const RETRY_TIMER: &str = "retry/";

/// What the driver does because of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Append this engine event right after, in the same batch.
    Emit(NewEvent),
    /// Offer the tool call to workers.
    DispatchTool { call_id: String, tool: String },
    /// Offer the model call to workers.
    DispatchModel { call_id: String, model: String },
    /// Offer the model call to the server's built-in model.
    DispatchBuiltinModel { call_id: String },
    /// Durable timer, armed in the same batch.
    ArmTimer { due_ms: i64, name: String },
    /// Durable timer removed in the same batch.
    CancelTimer { due_ms: i64, name: String },
    /// The call now waits for a decision: index it.
    ApprovalPending { call_id: String },
    /// The call's approval request is resolved: unindex it.
    ApprovalResolved { call_id: String },
    /// A valid call is requested: the driver asks the approval policy, if
    /// there is one, and appends what [`RunState::review`] says follows.
    Review { call_id: String },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Running,
    Completed(Value),
    Failed(ErrorData),
    Cancelled(String),
}

/// One message of the conversation handed to models.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    System(String),
    User(String),
    Assistant(AssistantMessage),
    Tool {
        call_id: String,
        name: String,
        content: String,
        error: Option<ErrorData>,
    },
}

impl Message {
    fn content(&self) -> &str {
        match self {
            Message::System(text) | Message::User(text) => text,
            Message::Assistant(message) => &message.content,
            Message::Tool { content, .. } => content,
        }
    }
}

/// Where a tool call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waits for an approval decision.
    AwaitingApproval,
    /// May be dispatched (ungated, or granted).
    Ready,
    /// An attempt failed; the next may start at `until_ms`.
    Backoff { until_ms: i64 },
    /// Attempt `Call::attempt` is running on a worker.
    Running,
    /// Completed or failed for good.
    Done,
}

/// The decision made on a gated call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Granted,
    Denied,
    Expired,
    /// A reviewer changed the arguments: another call takes this one's place.
    Edited,
}

impl Decision {
    pub fn event_type(self) -> &'static str {
        match self {
            Decision::Granted => APPROVAL_GRANTED,
            Decision::Denied => APPROVAL_DENIED,
            Decision::Expired => APPROVAL_EXPIRED,
            Decision::Edited => APPROVAL_EDITED,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
    /// None when the run does not know the tool.
    pub spec: Option<ToolSpec>,
    pub phase: Phase,
    /// Number of the latest attempt started; 0 before the first.
    pub attempt: u32,
    /// Identity of the worker that started the latest attempt.
    pub worker: String,
    pub decision: Option<Decision>,
    /// Due time of the approval timeout timer, when armed.
    pub approval_timer_ms: Option<i64>,
    pub requested_ms: i64,
    /// When the latest attempt started (its `aaa.tool.started`).
    pub started_ms: i64,
    pub approval_seq: u64,
    /// Global position of the approval request, once committed.
    pub approval_position: u64,
    /// Grants from distinct approvers the call needs.
    pub approvals_required: u32,
    /// Grants cast so far (fewer than `approvals_required`).
    pub votes: Vec<Vote>,
    /// The call id the model gave: the call's own, or for an edited call
    /// the one it replaces (its result answers that call).
    pub answers: String,
    /// For a call a reviewer edited: the call it replaces and the note the
    /// model reads with its result.
    pub edited_from: String,
    pub edit_note: String,
    /// The approver groups that may decide it; empty: any approver.
    pub approvers: Vec<String>,
    /// An edited call's editor, whose grant goes with the request.
    pub editor_grant: Option<EditorGrant>,
    /// Reminders and escalation of a request nobody answers.
    pub nudges: Nudges,
}

/// What a waiting request's reminders and escalation are, from its
/// `aaa.approval.requested`, and their durable timers while armed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Nudges {
    pub remind_after_s: f64,
    pub reminders: u32,
    pub reminded: u32,
    pub escalate_after_s: f64,
    pub escalate_to: Vec<String>,
    pub remind_timer_ms: Option<i64>,
    pub escalate_timer_ms: Option<i64>,
}

impl Call {
    /// Cancels the timers of a request that is resolved (or whose run ended).
    fn cancel_wait_timers(&mut self, actions: &mut Vec<Action>) {
        let timers = [
            (self.approval_timer_ms.take(), APPROVAL_TIMER),
            (self.nudges.remind_timer_ms.take(), REMIND_TIMER),
            (self.nudges.escalate_timer_ms.take(), ESCALATE_TIMER),
        ];
        for (due, prefix) in timers {
            if let Some(due_ms) = due {
                actions.push(Action::CancelTimer {
                    due_ms,
                    name: format!("{prefix}{}", self.call_id),
                });
            }
        }
    }
}

/// The grant an editor gave with an edit (`grant: true`), cast once the
/// edited call is requested, if the call's approver groups allow it.
#[derive(Debug, Clone, PartialEq)]
pub struct EditorGrant {
    actor: Actor,
    approver: String,
    /// With auth on, the editor's groups; None with auth off.
    groups: Option<Vec<String>>,
}

/// One approver's grant of a call that needs several.
#[derive(Debug, Clone, PartialEq)]
pub struct Vote {
    pub approver: String,
    pub time_ms: i64,
    pub comment: String,
}

/// An edit folded, until its new call is requested.
#[derive(Debug, Clone, PartialEq)]
struct PendingEdit {
    new_call_id: String,
    answers: String,
    note: String,
    grant: Option<EditorGrant>,
}

/// A call a standing grant could decide (see [`RunState::grant_ask`]).
#[derive(Debug)]
pub struct GrantAsk<'a> {
    pub tool: &'a str,
    pub arguments: &'a Value,
    pub approvals_required: u32,
    pub approvers: Vec<String>,
}

/// The model call the run waits for.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingModelCall {
    pub call_id: String,
    pub attempt: u32,
    /// When its first attempt was requested.
    pub requested_ms: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    pub id: RunId,
    pub last_seq: u64,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// The client principal that started the run (empty for others).
    pub started_by: String,
    pub spec: RunStarted,
    pub status: Status,
    pub messages: Vec<Message>,
    pub model_calls: u32,
    pub model_call: Option<PendingModelCall>,
    /// Tokens the run's model calls used (as built-in models report them).
    pub usage: Usage,
    pub calls: Vec<Call>,
    pending_edit: Option<PendingEdit>,
}

/// The outcome of an approval decision sent by a client.
#[derive(Debug)]
pub enum DecisionOutcome {
    /// Append these events.
    Append(Decided),
    /// The call was already decided; nothing changes.
    AlreadyDecided(Decision),
}

/// A decision to record, and what the caller is told about it.
#[derive(Debug, Default)]
pub struct Decided {
    pub events: Vec<NewEvent>,
    /// The type recorded: granted, voted, denied or edited.
    pub recorded: &'static str,
    /// For a grant: grants so far and grants needed.
    pub votes: u32,
    pub approvals_required: u32,
    /// For an edit: the call that takes the edited one's place.
    pub new_call_id: String,
    pub new_arguments_sha256: String,
}

/// A worker's report on a tool attempt.
pub enum ToolOutcome {
    Output(Value),
    Failure { error: ErrorData, retryable: bool },
}

fn decode(event: &EventRecord) -> Result<Typed, Error> {
    Typed::decode(&event.event_type, &event.data_json).map_err(|e| {
        Error::Internal(format!(
            "event {} of a run has undecodable {} data: {e}",
            event.seq, event.event_type
        ))
    })
}

impl RunState {
    /// The state right after `aaa.run.started`, and the actions it implies.
    pub fn start(id: RunId, first: &EventRecord) -> Result<(RunState, Vec<Action>), Error> {
        if first.event_type != RUN_STARTED || first.seq != 1 {
            return Err(Error::Internal(format!(
                "run {id} does not begin with {RUN_STARTED}"
            )));
        }
        let Typed::RunStarted(spec) = decode(first)? else {
            unreachable!("the type was checked above");
        };
        let mut messages = Vec::new();
        if !spec.system.is_empty() {
            messages.push(Message::System(spec.system.clone()));
        }
        messages.push(Message::User(spec.task.clone()));
        let state = RunState {
            id,
            last_seq: 1,
            created_ms: first.time_ms,
            updated_ms: first.time_ms,
            started_by: match first.actor_kind == crate::proto::ActorKind::Client as i32 {
                true => first.actor_name.clone(),
                false => String::new(),
            },
            spec,
            status: Status::Running,
            messages,
            model_calls: 0,
            model_call: None,
            usage: Usage::default(),
            calls: Vec::new(),
            pending_edit: None,
        };
        let mut actions = Vec::new();
        if let Some(due_ms) = state.spec.deadline_at_ms {
            actions.push(Action::ArmTimer {
                due_ms,
                name: DEADLINE_TIMER.to_string(),
            });
        }
        state.next_turn(&mut actions);
        Ok((state, actions))
    }

    /// Rebuilds a run's state from its whole log.
    pub fn replay(id: RunId, events: &[EventRecord]) -> Result<RunState, Error> {
        let (first, rest) = events
            .split_first()
            .ok_or_else(|| Error::RunNotFound(id.to_string()))?;
        let (mut state, _) = RunState::start(id, first)?;
        for event in rest {
            state.apply(event)?;
        }
        Ok(state)
    }

    pub fn is_finished(&self) -> bool {
        self.status != Status::Running
    }

    pub fn call(&self, call_id: &str) -> Option<&Call> {
        self.calls.iter().find(|c| c.call_id == call_id)
    }

    fn call_mut(&mut self, call_id: &str) -> Result<&mut Call, Error> {
        let run = self.id;
        self.calls
            .iter_mut()
            .find(|c| c.call_id == call_id)
            .ok_or_else(|| Error::Internal(format!("run {run} has no call {call_id}")))
    }

    /// Does the run have work that must be recovered after a restart
    /// (something to dispatch, or an attempt in flight)?
    pub fn is_active(&self) -> bool {
        !self.is_finished()
            && (self.worker_model_pending()
                || self.calls.iter().any(|c| {
                    matches!(
                        c.phase,
                        Phase::Ready | Phase::Backoff { .. } | Phase::Running
                    )
                }))
    }

    /// The wire RunStatus number.
    pub fn status_code(&self) -> i32 {
        match &self.status {
            Status::Running if !self.is_active() && self.awaits_approval() => 2,
            Status::Running => 1,
            Status::Completed(_) => 3,
            Status::Failed(_) => 4,
            Status::Cancelled(_) => 5,
        }
    }

    fn awaits_approval(&self) -> bool {
        self.calls
            .iter()
            .any(|c| c.phase == Phase::AwaitingApproval)
    }

    /// The summary the store keeps for listing; written when the status
    /// changes (its last seq and update time are read from the log index).
    pub fn summary(&self) -> RunRecord {
        let (result_json, error) = match &self.status {
            Status::Completed(value) => (canonical_json(value), None),
            Status::Failed(error) => (String::new(), Some(error.clone())),
            Status::Cancelled(reason) => (
                String::new(),
                Some(ErrorData::new("Cancelled", reason.clone())),
            ),
            Status::Running => (String::new(), None),
        };
        let error = error.unwrap_or(ErrorData::new("", ""));
        RunRecord {
            run_id: self.id.as_bytes().to_vec(),
            status: self.status_code(),
            task: self.spec.task.clone(),
            model: self.spec.model.name(),
            tools: self.spec.tools.iter().map(|t| t.name.clone()).collect(),
            labels: self.spec.labels.clone(),
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
            deadline_ms: self.spec.deadline_at_ms.unwrap_or(0),
            last_seq: self.last_seq,
            result_json,
            error_type: error.error_type,
            error_message: error.message,
            started_by: self.started_by.clone(),
            prompt_tokens: self.usage.prompt_tokens,
            completion_tokens: self.usage.completion_tokens,
        }
    }

    /// The conversation, as handed to models.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Applies one event (seq must follow `last_seq`).
    pub fn apply(&mut self, event: &EventRecord) -> Result<Vec<Action>, Error> {
        if event.seq != self.last_seq + 1 {
            return Err(Error::Internal(format!(
                "run {} got event seq {} after {}",
                self.id, event.seq, self.last_seq
            )));
        }
        self.last_seq = event.seq;
        self.updated_ms = event.time_ms;
        let now = event.time_ms;
        let mut actions = Vec::new();
        match decode(event)? {
            Typed::LlmRequested(e) => self.model_requested(e, now, &mut actions)?,
            Typed::LlmCompleted(e) => self.model_replied(e, &mut actions)?,
            Typed::LlmFailed(e) => self.model_failed(e, &mut actions)?,
            Typed::ToolRequested(e) => self.tool_requested(e, now, &mut actions)?,
            Typed::ApprovalRequested(e) => self.approval_requested(e, event, &mut actions)?,
            Typed::ApprovalReminded(e) => self.approval_reminded(e, event, &mut actions)?,
            Typed::ApprovalEscalated(e) => self.approval_escalated(e, &mut actions)?,
            Typed::ApprovalVoted(e) => self.approval_voted(e, now, &mut actions)?,
            Typed::ApprovalEdited(e) => self.approval_edited(e, event, &mut actions)?,
            Typed::ToolStarted(e) => self.tool_started(e, now)?,
            Typed::ToolRetrying(e) => self.tool_retrying(e, now, &mut actions)?,
            Typed::ToolCompleted(e) => self.tool_completed(e, &mut actions)?,
            Typed::ToolFailed(e) => self.tool_failed(e, &mut actions)?,
            Typed::ApprovalGranted(e) => {
                self.approval_resolved(e.call_id, Decision::Granted, String::new(), &mut actions)?
            }
            Typed::ApprovalDenied(e) => {
                self.approval_resolved(e.call_id, Decision::Denied, e.reason, &mut actions)?
            }
            Typed::ApprovalExpired(e) => {
                self.approval_resolved(e.call_id, Decision::Expired, e.reason, &mut actions)?
            }
            Typed::RunCompleted(e) => self.run_ended(Status::Completed(e.value), &mut actions),
            Typed::RunFailed(e) => self.run_ended(Status::Failed(e.error), &mut actions),
            Typed::RunCancelled(e) => self.run_ended(Status::Cancelled(e.reason), &mut actions),
            // Application events are recorded, not interpreted.
            Typed::RunStarted(_) | Typed::Application => {}
        }
        Ok(actions)
    }

    /// The events from `first_seq` on are durable at `positions`: calls
    /// requested among them learn their request's position.
    pub fn committed(&mut self, first_seq: u64, positions: &[u64]) {
        for call in &mut self.calls {
            let index = call.approval_seq.wrapping_sub(first_seq) as usize;
            if call.approval_seq >= first_seq && index < positions.len() {
                call.approval_position = positions[index];
            }
        }
    }

    /// The client or worker that caused `event`, as the log records it.
    fn actor_of(&self, event: &EventRecord) -> Actor {
        match event.actor_kind {
            3 => Actor::Client(event.actor_name.clone()),
            4 => Actor::Policy(event.actor_name.clone()),
            5 => Actor::Grant(event.actor_name.clone()),
            2 => Actor::Worker(WorkerId {
                identity: event.actor_name.clone(),
                principal: event.actor_principal.clone(),
            }),
            _ => Actor::Engine,
        }
    }

    fn tool_spec(&self, name: &str) -> Option<&ToolSpec> {
        self.spec.tools.iter().find(|t| t.name == name)
    }

    fn ensure_running(&self) -> Result<(), Error> {
        if self.is_finished() {
            return Err(Error::RunFinished(self.id.to_string()));
        }
        Ok(())
    }
}

/// How a tool's output reads as a message: a JSON string unquoted, anything
/// else as JSON text.
pub fn output_text(output: &Value) -> String {
    match output {
        Value::String(text) => text.clone(),
        other => canonical_json(other),
    }
}

#[cfg(test)]
mod tests;
