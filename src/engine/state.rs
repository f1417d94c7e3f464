//! A run's state and the pure fold over its events.
//!
//! `RunState::apply` takes one event and returns the actions it implies:
//! follow-up events the engine appends in the same batch, index changes
//! committed with them, and effects the driver performs once the batch is
//! durable. The `decide_*` functions turn an input (a signal, a worker's
//! result, a fired timer) into the events that record it, or refuse it.
//! Nothing here does I/O or reads a clock: times come from the events.

use serde_json::{json, Value};

use super::error::Error;
use crate::domain::event::*;
use crate::domain::may_decide;
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

/// Who decides an approval request, as the API authenticated them.
#[derive(Debug, Clone)]
pub struct Reviewer {
    pub actor: Actor,
    /// The authenticated principal; empty with auth off.
    pub principal: String,
    /// The run's starter may not decide its calls.
    pub separation_of_duties: bool,
    /// With auth on, the principal's approver groups; None with auth off
    /// (groups are then not enforced).
    pub groups: Option<Vec<String>>,
}

impl Reviewer {
    /// The name a vote counts under: the principal with auth on; with auth
    /// off the name the decision gives, else the caller's IP address (not
    /// its port: a process that reconnects is not another approver).
    fn approver(&self, named: Option<&str>) -> Result<String, Error> {
        match (self.principal.as_str(), named) {
            ("", Some(name)) if !name.is_empty() => Ok(name.to_string()),
            ("", _) => {
                let caller = self.actor.name();
                Ok(caller
                    .parse::<std::net::SocketAddr>()
                    .map_or_else(|_| caller.to_string(), |addr| addr.ip().to_string()))
            }
            (principal, Some(name)) if !name.is_empty() && name != principal => Err(Error::invalid(
                "data_json.approver",
                format!("with auth on the approver is the authenticated principal ({principal}), not '{name}'"),
            )),
            (principal, _) => Ok(principal.to_string()),
        }
    }
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

    fn worker_model_pending(&self) -> bool {
        self.model_call.is_some() && !matches!(self.spec.model, ModelChoice::Scripted(_))
    }

    /// The attempt of the built-in model in flight, if any.
    pub fn builtin_model_pending(&self) -> Option<&PendingModelCall> {
        match self.spec.model {
            ModelChoice::Openai(_) if !self.is_finished() => self.model_call.as_ref(),
            _ => None,
        }
    }

    /// The attempt of a worker-served model in flight, if any.
    pub fn served_model_pending(&self) -> Option<&PendingModelCall> {
        match self.spec.model {
            ModelChoice::Worker(_) if !self.is_finished() => self.model_call.as_ref(),
            _ => None,
        }
    }

    /// Has the run used up its token budget?
    fn tokens_spent(&self) -> bool {
        let max = self.spec.budget.max_tokens;
        max > 0 && self.usage.total() >= max
    }

