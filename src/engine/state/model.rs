//! The model's turns: a model call requested, answered or failed, the
//! next turn decided, token budgets, and a worker's or the built-in
//! model's reply checked against the attempt it answers.

use super::*;

impl RunState {
    pub(super) fn worker_model_pending(&self) -> bool {
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
    pub(super) fn tokens_spent(&self) -> bool {
        let max = self.spec.budget.max_tokens;
        max > 0 && self.usage.total() >= max
    }

    pub(super) fn tokens_exceeded(&self) -> NewEvent {
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

    pub(super) fn model_requested(
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

    pub(super) fn model_replied(
        &mut self,
        e: LlmCompleted,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
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

    pub(super) fn model_failed(
        &mut self,
        e: LlmFailed,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
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

    /// After a tool result: when every call of the turn is done, ask the
    /// model again (or fail the run when its budget is spent).
    pub(super) fn next_turn(&self, actions: &mut Vec<Action>) {
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

    pub(super) fn scripted_reply(&self, call_id: String, step: ScriptStep) -> NewEvent {
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
