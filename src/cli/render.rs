//! How answers look: stdout (colored only on a terminal, never with
//! NO_COLOR), one readable line per event, tables, and the JSON that
//! `--json` prints. The JSON uses the proto's field names, except that
//! `*_json` text fields are embedded as JSON under the name without `_json`
//! (`data_json` -> `data`), so scripts get objects, not strings; enums are
//! lowercase words (`waiting_for_approval`, `granted`); times are RFC 3339.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};

use prost_types::Timestamp;
use serde_json::{json, Value};

use super::Error;
use crate::present::{short_time, status_word, word};
use crate::proto::{
    watch_approvals_response::Item, ActorKind, Approval, ApprovalOutcome, ApprovalResolution,
    ErrorDetail, Event, Run, Vote, WatchApprovalsResponse,
};

/// Colors of the text output.
#[derive(Clone, Copy)]
pub enum Style {
    Dim,
    Green,
    Red,
    Yellow,
}

/// Where results go: stdout, as text or JSON.
pub struct Output {
    pub json: bool,
    color: bool,
}

impl Output {
    pub fn new(json: bool) -> Output {
        // https://no-color.org: set and not empty means no color.
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Output {
            json,
            color: !json && !no_color && std::io::stdout().is_terminal(),
        }
    }

    /// Writes one line. Stdout is line-buffered, so followers see each line
    /// as it is written.
    pub fn line(&self, text: &str) -> Result<(), Error> {
        writeln!(std::io::stdout(), "{text}")?;
        Ok(())
    }

    /// Writes text with no newline (a prompt), flushed.
    pub fn prompt(&self, text: &str) -> Result<(), Error> {
        let mut stdout = std::io::stdout();
        write!(stdout, "{text}")?;
        stdout.flush()?;
        Ok(())
    }

    /// One JSON document, indented for the people who read it too.
    pub fn document(&self, value: &Value) -> Result<(), Error> {
        let text = serde_json::to_string_pretty(value).expect("a Value serializes");
        self.line(&text)
    }

    /// One JSON object on one line: an item of a stream.
    pub fn json_line(&self, value: &Value) -> Result<(), Error> {
        self.line(&value.to_string())
    }

    pub fn paint(&self, style: Style, text: &str) -> String {
        if !self.color {
            return text.to_string();
        }
        let code = match style {
            Style::Dim => "2",
            Style::Green => "32",
            Style::Red => "31",
            Style::Yellow => "1;33",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }

    /// A header and rows as columns padded to their widest cell.
    pub fn table(
        &self,
        header: &[&str],
        rows: impl Iterator<Item = Vec<String>>,
    ) -> Result<(), Error> {
        let header = header.iter().map(|h| h.to_string()).collect();
        let rows: Vec<Vec<String>> = std::iter::once(header).chain(rows).collect();
        let mut widths = vec![0; rows[0].len()];
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        for row in &rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            self.line(cells.join("  ").trim_end())?;
        }
        Ok(())
    }
}

/// A `*_json` text field as JSON. Numbers keep every digit (serde_json's
/// arbitrary_precision); empty text (an unset field) is null.
pub fn embed(text: &str) -> Value {
    match text {
        "" => Value::Null,
        // The server only stores valid JSON; should that ever fail, show the text.
        _ => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string())),
    }
}

/// RFC 3339, e.g. "2025-06-01T12:03:04.123Z"; "" when unset.
pub fn time(timestamp: &Option<Timestamp>) -> String {
    timestamp.map_or_else(String::new, |t| t.to_string())
}

fn time_json(timestamp: &Option<Timestamp>) -> Value {
    timestamp.map_or(Value::Null, |t| Value::String(t.to_string()))
}

/// "a=1, b=2": labels sorted by key.
pub fn labels(labels: &HashMap<String, String>) -> String {
    let mut pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs.join(", ")
}

fn outcome_word(outcome: i32) -> String {
    ApprovalOutcome::try_from(outcome).map_or_else(
        |_| outcome.to_string(),
        |o| word(o.as_str_name(), "APPROVAL_OUTCOME_"),
    )
}

fn error_json(error: &Option<ErrorDetail>) -> Value {
    error.as_ref().map_or(
        Value::Null,
        |e| json!({"type": e.r#type, "message": e.message}),
    )
}

pub fn run_json(run: &Run) -> Value {
    json!({
        "run_id": run.run_id,
        "status": status_word(run.status),
        "task": run.task,
        "model": run.model,
        "tools": run.tools,
        "labels": run.labels,
        "created_at": time_json(&run.created_at),
        "updated_at": time_json(&run.updated_at),
        "deadline_at": time_json(&run.deadline_at),
        "last_seq": run.last_seq,
        "result": embed(&run.result_json),
        "error": error_json(&run.error),
        "usage": run.usage.map_or(Value::Null, |u| json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
        })),
        "pending_approvals": run.pending_approvals.iter().map(approval_json).collect::<Vec<_>>(),
    })
}

