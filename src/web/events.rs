//! How a run's events read for people: a line of who did what, for the
//! run's timeline and the conversation on a call's page. Every value is
//! data from the log, so it is rendered as text.

use serde_json::Value;

use super::html::{self, Html};
use crate::present;
use crate::proto::{ActorKind, Event};

/// The event's data as JSON (`Null` if it does not parse).
pub fn data(event: &Event) -> Value {
    serde_json::from_str(&event.data_json).unwrap_or(Value::Null)
}

/// A JSON value as text: strings as they are, anything else as JSON.
pub fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Who caused the event, in words.
pub fn actor(event: &Event) -> String {
    let Some(actor) = &event.actor else {
        return String::new();
    };
    let kind = match ActorKind::try_from(actor.kind) {
        Ok(ActorKind::Engine) => return "aaa".to_string(),
        Ok(ActorKind::Worker) => "worker",
        Ok(ActorKind::Client) => "",
        Ok(ActorKind::Policy) => "policy rule",
        Ok(ActorKind::Grant) => "standing grant",
        _ => "",
    };
    let mut name = actor.name.clone();
    if !actor.principal.is_empty() && actor.principal != actor.name {
        name = format!("{name} ({})", actor.principal);
    }
    match kind {
        "" => name,
        kind => format!("{kind} {name}"),
    }
}

/// One line saying what the event means.
pub fn summary(event: &Event) -> String {
    let d = data(event);
    let s = |key: &str| plain(&d[key]);
    match event.r#type.as_str() {
        "aaa.run.started" => format!("run started: {}", s("task")),
        "aaa.llm.requested" => format!("model asked (call {})", s("call_id")),
        "aaa.llm.completed" => {
            let message = &d["message"];
            let mut parts = Vec::new();
            let content = plain(&message["content"]);
            if !content.is_empty() {
                parts.push(format!("says: {content}"));
            }
            for call in message["tool_calls"].as_array().into_iter().flatten() {
                parts.push(format!(
                    "calls {} {} ({})",
                    plain(&call["name"]),
                    plain(&call["arguments"]),
                    plain(&call["call_id"])
                ));
            }
            format!("model {}", parts.join("; "))
        }
        "aaa.llm.failed" => format!("model call failed: {}", error(&d["error"])),
        "aaa.tool.requested" => format!(
            "{} requested with {} ({})",
            s("name"),
            plain(&d["arguments"]),
            s("call_id")
        ),
        "aaa.approval.requested" => format!("{} waits for approval ({})", s("name"), s("call_id")),
        "aaa.approval.granted" => with_text(
            format!("{} granted ({})", s("name"), s("call_id")),
            &s("comment"),
        ),
        "aaa.approval.voted" => with_text(
            format!(
                "{} voted for {} ({} of {})",
                s("approver"),
                s("call_id"),
                s("votes"),
                s("approvals_required")
            ),
            &s("comment"),
        ),
        "aaa.approval.denied" => with_text(
            format!("{} denied ({})", s("name"), s("call_id")),
            &s("reason"),
        ),
        "aaa.approval.edited" => with_text(
            format!(
                "{} edited: {} takes {}'s place with {}",
                s("name"),
                s("new_call_id"),
                s("call_id"),
                plain(&d["new_arguments"])
            ),
            &s("reason"),
        ),
        "aaa.approval.expired" => {
            format!("{} expired ({}): {}", s("name"), s("call_id"), s("reason"))
        }
        "aaa.approval.reminded" => format!("reminder for {} ({})", s("name"), s("call_id")),
        "aaa.approval.escalated" => {
            format!("{} escalated to {}", s("call_id"), plain(&d["approvers"]))
        }
        "aaa.tool.started" => format!("{} attempt {} started", s("call_id"), s("attempt")),
        "aaa.tool.completed" => format!("{} returned {}", s("call_id"), plain(&d["output"])),
        "aaa.tool.retrying" => format!("{} retrying: {}", s("call_id"), error(&d["error"])),
        "aaa.tool.failed" => format!("{} failed: {}", s("call_id"), error(&d["error"])),
        "aaa.run.completed" => format!("run completed: {}", plain(&d["value"]["text"])),
        "aaa.run.failed" => format!("run failed: {}", error(&d["error"])),
        "aaa.run.cancelled" => format!("run cancelled: {}", s("reason")),
        _ => event.data_json.clone(),
    }
}

fn with_text(line: String, text: &str) -> String {
    match text {
        "" => line,
        text => format!("{line}: \u{201c}{text}\u{201d}"),
    }
}

/// `Type: message` of an error object.
pub fn error(error: &Value) -> String {
    format!("{}: {}", plain(&error["type"]), plain(&error["message"]))
}

/// One event as an item of a timeline.
pub fn item(event: &Event) -> Html {
    let mut h = Html::new();
    let kind = event.r#type.rsplit('.').next().unwrap_or("");
    h.raw("<li class=\"event\" data-seq=\"")
        .num(event.seq)
        .raw("\"><span class=\"seq\">")
        .num(event.seq)
        .raw("</span><span class=\"type ")
        .text(kind)
        .raw("\">")
        .text(&event.r#type)
        .raw("</span><span class=\"when\">")
        .text(&html::time(&event.time))
        .raw("</span><span class=\"actor\">")
        .text(&actor(event))
        .raw("</span><p class=\"what\">")
        .text(&summary(event))
        .raw("</p>");
    // A request links to its call's page.
    if event.r#type == "aaa.approval.requested" {
        let call = plain(&data(event)["call_id"]);
        h.raw("<a class=\"open\" href=\"")
            .text(&present::call_path(&event.run_id, &call))
            .raw("\">open the call</a>");
    }
    h.raw("</li>");
    h
}

/// Is this the run's last event?
pub fn is_terminal(event_type: &str) -> bool {
    matches!(
        event_type,
        "aaa.run.completed" | "aaa.run.failed" | "aaa.run.cancelled"
    )
}
