//! What the engine's commits tell the metrics. Each event is looked at as
//! it is folded (with the run's state from just before it), and what it
//! means is counted only once its batch is durable: a batch that fails to
//! commit counts nothing, so the gauges stay in step with the log.

use super::state::{Phase, RunState};
use crate::domain::event::*;
use crate::metrics::{
    Decision, Expiry, Families, ModelOutcome, ModelTokens, StatusLabel, ToolLabel, ToolOutcome,
};
use crate::store::{EventRecord, Waiting};

/// One thing a committed batch did, for the metrics.
pub(super) enum Observed {
    /// A decision on a call; `waited_ms` when a request was waiting for it.
    Decided {
        tool: String,
        outcome: &'static str,
        actor_kind: &'static str,
        waited_ms: Option<i64>,
    },
    Expired {
        tool: String,
        reason: &'static str,
    },
    /// A new run (its `aaa.run.started` is written before any fold).
    RunStarted,
    RunFinished {
        status: &'static str,
    },
    Attempt {
        tool: String,
        outcome: &'static str,
        seconds: f64,
    },
    ModelCall {
        model: String,
        outcome: &'static str,
    },
    Tokens {
        model: String,
        input: u64,
        output: u64,
    },
}

/// What `event` means for the metrics, given the run just before it.
pub(super) fn observe(state: &RunState, event: &EventRecord, out: &mut Vec<Observed>) {
    let call_of = |call_id: &str| state.call(call_id);
    match event.event_type.as_str() {
        RUN_COMPLETED | RUN_FAILED | RUN_CANCELLED => {
            let status = match event.event_type.as_str() {
                RUN_COMPLETED => "completed",
                RUN_FAILED => "failed",
                _ => "cancelled",
            };
            out.push(Observed::RunFinished { status });
        }
        APPROVAL_GRANTED | APPROVAL_DENIED | APPROVAL_EXPIRED | APPROVAL_EDITED => {
            let Some(call) = decode_call_id(event).and_then(|id| call_of(&id)) else {
                return;
            };
            // The engine denies only when a request's timeout passes.
            let timed_out = event.event_type == APPROVAL_DENIED && event.actor_kind == 1;
            let outcome = match event.event_type.as_str() {
                APPROVAL_GRANTED => "granted",
                APPROVAL_DENIED if timed_out => "expired",
                APPROVAL_DENIED => "denied",
                APPROVAL_EXPIRED => "expired",
                _ => "edited",
            };
            let waiting = is_waiting(call);
            out.push(Observed::Decided {
                tool: call.name.clone(),
                outcome,
                actor_kind: actor_kind(event.actor_kind),
                waited_ms: waiting.then(|| event.time_ms - call.requested_ms),
            });
            let reason = if timed_out {
                Some("timeout")
            } else if event.event_type == APPROVAL_EXPIRED {
                Some(expiry_reason(event))
            } else {
                None
            };
            if let Some(reason) = reason {
                out.push(Observed::Expired {
                    tool: call.name.clone(),
                    reason,
                });
            }
        }
        TOOL_COMPLETED | TOOL_RETRYING | TOOL_FAILED => {
            let Some(call) = decode_call_id(event).and_then(|id| call_of(&id)) else {
                return;
            };
            // A call that failed before any attempt ran (denied, invalid
            // arguments) ended no attempt.
            if call.phase != Phase::Running {
                return;
            }
            let lost = event.data_json.contains("\"AttemptLost\"");
            let outcome = match event.event_type.as_str() {
                TOOL_COMPLETED => "completed",
                _ if lost => "lost",
                TOOL_RETRYING => "retrying",
                _ => "failed",
            };
            out.push(Observed::Attempt {
                tool: call.name.clone(),
                outcome,
                seconds: (event.time_ms - call.started_ms).max(0) as f64 / 1000.0,
            });
        }
        LLM_COMPLETED | LLM_FAILED => {
            let outcome = match event.event_type.as_str() {
                LLM_COMPLETED => "completed",
                _ => "failed",
            };
            out.push(Observed::ModelCall {
                model: state.spec.model.name(),
                outcome,
            });
        }
        _ => {}
    }
}

/// A call whose approval request waits (asked, not yet decided).
fn is_waiting(call: &super::state::Call) -> bool {
    call.phase == Phase::AwaitingApproval && call.approval_seq > 0 && call.decision.is_none()
}

pub(super) fn actor_kind(kind: i32) -> &'static str {
    match kind {
        1 => "engine",
        2 => "worker",
        3 => "client",
        4 => "policy",
        5 => "grant",
        _ => "unknown",
    }
}