pub fn approval_json(approval: &Approval) -> Value {
    json!({
        "run_id": approval.run_id,
        "call_id": approval.call_id,
        "tool": approval.tool,
        "arguments": embed(&approval.arguments_json),
        "arguments_sha256": approval.arguments_sha256,
        "requested_at": time_json(&approval.requested_at),
        "expires_at": time_json(&approval.expires_at),
        "labels": approval.labels,
        "seq": approval.seq,
        "position": approval.position,
        "task": approval.task,
        "approvals_required": approval.approvals_required,
        "votes": approval.votes.iter().map(vote_json).collect::<Vec<_>>(),
        "edited_from": approval.edited_from,
    })
}

fn vote_json(vote: &Vote) -> Value {
    json!({
        "approver": vote.approver,
        "time": time_json(&vote.time),
        "comment": vote.comment,
    })
}

/// "1 of 2 (alice)": the grants a call has and needs; empty when it needs one.
pub fn votes_text(approval: &Approval) -> String {
    if approval.approvals_required <= 1 {
        return String::new();
    }
    let voters: Vec<&str> = approval.votes.iter().map(|v| v.approver.as_str()).collect();
    let mut text = format!(
        "{} of {} grants",
        approval.votes.len(),
        approval.approvals_required
    );
    if !voters.is_empty() {
        text.push_str(&format!(" ({})", voters.join(", ")));
    }
    text
}

fn resolution_json(resolution: &ApprovalResolution) -> Value {
    json!({
        "run_id": resolution.run_id,
        "call_id": resolution.call_id,
        "tool": resolution.tool,
        "outcome": outcome_word(resolution.outcome),
        "reason": resolution.reason,
        "seq": resolution.seq,
        "time": time_json(&resolution.time),
        "replaced_by": resolution.replaced_by,
    })
}

pub fn event_json(event: &Event) -> Value {
    let actor = event.actor.as_ref().map_or(Value::Null, |a| {
        let kind = ActorKind::try_from(a.kind).map_or_else(
            |_| a.kind.to_string(),
            |k| word(k.as_str_name(), "ACTOR_KIND_"),
        );
        json!({"kind": kind, "name": a.name})
    });
    json!({
        "run_id": event.run_id,
        "seq": event.seq,
        "position": event.position,
        "id": event.id,
        "type": event.r#type,
        "data": embed(&event.data_json),
        "time": time_json(&event.time),
        "actor": actor,
    })
}

/// One WatchApprovals item: {"position": N, "resume_token": T, "<item
/// kind>": {...}} (no token on the snapshot's items).
pub fn watch_json(response: &WatchApprovalsResponse) -> Value {
    let (kind, item) = match &response.item {
        Some(Item::Requested(approval)) => ("requested", approval_json(approval)),
        Some(Item::Resolved(resolution)) => ("resolved", resolution_json(resolution)),
        Some(Item::SnapshotComplete(done)) => {
            ("snapshot_complete", json!({"pending": done.pending}))
        }
        Some(Item::Heartbeat(_)) => ("heartbeat", json!({})),
        Some(Item::Voted(voted)) => (
            "voted",
            json!({
                "run_id": voted.run_id,
                "call_id": voted.call_id,
                "tool": voted.tool,
                "vote": voted.vote.as_ref().map(vote_json),
                "votes": voted.votes,
                "approvals_required": voted.approvals_required,
                "seq": voted.seq,
            }),
        ),
        None => ("unknown", json!({})),
    };
    match response.resume_token.is_empty() {
        true => json!({"position": response.position, kind: item}),
        false => json!({
            "position": response.position,
            "resume_token": response.resume_token,
            kind: item
        }),
    }
}

/// One WatchApprovals item as a line; heartbeats have none.
pub fn watch_line(out: &Output, response: &WatchApprovalsResponse) -> Option<String> {
    Some(match response.item.as_ref()? {
        Item::Requested(a) => format!(
            "{}  {}  {}  {}  {}",
            out.paint(Style::Yellow, "requested"),
            a.run_id,
            a.call_id,
            a.tool,
            a.arguments_json
        ),
        Item::Resolved(r) => {
            let outcome = outcome_word(r.outcome);
            let style = match outcome.as_str() {
                "granted" => Style::Green,
                "edited" => Style::Yellow,
                _ => Style::Red,
            };
            let replaced = match r.replaced_by.as_str() {
                "" => String::new(),
                by => format!("-> {by}  "),
            };
            format!(
                "{}  {}  {}  {}  {replaced}{}",
                out.paint(style, &format!("{outcome:<9}")),
                r.run_id,
                r.call_id,
                r.tool,
                r.reason
            )
            .trim_end()
            .to_string()
        }
        Item::SnapshotComplete(done) => out.paint(
            Style::Dim,
            &format!("-- {} pending; watching for changes --", done.pending),
        ),
        Item::Voted(v) => format!(
            "{}  {}  {}  {}  {} of {} grants (by {})",
            out.paint(Style::Yellow, "voted    "),
            v.run_id,
            v.call_id,
            v.tool,
            v.votes,
            v.approvals_required,
            v.vote.as_ref().map_or("", |vote| vote.approver.as_str())
        ),
        Item::Heartbeat(_) => return None,
    })
}

