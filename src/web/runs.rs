//! Runs: a list filtered by status (ListRuns, a page at a time) and a
//! run's timeline, its events in words, live while it runs (see `live`),
//! with links to its calls' pages.

use axum::extract::{Path, Query, State};
use axum::response::Response;
use http::StatusCode;
use serde::Deserialize;

use super::events;
use super::html::{self, Html};
use super::{page, refusal, status_page, Visitor, Web};
use crate::present::{self, parse_status, status_word};
use crate::proto::{ListRunsRequest, RunStatus};

/// The statuses the list filters on, as the query string names them.
const STATUSES: [&str; 5] = [
    "running",
    "waiting_for_approval",
    "completed",
    "failed",
    "cancelled",
];

#[derive(Deserialize)]
pub struct RunFilters {
    #[serde(default)]
    status: String,
    #[serde(default)]
    page: String,
}

pub async fn list(
    State(web): State<Web>,
    visitor: Visitor,
    Query(filters): Query<RunFilters>,
) -> Response {
    let status = match filters.status.as_str() {
        "" => RunStatus::Unspecified,
        text => match parse_status(text) {
            Ok(status) => status,
            Err(e) => return refusal(StatusCode::BAD_REQUEST, &format!("status: {e}")),
        },
    };
    let request = ListRunsRequest {
        status: status as i32,
        page_size: 50,
        page_token: filters.page.clone(),
        ..Default::default()
    };
    let listed = match visitor.caller.list_runs(request).await {
        Ok(listed) => listed,
        Err(status) => return status_page(&status),
    };
    let mut h = Html::new();
    h.raw("<h1>Runs</h1><form class=\"filters\" method=\"get\" action=\"/runs\"><label>Status <select name=\"status\"><option value=\"\">any</option>");
    for word in STATUSES {
        h.raw("<option value=\"").raw(word).raw("\"");
        if filters.status == word {
            h.raw(" selected");
        }
        h.raw(">").raw(word).raw("</option>");
    }
    h.raw("</select></label><button type=\"submit\">Filter</button></form><ul class=\"runs\" id=\"runs\">");
    for run in &listed.runs {
        let word = status_word(run.status);
        h.raw("<li class=\"run\"><a href=\"")
            .text(&present::run_path(&run.run_id))
            .raw("\">")
            .text(&super::inbox::clip(&run.task, 120))
            .raw("</a><p class=\"meta\"><span class=\"status ")
            .text(&word)
            .raw("\">")
            .text(&word)
            .raw("</span><span>")
            .text(&html::time(&run.created_at))
            .raw("</span><span class=\"runid\">")
            .text(&run.run_id)
            .raw("</span></p></li>");
    }
    h.raw("</ul>");
    if listed.runs.is_empty() {
        h.raw("<p class=\"empty\">No runs.</p>");
    }
    if !listed.next_page_token.is_empty() {
        h.raw("<p class=\"pager\"><a rel=\"next\" href=\"/runs")
            .text(&html::query(&[
                ("status", &filters.status),
                ("page", &listed.next_page_token),
            ]))
            .raw("\">Next page</a></p>");
    }
    page(&web, Some(&visitor), "Runs", "/live/approvals", &h)
}

pub async fn timeline(
    State(web): State<Web>,
    visitor: Visitor,
    Path(run_id): Path<String>,
) -> Response {
    let run = match visitor.caller.get_run(&run_id).await {
        Ok(run) => run,
        Err(status) => return status_page(&status),
    };
    let events = match visitor.caller.history(&run_id, 10_000).await {
        Ok(events) => events,
        Err(status) => return status_page(&status),
    };
    let word = status_word(run.status);
    let mut h = Html::new();
    h.raw("<p class=\"crumbs\"><a href=\"/runs\">Runs</a></p><h1>")
        .text(&super::inbox::clip(&run.task, 120))
        .raw("</h1><dl class=\"run\"><dt>Run</dt><dd class=\"runid\">")
        .text(&run.run_id)
        .raw("</dd><dt>Status</dt><dd><span id=\"run-status\" class=\"status ")
        .text(&word)
        .raw("\">")
        .text(&word)
        .raw("</span></dd><dt>Model</dt><dd>")
        .text(&run.model)
        .raw("</dd><dt>Started</dt><dd>")
        .text(&html::time(&run.created_at))
        .raw("</dd>");
    if !run.result_json.is_empty() {
        h.raw("<dt>Result</dt><dd id=\"result\">")
            .text(&run.result_json)
            .raw("</dd>");
    }
    if let Some(error) = &run.error {
        h.raw("<dt>Error</dt><dd>")
            .text(&error.r#type)
            .raw(": ")
            .text(&error.message)
            .raw("</dd>");
    }
    h.raw("</dl>");
    if !run.pending_approvals.is_empty() {
        h.raw("<h2>Waiting for a decision</h2><ul class=\"pending\">");
        for a in &run.pending_approvals {
            h.raw("<li><a href=\"")
                .text(&present::call_path(&a.run_id, &a.call_id))
                .raw("\">")
                .text(&a.tool)
                .raw(" ")
                .text(&a.call_id)
                .raw("</a></li>");
        }
        h.raw("</ul>");
    }
    let last = events.last().map_or(0, |e| e.seq);
    let ended = events
        .last()
        .is_some_and(|e| events::is_terminal(&e.r#type));
    h.raw("<h2>Timeline</h2><ol class=\"timeline\" id=\"timeline\"");
    if !ended {
        h.raw(" data-events=\"/live/runs/")
            .text(&present::segment(&run.run_id))
            .raw("?after=")
            .num(last)
            .raw("\"");
    }
    h.raw(">");
    for event in &events {
        h.html(&events::item(event));
    }
    h.raw("</ol>");
    let title = format!("Run {}", super::inbox::clip(&run.run_id, 13));
    page(&web, Some(&visitor), &title, "/live/approvals", &h)
}
