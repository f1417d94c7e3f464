//! Tool calls: requested (checked against the tool's schema), started,
//! retried, completed or failed, and which attempts may start or report.

use super::*;

impl RunState {
    pub(super) fn tool_requested(
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
                let violations = crate::engine::schema::violations(&spec.parameters, &e.arguments);
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

    pub(super) fn tool_started(&mut self, e: ToolStarted, now: i64) -> Result<(), Error> {
        let call = self.call_mut(&e.call_id)?;
        call.phase = Phase::Running;
        call.attempt = e.attempt;
        call.worker = e.worker;
        call.started_ms = now;
        Ok(())
    }

    pub(super) fn tool_retrying(
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

    pub(super) fn tool_completed(
        &mut self,
        e: ToolCompleted,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
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

    pub(super) fn tool_failed(
        &mut self,
        e: ToolFailed,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
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
}

/// A call that ends before any attempt (an unknown tool, arguments that
/// do not fit): its failure, for the model to read.
pub(super) fn fail_unstarted(call_id: String, error_type: &str, message: String) -> Action {
    Action::Emit(NewEvent::engine(
        TOOL_FAILED,
        ToolFailed {
            call_id,
            attempt: 0,
            error: ErrorData::new(error_type, message),
        },
    ))
}