/// One event as one line: seq, time of day (UTC), type, and what matters
/// in its data (see the event catalogue in types.proto).
pub fn event_line(out: &Output, event: &Event) -> String {
    let data = embed(&event.data_json);
    let style = match event.r#type.as_str() {
        "aaa.approval.requested" | "aaa.approval.voted" | "aaa.approval.edited" => {
            Some(Style::Yellow)
        }
        "aaa.run.completed" | "aaa.approval.granted" | "aaa.tool.completed" => Some(Style::Green),
        "aaa.run.cancelled" => Some(Style::Red),
        t if t.ends_with(".failed") || t.ends_with(".denied") || t.ends_with(".expired") => {
            Some(Style::Red)
        }
        _ => None,
    };
    let kind = format!("{:<22}", event.r#type);
    let kind = match style {
        Some(style) => out.paint(style, &kind),
        None => kind,
    };
    let clock = short_time(&event.time);
    let clock = clock.split(' ').nth(1).unwrap_or_default();
    let head = out.paint(Style::Dim, &format!("{:>4} {clock}", event.seq));
    format!("{head} {kind} {}", summary(&event.r#type, &data))
        .trim_end()
        .to_string()
}

/// The telling part of an event's data, in a few words.
fn summary(event_type: &str, data: &Value) -> String {
    let s = |key: &str| plain(&data[key]);
    let error = || {
        let e = &data["error"];
        format!(
            "{}: {}",
            e["type"].as_str().unwrap_or_default(),
            e["message"].as_str().unwrap_or_default()
        )
    };
    let call = || format!("{} {}", s("call_id"), s("name"));
    match event_type {
        "aaa.run.started" => {
            // {"worker": name} or {"scripted": [steps]}
            let model = data["model"]["worker"].as_str().unwrap_or("scripted");
            let tools: Vec<&str> = data["tools"]
                .as_array()
                .map(|tools| tools.iter().filter_map(|t| t["name"].as_str()).collect())
                .unwrap_or_default();
            format!(
                "{} (model {model}, tools: {})",
                data["task"],
                tools.join(", ")
            )
        }
        "aaa.llm.requested" => format!("{} {} attempt {}", s("call_id"), s("model"), s("attempt")),
        "aaa.llm.completed" => {
            let message = &data["message"];
            let calls: Vec<String> = message["tool_calls"]
                .as_array()
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| {
                            format!(
                                "{} {}",
                                c["name"].as_str().unwrap_or_default(),
                                c["arguments"]
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            match calls.is_empty() {
                true => format!("{} -> {}", s("call_id"), message["content"]),
                false => format!("{} -> {}", s("call_id"), calls.join(", ")),
            }
        }
        "aaa.tool.requested" | "aaa.approval.requested" => {
            format!("{} {}", call(), data["arguments"])
        }
        "aaa.approval.granted" => format!("{} {}", call(), s("comment")),
        "aaa.approval.voted" => format!(
            "{} by {}: {} of {} grants",
            call(),
            s("approver"),
            s("votes"),
            s("approvals_required")
        ),
        "aaa.approval.edited" => format!(
            "{} -> {} {}: {}",
            call(),
            s("new_call_id"),
            data["new_arguments"],
            s("reason")
        ),
        "aaa.approval.denied" | "aaa.approval.expired" => format!("{}: {}", call(), s("reason")),
        "aaa.tool.started" => format!(
            "{} attempt {} on {}",
            s("call_id"),
            s("attempt"),
            s("worker")
        ),
        "aaa.tool.completed" => format!(
            "{} attempt {} -> {}",
            s("call_id"),
            s("attempt"),
            data["output"]
        ),
        "aaa.tool.failed" | "aaa.tool.retrying" | "aaa.llm.failed" => {
            format!("{} attempt {}: {}", s("call_id"), s("attempt"), error())
        }
        "aaa.run.completed" => match &data["value"]["text"] {
            Value::String(text) => text.clone(),
            _ => data["value"].to_string(),
        },
        "aaa.run.failed" => error(),
        "aaa.run.cancelled" => s("reason"),
        _ => data.to_string(),
    }
}

/// A string as itself, anything else as compact JSON, absent as "".
fn plain(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}