    fn tokens_exceeded(&self) -> NewEvent {
        NewEvent::engine(
            RUN_FAILED,
            RunFailed {
                error: ErrorData::new(
                    "BudgetExceeded",
                    format!(
                        "the run's model calls used {} tokens, its budget's max_tokens is {}",
                        self.usage.total(),
                        self.spec.budget.max_tokens
                    ),
                ),
            },
        )
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

    fn model_requested(
        &mut self,
        e: LlmRequested,
        now: i64,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        if e.attempt == 1 {
            self.model_calls += 1;
        }
        let requested_ms = match &self.model_call {
            Some(call) if call.call_id == e.call_id => call.requested_ms,
            _ => now,
        };
        self.model_call = Some(PendingModelCall {
            call_id: e.call_id.clone(),
            attempt: e.attempt,
            requested_ms,
        });
        match &self.spec.model {
            ModelChoice::Worker(model) => actions.push(Action::DispatchModel {
                call_id: e.call_id,
                model: model.clone(),
            }),
            ModelChoice::Openai(_) => {
                actions.push(Action::DispatchBuiltinModel { call_id: e.call_id })
            }
            ModelChoice::Scripted(steps) => {
                let reply = match steps.get(self.model_calls as usize - 1) {
                    Some(step) => self.scripted_reply(e.call_id, step.clone()),
                    None => NewEvent::engine(
                        RUN_FAILED,
                        RunFailed {
                            error: ErrorData::new(
                                "ScriptExhausted",
                                format!(
                                    "the scripted model has {} steps and was called again",
                                    steps.len()
                                ),
                            ),
                        },
                    ),
                };
                actions.push(Action::Emit(reply));
            }
        }
        Ok(())
    }

    fn model_replied(&mut self, e: LlmCompleted, actions: &mut Vec<Action>) -> Result<(), Error> {
        self.model_call = None;
        if let Some(usage) = e.usage {
            self.usage.add(usage);
        }
        if !e.message.tool_calls.is_empty() && self.tokens_spent() {
            // Nobody could read the calls' results: stop here.
            actions.push(Action::Emit(self.tokens_exceeded()));
            self.messages.push(Message::Assistant(e.message));
            return Ok(());
        }
        if e.message.tool_calls.is_empty() {
            actions.push(Action::Emit(NewEvent::engine(
                RUN_COMPLETED,
                RunCompleted {
                    value: json!({ "text": e.message.content }),
                },
            )));
        }
        for call in &e.message.tool_calls {
            let requires_approval = self
                .tool_spec(&call.name)
                .is_some_and(|spec| spec.requires_approval);
            actions.push(Action::Emit(NewEvent::engine(
                TOOL_REQUESTED,
                ToolRequested {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    requires_approval,
                    edited_from: String::new(),
                },
            )));
        }
        self.messages.push(Message::Assistant(e.message));
        Ok(())
    }

    fn model_failed(&mut self, e: LlmFailed, actions: &mut Vec<Action>) -> Result<(), Error> {
        self.model_call = None;
        // A reply cut short or filtered ends the run with its own type.
        let error = match e.error.error_type.as_str() {
            "ModelOutputTruncated" | "ModelContentFiltered" => e.error,
            _ => ErrorData::new(
                "ModelFailed",
                format!("{}: {}", e.error.error_type, e.error.message),
            ),
        };
        actions.push(Action::Emit(NewEvent::engine(
            RUN_FAILED,
            RunFailed { error },
        )));
        Ok(())
    }

    fn tool_requested(
        &mut self,
        e: ToolRequested,
        now: i64,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let spec = self.tool_spec(&e.name).cloned();
        let mut call = Call {
            call_id: e.call_id.clone(),
            name: e.name.clone(),
            arguments: e.arguments.clone(),
            spec: spec.clone(),
            phase: Phase::Ready,
            attempt: 0,
            worker: String::new(),
            decision: None,
            approval_timer_ms: None,
            requested_ms: now,
            approval_seq: 0,
            approval_position: 0,
            started_ms: 0,
            approvals_required: spec.as_ref().map_or(1, |s| s.approvals_required.max(1)),
            votes: Vec::new(),
            answers: e.call_id.clone(),
            edited_from: e.edited_from.clone(),
            edit_note: String::new(),
            approvers: spec.as_ref().map_or(Vec::new(), |s| s.approvers.clone()),
            editor_grant: None,
            nudges: Nudges::default(),
        };
        if !e.edited_from.is_empty() {
            let edit = self
                .pending_edit
                .take_if(|edit| edit.new_call_id == e.call_id)
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "run {}: call {} names {} as edited, but no edit of it precedes",
                        self.id, e.call_id, e.edited_from
                    ))
                })?;
            call.answers = edit.answers;
            call.edit_note = edit.note;
            call.editor_grant = edit.grant;
        }
        match spec {
            None => {
                call.phase = Phase::Done;
                actions.push(fail_unstarted(
                    e.call_id,
                    "UnknownTool",
                    format!("this run has no tool named '{}'", e.name),
                ));
            }
            Some(spec) => {
                let gated = e.requires_approval || spec.requires_approval;
                if gated {
                    call.phase = Phase::AwaitingApproval;
                }
                // Arguments that do not fit the tool's schema never
                // reach a human or a worker; the model reads why. The
                // phase above still follows the log: the failure
                // recorded next ends the call (a log written before
                // schemas were checked goes on as it did).
                let violations = super::schema::violations(&spec.parameters, &e.arguments);
                if !e.arguments.is_object() {
                    // A model's arguments that are not a JSON object
                    // (or not JSON at all) go back to the model.
                    actions.push(fail_unstarted(
                        e.call_id,
                        "InvalidArguments",
                        format!(
                            "the arguments of {} are not a JSON object: {}",
                            e.name,
                            output_text(&e.arguments)
                        ),
                    ));
                } else if !violations.is_empty() {
                    actions.push(fail_unstarted(
                        e.call_id,
                        "InvalidArguments",
                        format!(
                            "the arguments do not match {}'s parameters schema: {}",
                            e.name,
                            violations.join("; ")
                        ),
                    ));
                } else {
                    actions.push(Action::Review { call_id: e.call_id });
                }
            }
        }
        self.calls.push(call);
        Ok(())
    }

    fn approval_requested(
        &mut self,
        e: ApprovalRequested,
        event: &EventRecord,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let now = event.time_ms;
        let call = self.call_mut(&e.call_id)?;
        call.approval_seq = event.seq;
        call.approval_position = event.position;
        // What the request needs is the event's (a policy rule may
        // have set it); a call the tool does not gate waits too.
        call.phase = Phase::AwaitingApproval;
        call.approvals_required = e.approvals_required.max(1);
        call.approvers = e.approvers.clone();
        let timeout = e
            .approval_timeout_s
            .unwrap_or_else(|| call.spec.as_ref().map_or(0.0, |s| s.approval_timeout_s));
        if timeout > 0.0 {
            let due_ms = seconds::after_ms(now, timeout);
            call.approval_timer_ms = Some(due_ms);
            actions.push(Action::ArmTimer {
                due_ms,
                name: format!("{APPROVAL_TIMER}{}", e.call_id),
            });
        }
        let nudging = &e.nudging;
        call.nudges = Nudges {
            remind_after_s: nudging.remind_after_s,
            reminders: nudging.reminders,
            escalate_after_s: nudging.escalate_after_s,
            escalate_to: nudging.escalate_to.clone(),
            ..Nudges::default()
        };
        if nudging.remind_after_s > 0.0 && nudging.reminders > 0 {
            let due_ms = seconds::after_ms(now, nudging.remind_after_s);
            call.nudges.remind_timer_ms = Some(due_ms);
            actions.push(Action::ArmTimer {
                due_ms,
                name: format!("{REMIND_TIMER}{}", e.call_id),
            });
        }
        if nudging.escalate_after_s > 0.0 {
            let due_ms = seconds::after_ms(now, nudging.escalate_after_s);
            call.nudges.escalate_timer_ms = Some(due_ms);
            actions.push(Action::ArmTimer {
                due_ms,
                name: format!("{ESCALATE_TIMER}{}", e.call_id),
            });
        }
        actions.push(Action::ApprovalPending {
            call_id: e.call_id.clone(),
        });
        // An edit granted in the same step: the editor's vote for
        // the arguments they wrote, if the call's groups allow it.
        if let Some(grant) = call.editor_grant.take() {
            if may_decide(grant.groups.as_deref(), &call.approvers) {
                let digest = e.arguments_sha256.clone();
                let vote = vote_event(call, grant.approver, Some(digest), None);
                actions.push(Action::Emit(vote.by(grant.actor)));
            }
        }
        Ok(())
    }

    fn approval_reminded(
        &mut self,
        e: ApprovalReminded,
        event: &EventRecord,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let now = event.time_ms;
        let call = self.call_mut(&e.call_id)?;
        let nudges = &mut call.nudges;
        nudges.reminded = e.reminder;
        // The timer that fired was deleted with this event; the
        // next reminder, if any, is armed.
        nudges.remind_timer_ms = None;
        if nudges.reminded < nudges.reminders {
            let due_ms = seconds::after_ms(now, nudges.remind_after_s);
            nudges.remind_timer_ms = Some(due_ms);
            actions.push(Action::ArmTimer {
                due_ms,
                name: format!("{REMIND_TIMER}{}", e.call_id),
            });
        }
        Ok(())
    }

    fn approval_escalated(
        &mut self,
        e: ApprovalEscalated,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        call.nudges.escalate_timer_ms = None;
        call.approvers = e.approvers;
        // The index row shows who may decide now.
        actions.push(Action::ApprovalPending { call_id: e.call_id });
        Ok(())
    }

    fn approval_voted(
        &mut self,
        e: ApprovalVoted,
        now: i64,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        call.votes.push(Vote {
            approver: e.approver,
            time_ms: now,
            comment: e.comment.unwrap_or_default(),
        });
        // The index row shows the votes so far.
        actions.push(Action::ApprovalPending { call_id: e.call_id });
        Ok(())
    }

    fn approval_edited(
        &mut self,
        e: ApprovalEdited,
        event: &EventRecord,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let editor = self.actor_of(event);
        let call = self.call_mut(&e.call_id)?;
        call.decision = Some(Decision::Edited);
        call.phase = Phase::Done;
        call.cancel_wait_timers(actions);
        actions.push(Action::ApprovalResolved {
            call_id: e.call_id.clone(),
        });
        let note = edit_note(&e.new_arguments, &e.reason);
        self.pending_edit = Some(PendingEdit {
            new_call_id: e.new_call_id.clone(),
            answers: call.answers.clone(),
            note,
            grant: e.grant.then(|| EditorGrant {
                actor: editor,
                approver: e.approver.clone(),
                groups: e.approver_groups.clone(),
            }),
        });
        actions.push(Action::Emit(NewEvent::engine(
            TOOL_REQUESTED,
            ToolRequested {
                call_id: e.new_call_id,
                name: e.name,
                arguments: e.new_arguments,
                requires_approval: true,
                edited_from: e.call_id,
            },
        )));
        Ok(())
    }

    fn tool_started(&mut self, e: ToolStarted, now: i64) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        call.phase = Phase::Running;
        call.attempt = e.attempt;
        call.worker = e.worker;
        call.started_ms = now;
        Ok(())
    }

    fn tool_retrying(
        &mut self,
        e: ToolRetrying,
        now: i64,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        let until_ms = seconds::after_ms(now, e.delay_s);
        call.phase = Phase::Backoff { until_ms };
        actions.push(Action::ArmTimer {
            due_ms: until_ms,
            name: format!("{RETRY_TIMER}{}", e.call_id),
        });
        Ok(())
    }

    fn tool_completed(&mut self, e: ToolCompleted, actions: &mut Vec<Action>) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        call.phase = Phase::Done;
        let message = Message::Tool {
            call_id: call.answers.clone(),
            name: call.name.clone(),
            content: format!("{}{}", call.edit_note, output_text(&e.output)),
            error: None,
        };
        self.messages.push(message);
        self.next_turn(actions);
        Ok(())
    }

    fn tool_failed(&mut self, e: ToolFailed, actions: &mut Vec<Action>) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        call.phase = Phase::Done;
        let message = Message::Tool {
            call_id: call.answers.clone(),
            name: call.name.clone(),
            content: format!(
                "{}{}: {}",
                call.edit_note, e.error.error_type, e.error.message
            ),
            error: Some(e.error),
        };
        self.messages.push(message);
        self.next_turn(actions);
        Ok(())
    }

    /// A request's decision: granted, denied, or expired unanswered.
    fn approval_resolved(
        &mut self,
        call_id: String,
        decision: Decision,
        reason: String,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let call = self.call_mut(&call_id)?;
        call.decision = Some(decision);
        call.cancel_wait_timers(actions);
        actions.push(Action::ApprovalResolved {
            call_id: call_id.clone(),
        });
        match decision {
            Decision::Granted => {
                call.phase = Phase::Ready;
                actions.push(Action::DispatchTool {
                    call_id,
                    tool: call.name.clone(),
                });
            }
            Decision::Denied => {
                let message = if reason.is_empty() {
                    "denied by a human".to_string()
                } else {
                    reason
                };
                actions.push(Action::Emit(NewEvent::engine(
                    TOOL_FAILED,
                    ToolFailed {
                        call_id,
                        attempt: 0,
                        error: ErrorData::new("ApprovalDenied", message),
                    },
                )));
            }
            // The run ends right after (deadline or cancel).
            Decision::Expired => call.phase = Phase::Done,
            Decision::Edited => unreachable!("aaa.approval.edited is folded above"),
        }
        Ok(())
    }

    /// The run ended: completed, failed or cancelled.
    fn run_ended(&mut self, status: Status, actions: &mut Vec<Action>) {
        self.status = status;
        self.model_call = None;
        if let Some(due_ms) = self.spec.deadline_at_ms {
            actions.push(Action::CancelTimer {
                due_ms,
                name: DEADLINE_TIMER.to_string(),
            });
        }
        for call in &mut self.calls {
            call.cancel_wait_timers(actions);
            if let Phase::Backoff { until_ms } = call.phase {
                actions.push(Action::CancelTimer {
                    due_ms: until_ms,
                    name: format!("{RETRY_TIMER}{}", call.call_id),
                });
            }
            if call.phase == Phase::AwaitingApproval {
                actions.push(Action::ApprovalResolved {
                    call_id: call.call_id.clone(),
                });
            }
            if call.phase != Phase::Done {
                call.phase = Phase::Done;
            }
        }
    }

    /// What a standing grant would stand in for, given the policy's
    /// verdict: a call that waits for a person (gated and unmatched, or
    /// under a `require` rule), with the approvals and approver groups it
    /// needs. None when the policy decided (allow, deny), when a rule
    /// failed (a person must look), or when nobody needs to approve.
    pub fn grant_ask(&self, call_id: &str, verdict: &Verdict) -> Option<GrantAsk<'_>> {
        let call = self.call(call_id)?;
        let needs = match verdict {
            Verdict::NoMatch if call.phase == Phase::AwaitingApproval => Requirements::default(),
            Verdict::Decided {
                decide: Decide::Require(needs),
                ..
            } => needs.clone(),
            _ => return None,
        };
        Some(GrantAsk {
            tool: &call.name,
            arguments: &call.arguments,
            approvals_required: needs.approvals_required.unwrap_or(call.approvals_required),
            approvers: needs.approvers.unwrap_or_else(|| call.approvers.clone()),
        })
    }

    /// What follows a valid call's request, given the approval policy's
    /// verdict (`NoMatch` without a policy) and the standing grant the
    /// engine found for it: a request for a human decision, a grant or
    /// denial by the policy's rule, a grant by the standing grant, or the
    /// dispatch of a call nobody needs to approve. `sha256` is the policy
    /// file's. The grant comes in as data (found by the engine, which
    /// counts its uses), so the fold stays pure: a replay reads the
    /// recorded event and never looks at grants.
    pub fn review(
        &self,
        call_id: &str,
        verdict: &Verdict,
        sha256: &str,
        granted: Option<&GrantStamp>,
        now: i64,
    ) -> Vec<Action> {
        let Some(call) = self.call(call_id) else {
            return Vec::new();
        };
        if let Some(grant) = granted.filter(|_| self.grant_ask(call_id, verdict).is_some()) {
            let policy = match verdict {
                Verdict::Decided { rule, .. } => Some(PolicyStamp {
                    rule: rule.clone(),
                    sha256: sha256.to_string(),
                    error: String::new(),
                }),
                _ => None,
            };
            let event = NewEvent::engine(
                APPROVAL_GRANTED,
                ApprovalGranted {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments_sha256: Some(sha256_hex(&call.arguments)),
                    comment: None,
                    approver: None,
                    approvers: Vec::new(),
                    policy,
                    grant: Some(grant.clone()),
                },
            )
            .by(Actor::Grant(grant.id.clone()));
            return vec![Action::Emit(event)];
        }
        let gated = call.phase == Phase::AwaitingApproval;
        let stamp = |rule: &str, error: &str| PolicyStamp {
            rule: rule.to_string(),
            sha256: sha256.to_string(),
            error: error.to_string(),
        };
        let dispatch = || Action::DispatchTool {
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
        };
        let event = match verdict {
            Verdict::NoMatch if !gated => return vec![dispatch()],
            Verdict::NoMatch => self.approval_request(call, &Requirements::default(), None, now),
            Verdict::Decided {
                decide: Decide::Allow,
                ..
            } if !gated => return vec![dispatch()],
            Verdict::Decided {
                rule,
                decide: Decide::Allow,
            } => NewEvent::engine(
                APPROVAL_GRANTED,
                ApprovalGranted {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments_sha256: Some(sha256_hex(&call.arguments)),
                    comment: None,
                    approver: None,
                    approvers: Vec::new(),
                    policy: Some(stamp(rule, "")),
                    grant: None,
                },
            )
            .by(Actor::Policy(rule.clone())),
            Verdict::Decided {
                rule,
                decide: Decide::Deny { reason },
            } => NewEvent::engine(
                APPROVAL_DENIED,
                ApprovalDenied {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    reason: reason.clone(),
                    arguments_sha256: Some(sha256_hex(&call.arguments)),
                    approver: None,
                    policy: Some(stamp(rule, "")),
                },
            )
            .by(Actor::Policy(rule.clone())),
            Verdict::Decided {
                rule,
                decide: Decide::Require(needs),
            } => self.approval_request(call, needs, Some(stamp(rule, "")), now),
            // Fail safe: a person decides, with the tool's requirements.
            Verdict::Failed { rule, error } => self.approval_request(
                call,
                &Requirements::default(),
                Some(stamp(rule, error)),
                now,
            ),
        };
        vec![Action::Emit(event)]
    }

    /// The `aaa.approval.requested` of a call: the tool's requirements,
    /// with what a policy rule set in their place.
    fn approval_request(
        &self,
        call: &Call,
        needs: &Requirements,
        policy: Option<PolicyStamp>,
        now: i64,
    ) -> NewEvent {
        let spec = call.spec.as_ref();
        let timeout = needs
            .approval_timeout_s
            .unwrap_or_else(|| spec.map_or(0.0, |s| s.approval_timeout_s));
        let timeout_due = (timeout > 0.0).then(|| seconds::after_ms(now, timeout));
        let expires_at_ms = match (timeout_due, self.spec.deadline_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        NewEvent::engine(
            APPROVAL_REQUESTED,
            ApprovalRequested {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments_sha256: sha256_hex(&call.arguments),
                arguments: call.arguments.clone(),
                expires_at_ms,
                approvals_required: needs.approvals_required.unwrap_or(call.approvals_required),
                edited_from: call.edited_from.clone(),
                approvers: needs
                    .approvers
                    .clone()
                    .unwrap_or_else(|| call.approvers.clone()),
                approval_timeout_s: needs.approval_timeout_s,
                nudging: needs.nudging(spec.map(|s| &s.nudging)),
                policy,
            },
        )
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

    /// After a tool result: when every call of the turn is done, ask the
    /// model again (or fail the run when its budget is spent).
    fn next_turn(&self, actions: &mut Vec<Action>) {
        if self.is_finished()
            || self.model_call.is_some()
            || self.calls.iter().any(|c| c.phase != Phase::Done)
        {
            return;
        }
        let event = if self.tokens_spent() {
            self.tokens_exceeded()
        } else if self.model_calls >= self.spec.budget.max_model_calls {
            NewEvent::engine(
                RUN_FAILED,
                RunFailed {
                    error: ErrorData::new(
                        "BudgetExceeded",
                        format!(
                            "the run called its model {} times, its budget's max_model_calls",
                            self.model_calls
                        ),
                    ),
                },
            )
        } else {
            NewEvent::engine(
                LLM_REQUESTED,
                LlmRequested {
                    call_id: format!("llm-{}", self.model_calls + 1),
                    model: self.spec.model.name(),
                    attempt: 1,
                    previous_error: None,
                },
            )
        };
        actions.push(Action::Emit(event));
    }

    fn scripted_reply(&self, call_id: String, step: ScriptStep) -> NewEvent {
        let message = match step {
            ScriptStep::Text(content) => AssistantMessage {
                content,
                tool_calls: Vec::new(),
            },
            ScriptStep::Echo => AssistantMessage {
                content: self
                    .messages
                    .last()
                    .map(|m| m.content().to_string())
                    .unwrap_or_default(),
                tool_calls: Vec::new(),
            },
            ScriptStep::ToolCalls(calls) => AssistantMessage {
                content: String::new(),
                tool_calls: self.name_calls(calls),
            },
        };
        let completed = LlmCompleted::new(call_id, message, ReplyFacts::default());
        NewEvent::engine(LLM_COMPLETED, completed)
    }

    /// Gives proposed tool calls their run-unique ids.
    pub fn name_calls(&self, calls: Vec<ProposedCall>) -> Vec<ToolCallData> {
        calls
            .into_iter()
            .enumerate()
            .map(|(i, call)| ToolCallData {
                call_id: format!("call-{}", self.calls.len() + i + 1),
                name: call.name,
                arguments: call.arguments,
            })
            .collect()
    }

    fn ensure_running(&self) -> Result<(), Error> {
        if self.is_finished() {
            return Err(Error::RunFinished(self.id.to_string()));
        }
        Ok(())
    }

    /// An approval decision from a client: a grant (or a vote towards
    /// one), a denial or an edit. Each may be bound to the digest of the
    /// arguments the reviewer saw.
    pub fn decide_approval(
        &self,
        event_type: &str,
        data: &Value,
        reviewer: &Reviewer,
    ) -> Result<DecisionOutcome, Error> {
        if reviewer.separation_of_duties
            && !reviewer.principal.is_empty()
            && self.started_by == reviewer.principal
        {
            return Err(crate::auth::Refusal::SeparationOfDuties {
                principal: reviewer.principal.clone(),
                run: self.id.to_string(),
            }
            .into());
        }
        let call_id = data
            .get("call_id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                Error::invalid(
                    "data_json.call_id",
                    "a decision needs the call_id it decides",
                )
            })?;
        let call = self
            .call(call_id)
            .filter(|c| c.approval_seq > 0)
            .ok_or_else(|| Error::CallNotFound {
                run: self.id.to_string(),
                call: call_id.to_string(),
            })?;
        if let Some(decision) = call.decision {
            return Ok(DecisionOutcome::AlreadyDecided(decision));
        }
        if !may_decide(reviewer.groups.as_deref(), &call.approvers) {
            return Err(crate::auth::Refusal::NotAnApproverForCall {
                principal: reviewer.principal.clone(),
                call: call_id.to_string(),
                groups: call.approvers.clone(),
            }
            .into());
        }
        let parse = |what: &str| {
            let what = what.to_string();
            move |e: serde_json::Error| {
                Error::invalid("data_json", format!("not a valid {what}: {e}"))
            }
        };
        let decided = match event_type {
            APPROVAL_GRANTED => {
                let grant: ApprovalGranted =
                    serde_json::from_value(data.clone()).map_err(parse("grant"))?;
                check_digest(call, grant.arguments_sha256.as_deref())?;
                let approver = reviewer.approver(grant.approver.as_deref())?;
                if call.votes.iter().any(|v| v.approver == approver) {
                    return Err(Error::AlreadyVoted {
                        call: call_id.to_string(),
                        approver,
                    });
                }
                let event = vote_event(call, approver, grant.arguments_sha256, grant.comment);
                Decided {
                    recorded: if event.event_type == APPROVAL_GRANTED {
                        APPROVAL_GRANTED
                    } else {
                        APPROVAL_VOTED
                    },
                    events: vec![event.by(reviewer.actor.clone())],
                    votes: call.votes.len() as u32 + 1,
                    approvals_required: call.approvals_required,
                    ..Decided::default()
                }
            }
            APPROVAL_DENIED => {
                let mut denied: ApprovalDenied =
                    serde_json::from_value(data.clone()).map_err(parse("denial"))?;
                check_digest(call, denied.arguments_sha256.as_deref())?;
                if call.approvals_required > 1 {
                    denied.approver = Some(reviewer.approver(denied.approver.as_deref())?);
                }
                denied.name = call.name.clone();
                Decided {
                    events: vec![
                        NewEvent::engine(APPROVAL_DENIED, denied).by(reviewer.actor.clone())
                    ],
                    recorded: APPROVAL_DENIED,
                    ..Decided::default()
                }
            }
            APPROVAL_EDITED => self.decide_edit(call, data, reviewer)?,
            other => {
                return Err(Error::Internal(format!(
                    "decide_approval called with {other}"
                )))
            }
        };
        Ok(DecisionOutcome::Append(decided))
    }

    /// An edit: the call is resolved as edited and a new call with the
    /// reviewer's arguments takes its place (checked against the schema
    /// here, so a reviewer's typo is refused rather than recorded).
    fn decide_edit(
        &self,
        call: &Call,
        data: &Value,
        reviewer: &Reviewer,
    ) -> Result<Decided, Error> {
        let edit: EditRequest = serde_json::from_value(data.clone())
            .map_err(|e| Error::invalid("data_json", format!("not a valid edit: {e}")))?;
        check_digest(call, edit.arguments_sha256.as_deref())?;
        if !edit.arguments.is_object() {
            return Err(Error::invalid(
                "data_json.arguments",
                "the edited arguments must be a JSON object",
            ));
        }
        if edit.arguments == call.arguments {
            return Err(Error::invalid(
                "data_json.arguments",
                "these are the arguments requested; grant the call instead of editing it",
            ));
        }
        if let Some(spec) = &call.spec {
            let violations = super::schema::violations(&spec.parameters, &edit.arguments);
            if !violations.is_empty() {
                return Err(Error::invalid(
                    "data_json.arguments",
                    format!(
                        "the edited arguments do not match {}'s parameters schema: {}",
                        call.name,
                        violations.join("; ")
                    ),
                ));
            }
        }
        let approver = if edit.grant {
            reviewer.approver(edit.approver.as_deref())?
        } else {
            String::new()
        };
        let new_call_id = format!("call-{}", self.calls.len() + 1);
        let new_arguments_sha256 = sha256_hex(&edit.arguments);
        let event = NewEvent::engine(
            APPROVAL_EDITED,
            ApprovalEdited {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments_sha256: sha256_hex(&call.arguments),
                new_call_id: new_call_id.clone(),
                new_arguments: edit.arguments,
                new_arguments_sha256: new_arguments_sha256.clone(),
                reason: edit.reason,
                grant: edit.grant,
                approver,
                approver_groups: reviewer.groups.clone(),
            },
        );
        Ok(Decided {
            events: vec![event.by(reviewer.actor.clone())],
            recorded: APPROVAL_EDITED,
            votes: u32::from(edit.grant),
            approvals_required: call.approvals_required,
            new_call_id,
            new_arguments_sha256,
        })
    }

    /// Expires pending approvals, for a run about to end.
    fn expire_approvals(&self, reason: &str) -> Vec<NewEvent> {
        self.calls
            .iter()
            .filter(|c| c.phase == Phase::AwaitingApproval)
            .map(|c| {
                NewEvent::engine(
                    APPROVAL_EXPIRED,
                    ApprovalExpired {
                        call_id: c.call_id.clone(),
                        name: c.name.clone(),
                        reason: reason.to_string(),
                    },
                )
            })
            .collect()
    }

    /// CancelRun. Cancelling a cancelled run changes nothing.
    pub fn decide_cancel(&self, reason: &str, actor: Actor) -> Result<Vec<NewEvent>, Error> {
        if let Status::Cancelled(_) = self.status {
            return Ok(Vec::new());
        }
        self.ensure_running()?;
        let mut events = self.expire_approvals("run_cancelled");
        events.push(
            NewEvent::engine(
                RUN_CANCELLED,
                RunCancelled {
                    reason: reason.to_string(),
                },
            )
            .by(actor),
        );
        Ok(events)
    }

    /// A durable timer fired.
    pub fn decide_timer(&self, name: &str, now_ms: i64) -> Vec<NewEvent> {
        if self.is_finished() {
            return Vec::new();
        }
        if name == DEADLINE_TIMER {
            let mut events = self.expire_approvals("deadline");
            events.push(NewEvent::engine(
                RUN_FAILED,
                RunFailed {
                    error: ErrorData::new(
                        "DeadlineExceeded",
                        format!(
                            "the run's deadline of {} s passed",
                            self.spec.budget.deadline_s
                        ),
                    ),
                },
            ));
            return events;
        }
        if let Some(call_id) = name.strip_prefix(APPROVAL_TIMER) {
            if let Some(call) = self.call(call_id) {
                if call.phase == Phase::AwaitingApproval && call.decision.is_none() {
                    return vec![NewEvent::engine(
                        APPROVAL_DENIED,
                        ApprovalDenied {
                            call_id: call_id.to_string(),
                            name: call.name.clone(),
                            reason: "timeout".to_string(),
                            arguments_sha256: None,
                            approver: None,
                            policy: None,
                        },
                    )];
                }
            }
        }
        let waiting =
            |call: &Call| call.phase == Phase::AwaitingApproval && call.decision.is_none();
        let waiting_s = |call: &Call| (now_ms - call.requested_ms).max(0) as f64 / 1000.0;
        if let Some(call_id) = name.strip_prefix(REMIND_TIMER) {
            if let Some(call) = self.call(call_id).filter(|c| waiting(c)) {
                return vec![NewEvent::engine(
                    APPROVAL_REMINDED,
                    ApprovalReminded {
                        call_id: call_id.to_string(),
                        name: call.name.clone(),
                        reminder: call.nudges.reminded + 1,
                        reminders: call.nudges.reminders,
                        waiting_s: waiting_s(call),
                    },
                )];
            }
        }
        if let Some(call_id) = name.strip_prefix(ESCALATE_TIMER) {
            if let Some(call) = self.call(call_id).filter(|c| waiting(c)) {
                // Widen: add escalate_to to the groups. A call any approver
                // may decide stays so (adding groups would narrow it).
                let mut approvers = call.approvers.clone();
                if !approvers.is_empty() {
                    approvers.extend(call.nudges.escalate_to.iter().cloned());
                    approvers.sort();
                    approvers.dedup();
                }
                return vec![NewEvent::engine(
                    APPROVAL_ESCALATED,
                    ApprovalEscalated {
                        call_id: call_id.to_string(),
                        name: call.name.clone(),
                        approvers,
                        waiting_s: waiting_s(call),
                    },
                )];
            }
        }
        // Retry timers need no event: a call in backoff becomes dispatchable
        // by itself once `until_ms` passes (see `dispatchable`).
        Vec::new()
    }

    /// Calls a worker may take now, and the pending model call.
    pub fn dispatchable(&self, now_ms: i64) -> Vec<Action> {
        if self.is_finished() {
            return Vec::new();
        }
        let mut out: Vec<Action> = self
            .calls
            .iter()
            .filter(|c| match c.phase {
                Phase::Ready => true,
                Phase::Backoff { until_ms } => until_ms <= now_ms,
                _ => false,
            })
            .map(|c| Action::DispatchTool {
                call_id: c.call_id.clone(),
                tool: c.name.clone(),
            })
            .collect();
        match (&self.model_call, &self.spec.model) {
            (Some(call), ModelChoice::Worker(model)) => out.push(Action::DispatchModel {
                call_id: call.call_id.clone(),
                model: model.clone(),
            }),
            (Some(call), ModelChoice::Openai(_)) => out.push(Action::DispatchBuiltinModel {
                call_id: call.call_id.clone(),
            }),
            _ => {}
        }
        out
    }

    /// The call, if its next attempt may start now.
    pub fn startable(&self, call_id: &str, now_ms: i64) -> Option<&Call> {
        let call = self.call(call_id)?;
        let ready = match call.phase {
            Phase::Ready => true,
            Phase::Backoff { until_ms } => until_ms <= now_ms,
            _ => false,
        };
        if self.is_finished() || !ready {
            return None;
        }
        // The gate, checked once more where it matters: a gated call runs only
        // with a grant in the log.
        let gated =
            call.approval_seq > 0 || call.spec.as_ref().is_some_and(|s| s.requires_approval);
        if gated && call.decision != Some(Decision::Granted) {
            return None;
        }
        Some(call)
    }

    /// A worker asks to start the call: the next attempt, if it may run now.
    pub fn decide_tool_start(
        &self,
        call_id: &str,
        worker: &WorkerId,
        now_ms: i64,
    ) -> Option<NewEvent> {
        let call = self.startable(call_id, now_ms)?;
        Some(
            NewEvent::engine(
                TOOL_STARTED,
                ToolStarted {
                    call_id: call_id.to_string(),
                    attempt: call.attempt + 1,
                    worker: worker.identity.clone(),
                },
            )
            .by(Actor::Worker(worker.clone())),
        )
    }

    /// Checks that `attempt` is the running attempt of `call_id`.
    pub fn check_tool_attempt(&self, call_id: &str, attempt: u32) -> Result<&Call, Error> {
        self.ensure_running()?;
        let call = self.call(call_id).ok_or_else(|| Error::CallNotFound {
            run: self.id.to_string(),
            call: call_id.to_string(),
        })?;
        if call.phase != Phase::Running || call.attempt != attempt {
            return Err(Error::StaleAttempt {
                call: call_id.to_string(),
                attempt,
            });
        }
        Ok(call)
    }

    /// A worker's result for a tool attempt, or a lost lease.
    pub fn decide_tool_outcome(
        &self,
        call_id: &str,
        attempt: u32,
        outcome: ToolOutcome,
        actor: Actor,
    ) -> Result<NewEvent, Error> {
        let call = self.check_tool_attempt(call_id, attempt)?;
        let event = match outcome {
            ToolOutcome::Output(output) => NewEvent::engine(
                TOOL_COMPLETED,
                ToolCompleted {
                    call_id: call_id.to_string(),
                    attempt,
                    output,
                },
            ),
            ToolOutcome::Failure { error, retryable } => {
                let retry = call.spec.as_ref().map(|s| &s.retry);
                match retry {
                    Some(retry) if retryable && attempt < retry.max_attempts => NewEvent::engine(
                        TOOL_RETRYING,
                        ToolRetrying {
                            call_id: call_id.to_string(),
                            attempt,
                            error,
                            delay_s: retry.delay_after(attempt),
                        },
                    ),
                    _ => NewEvent::engine(
                        TOOL_FAILED,
                        ToolFailed {
                            call_id: call_id.to_string(),
                            attempt,
                            error,
                        },
                    ),
                }
            }
        };
        Ok(event.by(actor))
    }

    /// Checks that `call_id`/`attempt` is the model call the run waits for.
    pub fn check_model_attempt(&self, call_id: &str, attempt: u32) -> Result<(), Error> {
        self.ensure_running()?;
        match &self.model_call {
            Some(pending) if pending.call_id == call_id && pending.attempt == attempt => Ok(()),
            _ => Err(Error::StaleAttempt {
                call: call_id.to_string(),
                attempt,
            }),
        }
    }

    /// A model's reply.
    pub fn decide_model_reply(
        &self,
        call_id: &str,
        attempt: u32,
        content: String,
        calls: Vec<ProposedCall>,
        facts: ReplyFacts,
        actor: Actor,
    ) -> Result<NewEvent, Error> {
        self.check_model_attempt(call_id, attempt)?;
        let message = AssistantMessage {
            content,
            tool_calls: self.name_calls(calls),
        };
        let completed = LlmCompleted::new(call_id.to_string(), message, facts);
        Ok(NewEvent::engine(LLM_COMPLETED, completed).by(actor))
    }

    /// A worker-served model call found waiting when a server starts
    /// serving its run: the server before may have handed its attempt out
    /// (model attempts are leased in memory, unlike tools' whose start is
    /// an event), and that worker may still hold it. It is requested again
    /// as the next attempt, so the old holder's results are refused as
    /// stale and no attempt ever has two holders. Not a failure: it does
    /// not count against the model's attempts.
    pub fn decide_model_reoffer(&self, call_id: &str, attempt: u32) -> Result<NewEvent, Error> {
        self.check_model_attempt(call_id, attempt)?;
        Ok(NewEvent::engine(
            LLM_REQUESTED,
            LlmRequested {
                call_id: call_id.to_string(),
                model: self.spec.model.name(),
                attempt: attempt + 1,
                previous_error: None,
            },
        ))
    }

    /// A model attempt failed (reported, or its lease was lost).
    pub fn decide_model_failure(
        &self,
        call_id: &str,
        attempt: u32,
        error: ErrorData,
        retryable: bool,
        actor: Actor,
    ) -> Result<NewEvent, Error> {
        self.check_model_attempt(call_id, attempt)?;
        let event = if retryable && attempt < self.spec.model.max_attempts() {
            // Worker-served models keep their logs as before: no error.
            let previous_error = matches!(self.spec.model, ModelChoice::Openai(_)).then_some(error);
            NewEvent::engine(
                LLM_REQUESTED,
                LlmRequested {
                    call_id: call_id.to_string(),
                    model: self.spec.model.name(),
                    attempt: attempt + 1,
                    previous_error,
                },
            )
        } else {
            NewEvent::engine(
                LLM_FAILED,
                LlmFailed {
                    call_id: call_id.to_string(),
                    attempt,
                    error,
                },
            )
        };
        Ok(event.by(actor))
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

/// A grant by `approver`: the call's `aaa.approval.granted` when it is the
/// last one the call needs, else an `aaa.approval.voted`.
fn vote_event(
    call: &Call,
    approver: String,
    arguments_sha256: Option<String>,
    comment: Option<String>,
) -> NewEvent {
    let votes = call.votes.len() as u32 + 1;
    if votes < call.approvals_required {
        return NewEvent::engine(
            APPROVAL_VOTED,
            ApprovalVoted {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments_sha256: sha256_hex(&call.arguments),
                approver,
                comment,
                votes,
                approvals_required: call.approvals_required,
            },
        );
    }
    let approvers = if call.approvals_required > 1 {
        call.votes
            .iter()
            .map(|v| v.approver.clone())
            .chain([approver.clone()])
            .collect()
    } else {
        Vec::new()
    };
    NewEvent::engine(
        APPROVAL_GRANTED,
        ApprovalGranted {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments_sha256,
            comment,
            approver: (call.approvals_required > 1).then_some(approver),
            approvers,
            policy: None,
            grant: None,
        },
    )
}

/// Refuses a decision bound to other arguments than the call's.
fn check_digest(call: &Call, expected: Option<&str>) -> Result<(), Error> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let actual = sha256_hex(&call.arguments);
    if !expected.eq_ignore_ascii_case(&actual) {
        return Err(Error::ArgumentsMismatch {
            call: call.call_id.clone(),
            expected: expected.to_string(),
            actual,
        });
    }
    Ok(())
}

