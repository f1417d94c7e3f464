//! A call's page: what the model wants to do (tool, description, the exact
//! arguments pretty-printed and the canonical form whose SHA-256 a grant
//! binds), why (the run's task, labels, starter and the conversation that
//! led to the call), how long it has waited and when it expires, the votes
//! so far; and the decisions: approve with a comment, deny with a reason
//! the model reads, edit the arguments (checked by the server against the
//! tool's schema). Each decision is a Signal as the signed-in person,
//! bound to the digest of the arguments this page showed.

use axum::extract::{Form, Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use http::{StatusCode, Uri};
use serde::Deserialize;
use serde_json::{json, Value};

use super::events;
use super::html::{self, Html};
use super::{page, refusal, status_page, Visitor, Web};
use crate::present;
use crate::proto::{Approval, Event, SignalRequest};

/// Events of a run read for its call's conversation.
const HISTORY_LIMIT: usize = 10_000;

#[derive(Deserialize)]
pub struct Shown {
    /// The decision just recorded, to say so.
    #[serde(default)]
    decided: String,
}

pub async fn page_handler(
    State(web): State<Web>,
    visitor: Visitor,
    Path((run_id, call_id)): Path<(String, String)>,
    Query(shown): Query<Shown>,
) -> Response {
    // A runner (no approver or reader role) may not list approvals, but
    // reads the runs it started: it sees the call from the log.
    let pending = match visitor.caller.pending(&run_id, &call_id).await {
        Ok(pending) => pending,
        Err(status) if status.code() == tonic::Code::PermissionDenied => None,
        Err(status) => return status_page(&status),
    };
    // The conversation needs a role that reads runs (runner, reader); an
    // approver alone sees the call as ListApprovals shows it.
    let history = visitor.caller.history(&run_id, HISTORY_LIMIT).await;
    let (events, unreadable) = match history {
        Ok(events) => (events, None),
        Err(status) => (Vec::new(), Some(status)),
    };
    if pending.is_none() && events.is_empty() {
        return match unreadable {
            Some(status) if status.code() != tonic::Code::NotFound => status_page(&status),
            _ => refusal(
                StatusCode::NOT_FOUND,
                &format!("Run '{run_id}' has no pending call '{call_id}'."),
            ),
        };
    }
    let requested = events.iter().find(|e| {
        e.r#type == "aaa.approval.requested" && events::data(e)["call_id"] == call_id.as_str()
    });
    let tool_requested = events.iter().find(|e| {
        e.r#type == "aaa.tool.requested" && events::data(e)["call_id"] == call_id.as_str()
    });
    if pending.is_none() && tool_requested.is_none() {
        return refusal(
            StatusCode::NOT_FOUND,
            &format!("Run '{run_id}' has no call '{call_id}'."),
        );
    }
    let now = crate::clock::now_ms();
    let mut h = Html::new();
    let tool = pending.as_ref().map_or_else(
        || events::plain(&tool_requested.map(events::data).unwrap_or_default()["name"]),
        |a| a.tool.clone(),
    );
    h.raw("<p class=\"crumbs\"><a href=\"/\">Inbox</a> / <a href=\"")
        .text(&present::run_path(&run_id))
        .raw("\">run ")
        .text(&super::inbox::clip(&run_id, 13))
        .raw("</a></p><h1><span class=\"tool\">")
        .text(&tool)
        .raw("</span> <span class=\"callid\">")
        .text(&call_id)
        .raw("</span></h1>");
    // A fixed place for news about this call, so that it moves nothing.
    let decision = recorded(&shown.decided);
    // The person's own decision, recorded, reads as success; news from
    // elsewhere (the script's) keeps the plain notice's colour.
    let class = match decision {
        Some(_) => "notice success",
        None => "notice",
    };
    h.raw("<p class=\"")
        .raw(class)
        .raw("\" id=\"notice\" aria-live=\"polite\" data-key=\"")
        .text(&run_id)
        .raw("/")
        .text(&call_id)
        .raw("\">");
    if let Some(decision) = decision {
        h.raw("Your decision was recorded: ")
            .text(decision)
            .raw(".");
    }
    h.raw("</p>");
    let started = events.iter().find(|e| e.r#type == "aaa.run.started");
    let started_data = started.map(events::data).unwrap_or_default();
    let definition = started_data["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == tool.as_str())
        .cloned()
        .unwrap_or_default();

    // What the model wants to do.
    h.raw("<section class=\"what\"><h2>What the model wants to do</h2>");
    let description = events::plain(&definition["description"]);
    if !description.is_empty() {
        h.raw("<p class=\"description\">")
            .text(&description)
            .raw("</p>");
    }
    let (arguments, digest) = match (&pending, tool_requested) {
        (Some(a), _) => (a.arguments_json.clone(), a.arguments_sha256.clone()),
        (None, Some(e)) => {
            let args = events::data(e)["arguments"].to_string();
            let digest = crate::auth::sha256_hex(args.as_bytes());
            (args, digest)
        }
        (None, None) => (String::new(), String::new()),
    };
    h.raw("<pre class=\"arguments\" id=\"arguments\">")
        .text(&html::pretty_json(&arguments))
        .raw("</pre><details><summary>Canonical form and digest</summary><p>A grant from this page is bound to the SHA-256 of exactly this text:</p><pre class=\"canonical\" id=\"canonical\">")
        .text(&arguments)
        .raw("</pre><p class=\"digest\">sha256 <code id=\"digest\">")
        .text(&digest)
        .raw("</code></p></details></section>");

    // The state of the request.
    h.raw("<section class=\"state\"><h2>Request</h2><dl>");
    match &pending {
        Some(a) => {
            let waited = now - html::millis(&a.requested_at);
            h.raw("<dt>Status</dt><dd id=\"status\">waiting for a decision</dd><dt>Requested</dt><dd>")
                .text(&html::time(&a.requested_at))
                .raw(" (waiting ")
                .text(&html::span(waited))
                .raw(")</dd>");
            if a.expires_at.is_some() {
                let left = html::millis(&a.expires_at) - now;
                h.raw("<dt>Expires</dt><dd>")
                    .text(&html::time(&a.expires_at))
                    .raw(" (in ")
                    .text(&html::span(left))
                    .raw(")</dd>");
            }
            if a.approvals_required > 1 {
                h.raw("<dt>Grants</dt><dd id=\"votes\">")
                    .num(a.votes.len())
                    .raw(" of ")
                    .num(a.approvals_required)
                    .raw(" needed");
                for vote in &a.votes {
                    h.raw("<br>")
                        .text(&vote.approver)
                        .raw(" at ")
                        .text(&html::time(&vote.time));
                    if !vote.comment.is_empty() {
                        h.raw(": \u{201c}").text(&vote.comment).raw("\u{201d}");
                    }
                }
                h.raw("</dd>");
            }
            if !a.approvers.is_empty() {
                h.raw("<dt>Approver groups</dt><dd>")
                    .text(&a.approvers.join(", "))
                    .raw("</dd>");
            }
            if !a.edited_from.is_empty() {
                h.raw("<dt>Edited from</dt><dd>")
                    .text(&a.edited_from)
                    .raw("</dd>");
            }
        }
        None => {
            h.raw("<dt>Status</dt><dd id=\"status\">")
                .text(&outcome(&events, &call_id))
                .raw("</dd>");
            if let Some(requested) = requested {
                h.raw("<dt>Requested</dt><dd>")
                    .text(&html::time(&requested.time))
                    .raw("</dd>");
            }
        }
    }
    h.raw("</dl></section>");

    if let Some(a) = &pending {
        decision_forms(&mut h, &web, &visitor, a, &definition);
    }

    // Why: the run and the conversation.
    h.raw("<section class=\"why\"><h2>Why</h2><dl><dt>Task</dt><dd id=\"task\">")
        .text(
            &pending
                .as_ref()
                .map_or_else(|| events::plain(&started_data["task"]), |a| a.task.clone()),
        )
        .raw("</dd>");
    let labels = pending
        .as_ref()
        .map(|a| a.labels.clone())
        .unwrap_or_else(|| {
            started_data["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), events::plain(v)))
                .collect()
        });
    if !labels.is_empty() {
        let mut labels: Vec<_> = labels.into_iter().collect();
        labels.sort();
        h.raw("<dt>Labels</dt><dd>");
        for (k, v) in labels {
            h.raw("<span class=\"label\">")
                .text(&k)
                .raw("=")
                .text(&v)
                .raw("</span> ");
        }
        h.raw("</dd>");
    }
    if let Some(started) = started {
        h.raw("<dt>Started by</dt><dd id=\"starter\">")
            .text(&events::actor(started))
            .raw(" at ")
            .text(&html::time(&started.time))
            .raw("</dd>");
    }
    h.raw("</dl>");
    match &unreadable {
        Some(status) => {
            h.raw("<p class=\"hint\">The conversation is not shown: ")
                .text(status.message())
                .raw("</p>");
        }
        None => conversation(&mut h, &events, requested.map_or(u64::MAX, |e| e.seq)),
    }
    h.raw("<p><a href=\"")
        .text(&present::run_path(&run_id))
        .raw("\">The run's timeline</a></p></section>");
    page(
        &web,
        Some(&visitor),
        &format!("{tool} {call_id}"),
        "/live/approvals",
        &h,
    )
}

/// The decision just recorded, as the redirect after a decision names it.
fn recorded(decided: &str) -> Option<&'static str> {
    match decided {
        "granted" => Some("granted"),
        "voted" => Some("your grant counted; the call needs more"),
        "denied" => Some("denied"),
        "edited" => Some("edited; this call takes its place and waits for a grant"),
        "edited-granted" => Some("edited and granted; this call takes its place and runs"),
        "edited-voted" => {
            Some("edited; this call takes its place, and your grant counted (it needs more)")
        }
        "already" => Some("nothing changed, the call had already been decided"),
        _ => None,
    }
}

/// How a call that is no longer pending ended, from the log.
fn outcome(events: &[Event], call_id: &str) -> String {
    let decided = events.iter().rev().find(|e| {
        e.r#type.starts_with("aaa.approval.")
            && e.r#type != "aaa.approval.requested"
            && events::data(e)["call_id"] == call_id
    });
    match decided {
        Some(e) => format!("{} by {}", events::summary(e), events::actor(e)),
        None => "not waiting for a decision".to_string(),
    }
}

fn decision_forms(h: &mut Html, web: &Web, visitor: &Visitor, a: &Approval, definition: &Value) {
    let csrf = visitor.csrf(web);
    let action = present::call_path(&a.run_id, &a.call_id);
    let hidden = |h: &mut Html| {
        h.raw("<input type=\"hidden\" name=\"csrf\" value=\"")
            .text(&csrf)
            .raw("\"><input type=\"hidden\" name=\"sha256\" value=\"")
            .text(&a.arguments_sha256)
            .raw("\">");
    };
    h.raw("<section class=\"decide\"><h2>Decide</h2><div class=\"forms\">");
    h.raw("<form method=\"post\" class=\"approve\" action=\"")
        .text(&action)
        .raw("/approve\">");
    hidden(h);
    h.raw("<label for=\"comment\">Comment (optional)</label><textarea id=\"comment\" name=\"comment\" rows=\"2\"></textarea><button type=\"submit\" class=\"primary\" id=\"approve\">Approve</button></form>");
    h.raw("<form method=\"post\" class=\"deny\" action=\"")
        .text(&action)
        .raw("/deny\">");
    hidden(h);
    h.raw("<label for=\"reason\">Reason (the model reads it)</label><textarea id=\"reason\" name=\"reason\" rows=\"2\" required></textarea><button type=\"submit\" class=\"danger\" id=\"deny\">Deny</button></form>");
    h.raw("</div><details class=\"edit\"><summary>Edit the arguments</summary>");
    h.raw("<form method=\"post\" action=\"")
        .text(&action)
        .raw("/edit\">");
    hidden(h);
    h.raw("<label for=\"edited\">Arguments (JSON; the server checks them against the tool's schema)</label><textarea id=\"edited\" name=\"arguments\" rows=\"6\" spellcheck=\"false\">")
        .text(&html::pretty_json(&a.arguments_json))
        .raw("</textarea><label for=\"edit-reason\">Reason (the model reads it)</label><textarea id=\"edit-reason\" name=\"reason\" rows=\"2\"></textarea><label class=\"check\"><input type=\"checkbox\" name=\"grant\" value=\"1\" checked> grant the edited call too</label><button type=\"submit\" id=\"edit\">Save the edit</button></form>");
    let schema = &definition["parameters"];
    if !schema.is_null() {
        h.raw("<p>The tool's schema:</p><pre class=\"schema\">")
            .text(&serde_json::to_string_pretty(schema).unwrap_or_default())
            .raw("</pre>");
    }
    h.raw("</details></section>");
}

/// The messages and tool results before the call was requested.
fn conversation(h: &mut Html, events: &[Event], until_seq: u64) {
    h.raw("<h3>The conversation that led to the call</h3><ol class=\"conversation\" id=\"conversation\">");
    for event in events.iter().filter(|e| e.seq <= until_seq) {
        let d = events::data(event);
        let mut say = |who: &'static str, class: &'static str, text: &str| {
            h.raw("<li class=\"")
                .raw(class)
                .raw("\"><span class=\"who\">")
                .raw(who)
                .raw("</span><p>")
                .text(text)
                .raw("</p></li>");
        };
        match event.r#type.as_str() {
            "aaa.run.started" => {
                let system = events::plain(&d["system"]);
                if !system.is_empty() {
                    say("system", "system", &system);
                }
                say("user", "user", &events::plain(&d["task"]));
            }
            "aaa.llm.completed" => {
                let content = events::plain(&d["message"]["content"]);
                if !content.is_empty() {
                    say("model", "model", &content);
                }
                for call in d["message"]["tool_calls"].as_array().into_iter().flatten() {
                    say(
                        "model calls",
                        "model",
                        &format!(
                            "{} {} ({})",
                            events::plain(&call["name"]),
                            events::plain(&call["arguments"]),
                            events::plain(&call["call_id"])
                        ),
                    );
                }
            }
            "aaa.tool.completed" => say(
                "tool result",
                "tool",
                &format!(
                    "{}: {}",
                    events::plain(&d["call_id"]),
                    events::plain(&d["output"])
                ),
            ),
            "aaa.tool.failed" => say(
                "tool failed",
                "tool",
                &format!(
                    "{}: {}",
                    events::plain(&d["call_id"]),
                    events::error(&d["error"])
                ),
            ),
            _ => {}
        }
    }
    h.raw("</ol>");
}

#[derive(Deserialize)]
pub struct Decision {
    #[serde(default)]
    csrf: String,
    /// The digest of the arguments the page showed.
    #[serde(default)]
    sha256: String,
    #[serde(default)]
    comment: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    arguments: String,
    #[serde(default)]
    grant: String,
}

/// A decision posted from a call's page: approve, deny or edit. The
/// router sends only those three paths here; the last segment says which.
/// Each is one Signal as the signed-in person, bound to the digest of the
/// arguments the page showed.
pub async fn decide(
    State(web): State<Web>,
    visitor: Visitor,
    Path((run_id, call_id)): Path<(String, String)>,
    uri: Uri,
    Form(form): Form<Decision>,
) -> Response {
    let (event_type, data) = match uri.path().rsplit('/').next() {
        Some("approve") => {
            let mut data = json!({"call_id": call_id, "arguments_sha256": form.sha256});
            if !form.comment.trim().is_empty() {
                data["comment"] = json!(form.comment.trim());
            }
            ("aaa.approval.granted", data)
        }
        Some("deny") => (
            "aaa.approval.denied",
            json!({"call_id": call_id, "arguments_sha256": form.sha256, "reason": form.reason.trim()}),
        ),
        Some("edit") => {
            let arguments: Value = match serde_json::from_str(&form.arguments) {
                Ok(arguments) => arguments,
                Err(e) => {
                    return refusal(
                        StatusCode::BAD_REQUEST,
                        &format!("The edited arguments are not JSON: {e}"),
                    )
                }
            };
            let data = json!({
                "call_id": call_id,
                "arguments": arguments,
                "arguments_sha256": form.sha256,
                "reason": form.reason.trim(),
                "grant": form.grant == "1",
            });
            ("aaa.approval.edited", data)
        }
        _ => {
            return refusal(
                StatusCode::NOT_FOUND,
                "A call is decided at .../approve, .../deny or .../edit.",
            )
        }
    };
    if let Some(refused) = visitor.refuse_without_csrf(&web, &form.csrf) {
        return refused;
    }
    // With auth off, the typed name is the vote's approver (the actor names
    // it too, beside the address): two people on one machine count as two.
    let mut data = data;
    if let Some(name) = &visitor.approver {
        data["approver"] = json!(name);
    }
    let request = SignalRequest {
        run_id: run_id.clone(),
        r#type: event_type.to_string(),
        data_json: data.to_string(),
        request_id: String::new(),
    };
    match visitor.caller.signal(request).await {
        Ok(answer) => {
            let decided = match (answer.already_decided, answer.decision.as_str()) {
                (true, _) => "already",
                (false, "aaa.approval.granted") => "granted",
                (false, "aaa.approval.voted") => "voted",
                (false, "aaa.approval.denied") => "denied",
                (false, "aaa.approval.edited") if answer.votes == 0 => "edited",
                (false, "aaa.approval.edited") if answer.votes >= answer.approvals_required => {
                    "edited-granted"
                }
                (false, "aaa.approval.edited") => "edited-voted",
                _ => "",
            };
            // After an edit, the page of the call that takes its place.
            let call = match answer.new_call_id.as_str() {
                "" => &call_id,
                new => new,
            };
            let to = format!(
                "{}{}",
                present::call_path(&run_id, call),
                html::query(&[("decided", decided)])
            );
            Redirect::to(&to).into_response()
        }
        Err(status) => status_page(&status),
    }
}
