//! What the log recorded as the result of one attempt, so that a worker
//! retrying CompleteTask/FailTask after a lost answer learns its result is
//! in, instead of a refusal it cannot tell from a stale attempt. Read from
//! the run's events only on that refusal path; the fold keeps nothing for it.

use serde_json::Value;

use super::{Error, Report};
use crate::domain::event::*;
use crate::domain::token::TaskKind;
use crate::store::EventRecord;

/// How a report compares with what the log holds for its attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The log holds this very result: the report was a retry.
    Same,
    /// The log holds another result, or the attempt was lost or cancelled.
    Different,
    /// The attempt has no result in the log.
    Nothing,
}

/// The result the log holds for attempt `attempt` of `call_id`.
enum Outcome {
    ToolOutput(Value),
    Failure(ErrorData),
    /// A model failure that was retried: the log keeps no error for it.
    RetriedModelFailure,
    ModelReply(AssistantMessage),
}

pub fn compare(
    events: &[EventRecord],
    kind: TaskKind,
    call_id: &str,
    attempt: u32,
    report: &Report,
) -> Result<Recorded, Error> {
    let outcome = match kind {
        TaskKind::Tool => tool_outcome(events, call_id, attempt)?,
        TaskKind::Model => model_outcome(events, call_id, attempt)?,
    };
    let Some(outcome) = outcome else {
        return Ok(Recorded::Nothing);
    };
    let same = match (outcome, report) {
        (Outcome::ToolOutput(recorded), Report::ToolOutput(output)) => &recorded == output,
        (Outcome::Failure(recorded), Report::Failure { error, .. }) => &recorded == error,
        (Outcome::RetriedModelFailure, Report::Failure { .. }) => true,
        (Outcome::ModelReply(recorded), Report::ModelReply { content, calls, .. }) => {
            recorded.content == *content
                && recorded.tool_calls.len() == calls.len()
                && recorded
                    .tool_calls
                    .iter()
                    .zip(calls)
                    .all(|(r, c)| r.name == c.name && r.arguments == c.arguments)
        }
        _ => false,
    };
    Ok(if same {
        Recorded::Same
    } else {
        Recorded::Different
    })
}

fn parse<T: serde::de::DeserializeOwned>(event: &EventRecord) -> Result<T, Error> {
    serde_json::from_str(&event.data_json).map_err(|e| {
        Error::Internal(format!(
            "event {} ({}) has undecodable data: {e}",
            event.seq, event.event_type
        ))
    })
}

fn tool_outcome(
    events: &[EventRecord],
    call_id: &str,
    attempt: u32,
) -> Result<Option<Outcome>, Error> {
    for event in events {
        let outcome = match event.event_type.as_str() {
            TOOL_COMPLETED => {
                let data: ToolCompleted = parse(event)?;
                (data.call_id == call_id && data.attempt == attempt)
                    .then_some(Outcome::ToolOutput(data.output))
            }
            TOOL_RETRYING => {
                let data: ToolRetrying = parse(event)?;
                (data.call_id == call_id && data.attempt == attempt)
                    .then_some(Outcome::Failure(data.error))
            }
            TOOL_FAILED => {
                let data: ToolFailed = parse(event)?;
                (data.call_id == call_id && data.attempt == attempt)
                    .then_some(Outcome::Failure(data.error))
            }
            _ => None,
        };
        if outcome.is_some() {
            return Ok(outcome);
        }
    }
    Ok(None)
}

/// A model call keeps its id across attempts: attempt N ended with the
/// request of attempt N + 1 (a retried failure), with `aaa.llm.failed` for
/// N, or with `aaa.llm.completed` while N was the latest attempt.
fn model_outcome(
    events: &[EventRecord],
    call_id: &str,
    attempt: u32,
) -> Result<Option<Outcome>, Error> {
    let mut latest = 0;
    for event in events {
        match event.event_type.as_str() {
            LLM_REQUESTED => {
                let data: LlmRequested = parse(event)?;
                if data.call_id == call_id {
                    if data.attempt == attempt + 1 {
                        return Ok(Some(Outcome::RetriedModelFailure));
                    }
                    latest = data.attempt;
                }
            }
            LLM_FAILED => {
                let data: LlmFailed = parse(event)?;
                if data.call_id == call_id && data.attempt == attempt {
                    return Ok(Some(Outcome::Failure(data.error)));
                }
            }
            LLM_COMPLETED => {
                let data: LlmCompleted = parse(event)?;
                if data.call_id == call_id && latest == attempt {
                    return Ok(Some(Outcome::ModelReply(data.message)));
                }
            }
            _ => {}
        }
    }
    Ok(None)
}