/// Why a request expired, in a word the engine chose (never a client's
/// text: a cancellation's reason is the client's).
fn expiry_reason(event: &EventRecord) -> &'static str {
    match serde_json::from_str::<ApprovalExpired>(&event.data_json) {
        Ok(e) if e.reason == "deadline" => "deadline",
        Ok(e) if e.reason == "run_cancelled" => "run_cancelled",
        _ => "other",
    }
}

#[derive(serde::Deserialize)]
struct CallIdOnly {
    call_id: String,
}

fn decode_call_id(event: &EventRecord) -> Option<String> {
    serde_json::from_str::<CallIdOnly>(&event.data_json)
        .ok()
        .map(|c| c.call_id)
}

/// Counts what a durable batch did.
pub(super) fn count(families: &Families, observed: Vec<Observed>) {
    let tool = |name: &str| families.tools.label(name);
    let model = |name: &str| families.models.label(name);
    for o in observed {
        match o {
            Observed::Decided {
                tool: name,
                outcome,
                actor_kind,
                waited_ms,
            } => {
                let name = tool(&name);
                families
                    .approval_decisions
                    .get_or_create(&Decision {
                        tool: name.clone(),
                        outcome,
                        actor_kind,
                    })
                    .inc();
                if let Some(waited_ms) = waited_ms {
                    families
                        .approval_wait_seconds
                        .get_or_create(&ToolOutcome {
                            tool: name,
                            outcome,
                        })
                        .observe(waited_ms.max(0) as f64 / 1000.0);
                }
            }
            Observed::Expired { tool: name, reason } => {
                let label = Expiry {
                    tool: tool(&name),
                    reason,
                };
                families.approvals_expired.get_or_create(&label).inc();
            }
            Observed::RunStarted => {
                families.runs_started.inc();
            }
            Observed::RunFinished { status } => {
                families
                    .runs_finished
                    .get_or_create(&StatusLabel { status })
                    .inc();
            }
            Observed::Attempt {
                tool: name,
                outcome,
                seconds,
            } => {
                let name = tool(&name);
                families
                    .tool_attempts
                    .get_or_create(&ToolOutcome {
                        tool: name.clone(),
                        outcome,
                    })
                    .inc();
                families
                    .tool_attempt_seconds
                    .get_or_create(&ToolLabel { tool: name })
                    .observe(seconds);
            }
            Observed::ModelCall {
                model: name,
                outcome,
            } => {
                let label = ModelOutcome {
                    model: model(&name),
                    outcome,
                };
                families.model_calls.get_or_create(&label).inc();
            }
            Observed::Tokens {
                model: name,
                input,
                output,
            } => {
                let name = model(&name);
                for (kind, n) in [("input", input), ("output", output)] {
                    families
                        .model_tokens
                        .get_or_create(&ModelTokens {
                            model: name.clone(),
                            kind,
                        })
                        .inc_by(n);
                }
            }
        }
    }
}

/// Sets the gauges of what waits from the store's counts.
/// A tool whose calls no longer wait shows 0 rather than vanishing.
pub(super) fn waiting(families: &Families, waiting: Waiting, now_ms: i64) {
    // (pending, oldest request) by label; several tools may share `_other`.
    let mut by_label = std::collections::BTreeMap::<String, (i64, i64)>::new();
    for tool in waiting.approvals_by_tool {
        let entry = by_label
            .entry(families.tools.label(&tool.tool))
            .or_insert((0, i64::MAX));
        entry.0 += tool.pending as i64;
        entry.1 = entry.1.min(tool.oldest_requested_ms);
    }
    let mut shown = families.pending_shown.lock().expect("poisoned");
    for tool in shown.iter() {
        by_label.entry(tool.clone()).or_insert((0, i64::MAX));
    }
    for (tool, (pending, oldest_ms)) in by_label {
        let label = ToolLabel { tool: tool.clone() };
        families
            .approvals_pending
            .get_or_create(&label)
            .set(pending);
        let waited_s = match pending {
            0 => 0.0,
            _ => (now_ms - oldest_ms).max(0) as f64 / 1000.0,
        };
        families
            .approval_oldest_wait_seconds
            .get_or_create(&label)
            .set(waited_s);
        shown.insert(tool);
    }
    for (status, n) in [("running", waiting.running), ("waiting", waiting.waiting)] {
        families
            .runs
            .get_or_create(&StatusLabel { status })
            .set(n as i64);
    }
}