/// What the model reads before an edited call's result.
fn edit_note(arguments: &Value, reason: &str) -> String {
    let why = if reason.is_empty() {
        String::new()
    } else {
        format!(" (reason: {reason})")
    };
    format!(
        "[a reviewer changed the arguments to {}{why} before the call ran] ",
        canonical_json(arguments)
    )
}

/// A call that ends before any attempt (an unknown tool, arguments that
/// do not fit): its failure, for the model to read.
fn fail_unstarted(call_id: String, error_type: &str, message: String) -> Action {
    Action::Emit(NewEvent::engine(
        TOOL_FAILED,
        ToolFailed {
            call_id,
            attempt: 0,
            error: ErrorData::new(error_type, message),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire_money(gated: bool) -> ToolSpec {
        ToolSpec {
            name: "wire_money".into(),
            description: String::new(),
            parameters: json!({}),
            requires_approval: gated,
            retry: RetrySpec {
                max_attempts: 2,
                initial_backoff_s: 1.0,
                backoff_coefficient: 2.0,
                max_backoff_s: 60.0,
            },
            heartbeat_timeout_s: 0.0,
            approval_timeout_s: 0.0,
            approvals_required: 1,
            approvers: Vec::new(),
            nudging: Default::default(),
            gate_changed: None,
        }
    }

    fn reviewer(name: &str) -> Reviewer {
        Reviewer {
            actor: Actor::Client(name.into()),
            principal: String::new(),
            separation_of_duties: false,
            groups: None,
        }
    }

    fn record(seq: u64, event: &NewEvent) -> EventRecord {
        EventRecord {
            run_id: vec![1; 16],
            seq,
            position: seq,
            id: vec![],
            event_type: event.event_type.clone(),
            data_json: canonical_json(&event.data),
            time_ms: 1_000,
            actor_kind: event.actor.kind(),
            actor_name: event.actor.name().to_string(),
            actor_principal: event.actor.principal().to_string(),
        }
    }

    thread_local! {
        /// Every record this test's folds applied, the run's start included.
        static FOLDED: std::cell::RefCell<Vec<EventRecord>> = Default::default();
    }

    /// Folds `events` like the driver does (follow-ups included) and returns
    /// the non-emit actions.
    fn fold(state: &mut RunState, events: Vec<NewEvent>, log: &mut Vec<String>) -> Vec<Action> {
        let mut queue: std::collections::VecDeque<NewEvent> = events.into();
        let mut effects = Vec::new();
        while let Some(event) = queue.pop_front() {
            log.push(event.event_type.clone());
            let record = record(state.last_seq + 1, &event);
            FOLDED.with(|folded| folded.borrow_mut().push(record.clone()));
            let mut actions: std::collections::VecDeque<Action> =
                state.apply(&record).unwrap().into();
            while let Some(action) = actions.pop_front() {
                match action {
                    Action::Emit(next) => queue.push_back(next),
                    // No policy: what the call's tool says.
                    Action::Review { call_id } => actions.extend(state.review(
                        &call_id,
                        &Verdict::NoMatch,
                        "",
                        None,
                        record.time_ms,
                    )),
                    other => effects.push(other),
                }
            }
        }
        effects
    }

    /// A run of the scripted reference scenario, folded up to its approval request.
    fn started(gated: bool) -> (RunState, Vec<String>, Vec<Action>) {
        started_with(wire_money(gated))
    }

    fn started_with(tool: ToolSpec) -> (RunState, Vec<String>, Vec<Action>) {
        let steps = vec![
            ScriptStep::ToolCalls(vec![ProposedCall {
                name: "wire_money".into(),
                arguments: serde_json::from_str(r#"{"amount":250,"to":"ACME"}"#).unwrap(),
            }]),
            ScriptStep::Echo,
        ];
        let start = NewEvent::engine(
            RUN_STARTED,
            RunStarted {
                task: "Pay ACME $250".into(),
                system: String::new(),
                model: ModelChoice::Scripted(steps),
                tools: vec![tool],
                budget: Budget {
                    deadline_s: 0.0,
                    max_model_calls: 5,
                    max_tokens: 0,
                },
                labels: Default::default(),
                deadline_at_ms: None,
                traceparent: None,
            },
        );
        let id = RunId::from_slice(&[1; 16]).unwrap();
        let first = record(1, &start);
        FOLDED.with(|folded| *folded.borrow_mut() = vec![first.clone()]);
        let (mut state, actions) = RunState::start(id, &first).unwrap();
        let mut log = vec![RUN_STARTED.to_string()];
        let follow_ups = actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Emit(e) => Some(e),
                _ => None,
            })
            .collect();
        let effects = fold(&mut state, follow_ups, &mut log);
        (state, log, effects)
    }

    /// A call that does not fit its tool's schema fails before anyone is
    /// asked; the model is called again with the failure (the scripted one
    /// echoes it and completes).
    #[test]
    fn a_call_that_does_not_fit_the_schema_fails_before_any_approval() {
        let mut tool = wire_money(true);
        tool.parameters = json!({"properties": {"amount": {"type": "string"}}});
        let (state, log, effects) = started_with(tool);
        assert_eq!(
            log[3..],
            [
                TOOL_REQUESTED,
                TOOL_FAILED,
                LLM_REQUESTED,
                LLM_COMPLETED,
                RUN_COMPLETED
            ],
            "{log:?}"
        );
        assert!(
            !effects
                .iter()
                .any(|a| matches!(a, Action::ApprovalPending { .. })),
            "{effects:?}"
        );
        assert_eq!(state.call("call-1").unwrap().phase, Phase::Done);
    }

    /// A log written before schemas were checked (a request, then its
    /// approval request, for arguments the schema refuses) replays as it
    /// was: the call still waits for its decision.
    #[test]
    fn an_older_log_replays_as_it_was_written() {
        started(true);
        let strict = {
            let mut tool = wire_money(true);
            tool.parameters = json!({"properties": {"amount": {"type": "string"}}});
            tool
        };
        // The same history, with the strict schema in its snapshot.
        let id = RunId::from_slice(&[1; 16]).unwrap();
        let mut events = FOLDED.with(|folded| folded.borrow().clone());
        let mut started: RunStarted = serde_json::from_str(&events[0].data_json).unwrap();
        started.tools = vec![strict];
        events[0].data_json = canonical_json(&serde_json::to_value(&started).unwrap());
        let replayed = RunState::replay(id, &events).unwrap();
        assert_eq!(
            replayed.call("call-1").unwrap().phase,
            Phase::AwaitingApproval
        );
        assert_eq!(replayed.status_code(), 2, "waiting for approval");
    }

    /// A snapshot an older version accepted (no upper bound then) arms its
    /// timer far ahead, instead of wrapping it into the past.
    #[test]
    fn a_huge_stored_approval_timeout_saturates_instead_of_wrapping() {
        let mut tool = wire_money(true);
        tool.approval_timeout_s = 1e300;
        let (_, log, effects) = started_with(tool);
        assert_eq!(log.last().map(String::as_str), Some(APPROVAL_REQUESTED));
        let due = effects
            .iter()
            .find_map(|a| match a {
                Action::ArmTimer { due_ms, .. } => Some(*due_ms),
                _ => None,
            })
            .expect("an approval timer");
        assert!(due > 1_000 + 3_000_000_000_000, "due at {due}");
    }

    #[test]
    fn a_gated_call_waits_for_a_grant_and_then_runs_with_its_arguments() {
        let (mut state, mut log, effects) = started(true);
        assert_eq!(
            log,
            [
                RUN_STARTED,
                LLM_REQUESTED,
                LLM_COMPLETED,
                TOOL_REQUESTED,
                APPROVAL_REQUESTED
            ]
        );
        assert_eq!(
            effects,
            [Action::ApprovalPending {
                call_id: "call-1".into()
            }]
        );
        assert_eq!(state.status_code(), 2, "waiting for approval");
        assert!(
            state.decide_tool_start("call-1", &"w".into(), 0).is_none(),
            "no attempt before the grant"
        );

        let grant = json!({"call_id": "call-1"});
        let DecisionOutcome::Append(decided) = state
            .decide_approval(APPROVAL_GRANTED, &grant, &reviewer("c"))
            .unwrap()
        else {
            panic!("first decision must append")
        };
        let effects = fold(&mut state, decided.events, &mut log);
        assert!(effects.contains(&Action::DispatchTool {
            call_id: "call-1".into(),
            tool: "wire_money".into()
        }));
        assert!(matches!(
            state.decide_approval(APPROVAL_DENIED, &grant, &reviewer("c")),
            Ok(DecisionOutcome::AlreadyDecided(Decision::Granted))
        ));

        let start = state
            .decide_tool_start("call-1", &"w".into(), 0)
            .expect("granted call starts");
        fold(&mut state, vec![start], &mut log);
        let done = state
            .decide_tool_outcome(
                "call-1",
                1,
                ToolOutcome::Output(json!("sent $250 to ACME")),
                Actor::Engine,
            )
            .unwrap();
        fold(&mut state, vec![done], &mut log);
        assert_eq!(
            &log[5..],
            [
                APPROVAL_GRANTED,
                TOOL_STARTED,
                TOOL_COMPLETED,
                LLM_REQUESTED,
                LLM_COMPLETED,
                RUN_COMPLETED
            ]
        );
        assert_eq!(
            state.status,
            Status::Completed(json!({"text": "sent $250 to ACME"}))
        );
    }

    #[test]
    fn a_denial_becomes_an_approval_denied_tool_failure_the_model_reads() {
        let (mut state, mut log, _) = started(true);
        let deny = json!({"call_id": "call-1", "reason": "not this vendor"});
        let DecisionOutcome::Append(decided) = state
            .decide_approval(APPROVAL_DENIED, &deny, &reviewer("c"))
            .unwrap()
        else {
            panic!("first decision must append")
        };
        fold(&mut state, decided.events, &mut log);
        assert_eq!(&log[5..7], [APPROVAL_DENIED, TOOL_FAILED]);
        let tool_message = state
            .messages()
            .iter()
            .find(|m| matches!(m, Message::Tool { .. }))
            .unwrap();
        let Message::Tool { error, .. } = tool_message else {
            unreachable!()
        };
        assert_eq!(
            error.as_ref().unwrap(),
            &ErrorData::new("ApprovalDenied", "not this vendor")
        );
        // Echo step: the model's reply is the failure text.
        assert_eq!(
            state.status,
            Status::Completed(json!({"text": "ApprovalDenied: not this vendor"}))
        );
    }

    #[test]
    fn results_of_superseded_attempts_are_refused_and_retries_follow_the_policy() {
        let (mut state, mut log, effects) = started(false);
        assert!(effects
            .iter()
            .any(|a| matches!(a, Action::DispatchTool { .. })));
        let start = state.decide_tool_start("call-1", &"w".into(), 0).unwrap();
        fold(&mut state, vec![start], &mut log);
        let lost = ToolOutcome::Failure {
            error: ErrorData::new("AttemptLost", "no heartbeat"),
            retryable: true,
        };
        let retry = state
            .decide_tool_outcome("call-1", 1, lost, Actor::Engine)
            .unwrap();
        assert_eq!(retry.event_type, TOOL_RETRYING);
        fold(&mut state, vec![retry], &mut log);
        assert!(
            state
                .decide_tool_start("call-1", &"w".into(), 1_000)
                .is_none(),
            "backoff not over"
        );
        let second = state
            .decide_tool_start("call-1", &"w".into(), 2_000)
            .unwrap();
        fold(&mut state, vec![second], &mut log);
        assert!(matches!(
            state.decide_tool_outcome("call-1", 1, ToolOutcome::Output(json!(1)), Actor::Engine),
            Err(Error::StaleAttempt { attempt: 1, .. })
        ));
        let last = ToolOutcome::Failure {
            error: ErrorData::new("Boom", "again"),
            retryable: true,
        };
        let failed = state
            .decide_tool_outcome("call-1", 2, last, Actor::Engine)
            .unwrap();
        assert_eq!(failed.event_type, TOOL_FAILED, "max_attempts 2 reached");
    }

    /// An edit granted in the same step, and a 2-of-2 vote, fold the same
    /// live and from the log: the fold reads only events.
    #[test]
    fn edits_and_votes_replay_as_they_were_folded() {
        let mut tool = wire_money(true);
        tool.approvals_required = 2;
        let (mut state, mut log, _) = started_with(tool);
        let edit = json!({"call_id": "call-1", "arguments": {"amount": 200, "to": "ACME"},
                          "reason": "cap", "grant": true});
        let DecisionOutcome::Append(decided) = state
            .decide_approval(APPROVAL_EDITED, &edit, &reviewer("alice"))
            .unwrap()
        else {
            panic!("an edit appends")
        };
        assert_eq!(decided.new_call_id, "call-2");
        fold(&mut state, decided.events, &mut log);
        assert_eq!(
            &log[5..],
            [
                APPROVAL_EDITED,
                TOOL_REQUESTED,
                APPROVAL_REQUESTED,
                APPROVAL_VOTED
            ]
        );
        let again = json!({"call_id": "call-2"});
        assert!(matches!(
            state.decide_approval(APPROVAL_GRANTED, &again, &reviewer("alice")),
            Err(Error::AlreadyVoted { .. })
        ));
        let DecisionOutcome::Append(decided) = state
            .decide_approval(APPROVAL_GRANTED, &again, &reviewer("bob"))
            .unwrap()
        else {
            panic!("bob's vote appends")
        };
        assert_eq!(decided.recorded, APPROVAL_GRANTED);
        fold(&mut state, decided.events, &mut log);
        let call = state.call("call-2").unwrap();
        assert_eq!(call.phase, Phase::Ready);
        assert_eq!(call.answers, "call-1");
        assert_eq!(call.arguments, json!({"amount": 200, "to": "ACME"}));
        assert_eq!(
            state.call("call-1").unwrap().decision,
            Some(Decision::Edited)
        );

        let records = FOLDED.with(|folded| folded.borrow().clone());
        let replayed = RunState::replay(state.id, &records).unwrap();
        assert_eq!(replayed.calls, state.calls);
        assert_eq!(replayed.status_code(), state.status_code());
    }
}
