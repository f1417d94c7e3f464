//! The inbox: the pending calls the signed-in person may see, a page at a
//! time (ListApprovals), filtered by tool, label and run, kept live by the
//! approvals stream (see `live`): a new request appears and a decided one
//! leaves without a reload, and the title counts what waits.

use std::time::Instant;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::html::{self, Html};
use super::{page, status_page, Visitor, Web};
use crate::present;
use crate::proto::{Approval, ListApprovalsRequest, WatchApprovalsRequest};

/// Calls on one page of the inbox.
pub const PAGE_SIZE: u32 = 50;

/// The inbox's filters, as the query string carries them.
#[derive(Deserialize, Default, Clone)]
pub struct Filters {
    #[serde(default)]
    pub tool: String,
    /// `KEY=VALUE`.
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub run: String,
    /// "1": only calls the visitor may decide.
    #[serde(default)]
    pub mine: String,
    /// "newest" or "oldest" (the default).
    #[serde(default)]
    pub order: String,
    /// The page token of ListApprovals.
    #[serde(default)]
    pub page: String,
    /// For the live stream: the requests already pending that the page
    /// lacks and should get: those after this `RUN/CALL` key (the newest
    /// the page shows), `-` for all; none when absent.
    #[serde(default)]
    pub since: Option<String>,
}

impl Filters {
    fn labels(&self) -> Result<std::collections::HashMap<String, String>, String> {
        match self.label.trim() {
            "" => Ok(Default::default()),
            label => match label.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => {
                    Ok([(k.trim().to_string(), v.trim().to_string())].into())
                }
                _ => Err(format!("the label filter '{label}' is not KEY=VALUE")),
            },
        }
    }

    /// Whether a request already pending when the stream started belongs
    /// on the page (see `since`).
    pub fn wants(&self, run_id: &str, call_id: &str) -> bool {
        match self.since.as_deref() {
            None => false,
            Some("-") => true,
            Some(since) => {
                let (run, call) = since.split_once('/').unwrap_or((since, ""));
                (run_id, call_id) > (run, call)
            }
        }
    }

    pub fn newest_first(&self) -> bool {
        self.order == "newest"
    }

    pub fn list_request(&self) -> Result<ListApprovalsRequest, String> {
        Ok(ListApprovalsRequest {
            tool: self.tool.trim().to_string(),
            run_id: self.run.trim().to_string(),
            labels: self.labels()?,
            page_size: PAGE_SIZE,
            page_token: self.page.clone(),
            decidable: self.mine == "1",
            newest_first: self.newest_first(),
        })
    }

    pub fn watch_request(&self) -> Result<WatchApprovalsRequest, String> {
        Ok(WatchApprovalsRequest {
            tool: self.tool.trim().to_string(),
            run_id: self.run.trim().to_string(),
            labels: self.labels()?,
            after_position: None,
            resume_token: None,
            heartbeat_s: 0.0,
            decidable: self.mine == "1",
        })
    }

    /// The query string of these filters (no page), for links and the stream.
    pub fn query(&self, page: &str) -> String {
        html::query(&[
            ("tool", self.tool.trim()),
            ("label", self.label.trim()),
            ("run", self.run.trim()),
            ("mine", &self.mine),
            ("order", &self.order),
            ("page", page),
        ])
    }
}

pub async fn page_handler(
    State(web): State<Web>,
    visitor: Visitor,
    Query(filters): Query<Filters>,
) -> Response {
    // A runner (no approver or reader role) has no inbox: its runs.
    if !visitor.sees_approvals() {
        return axum::response::Redirect::to("/runs").into_response();
    }
    let started = Instant::now();
    let request = match filters.list_request() {
        Ok(request) => request,
        Err(message) => return super::refusal(http::StatusCode::BAD_REQUEST, &message),
    };
    let listed = match visitor.caller.list_approvals(request).await {
        Ok(listed) => listed,
        Err(status) => return status_page(&status),
    };
    let now = crate::clock::now_ms();
    let mut h = Html::new();
    h.raw("<h1>Inbox</h1>");
    filter_form(&mut h, &filters);
    h.raw("<p class=\"summary\" aria-live=\"polite\"><span id=\"pending\">")
        .num(listed.approvals.len())
        .raw(match listed.next_page_token.is_empty() {
            true => "</span> pending</p>",
            false => "+</span> pending</p>",
        });
    // The live stream adds rows only to the page new requests belong on:
    // the first when newest come first, the last when oldest do.
    let tail = match filters.newest_first() {
        true => filters.page.is_empty(),
        false => listed.next_page_token.is_empty(),
    };
    h.raw("<ul class=\"calls\" id=\"inbox\" data-order=\"")
        .text(if filters.newest_first() {
            "newest"
        } else {
            "oldest"
        })
        .raw("\" data-tail=\"")
        .raw(if tail { "1" } else { "0" })
        .raw("\">");
    for approval in &listed.approvals {
        h.html(&row(approval, now));
    }
    h.raw("</ul><p class=\"empty\" id=\"empty\"")
        .raw(if listed.approvals.is_empty() {
            ""
        } else {
            " hidden"
        })
        .raw(">Nothing waits for a decision.</p>");
    if !listed.next_page_token.is_empty() {
        h.raw("<p class=\"pager\"><a rel=\"next\" href=\"/")
            .text(&filters.query(&listed.next_page_token))
            .raw("\">Next page</a></p>");
    }
    // Requests made between the list and the stream's snapshot: the
    // stream sends those newer than the newest row shown.
    let newest = match filters.newest_first() {
        true => listed.approvals.first(),
        false => listed.approvals.last(),
    };
    let since = newest.map_or_else(
        || "-".to_string(),
        |a| format!("{}/{}", a.run_id, a.call_id),
    );
    let mut live = format!("/live/approvals{}", filters.query(""));
    if tail {
        live.push(if live.contains('?') { '&' } else { '?' });
        live.push_str(&format!("since={}", present::segment(&since)));
    }
    let mut response = page(&web, Some(&visitor), "Inbox", &live, &h);
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    if let Ok(value) = format!("app;dur={elapsed:.1}").parse() {
        response.headers_mut().insert("server-timing", value);
    }
    response
}

fn filter_form(h: &mut Html, filters: &Filters) {
    // Folded unless in use: on a phone the calls come first.
    let in_use = !(filters.tool.trim().is_empty()
        && filters.label.trim().is_empty()
        && filters.run.trim().is_empty()
        && filters.mine.is_empty()
        && filters.order.is_empty());
    h.raw("<details class=\"filters\"")
        .raw(if in_use { " open" } else { "" })
        .raw("><summary>Filter and order</summary>")
        .raw("<form class=\"filters\" method=\"get\" action=\"/\">")
        .raw("<label>Tool <input name=\"tool\" value=\"")
        .text(filters.tool.trim())
        .raw("\"></label><label>Label <input name=\"label\" placeholder=\"key=value\" value=\"")
        .text(filters.label.trim())
        .raw("\"></label><label>Run <input name=\"run\" value=\"")
        .text(filters.run.trim())
        .raw("\"></label><label>Order <select name=\"order\"><option value=\"oldest\"")
        .raw(if filters.newest_first() {
            ""
        } else {
            " selected"
        })
        .raw(">oldest first</option><option value=\"newest\"")
        .raw(if filters.newest_first() {
            " selected"
        } else {
            ""
        })
        .raw(">newest first</option></select></label>")
        .raw("<label class=\"check\"><input type=\"checkbox\" name=\"mine\" value=\"1\"")
        .raw(if filters.mine == "1" { " checked" } else { "" })
        .raw("> only calls I may decide</label><button type=\"submit\">Filter</button></form></details>");
}

/// One pending call in the inbox (also sent by the live stream).
pub fn row(a: &Approval, now_ms: i64) -> Html {
    let mut h = Html::new();
    let waited = now_ms - html::millis(&a.requested_at);
    h.raw("<li class=\"call\" data-key=\"")
        .text(&a.run_id)
        .raw("/")
        .text(&a.call_id)
        .raw("\"><a class=\"open\" href=\"")
        .text(&present::call_path(&a.run_id, &a.call_id))
        .raw("\"><span class=\"tool\">")
        .text(&a.tool)
        .raw("</span> <span class=\"args\">")
        .text(&clip(&a.arguments_json, 160))
        .raw("</span></a><p class=\"task\">")
        .text(&clip(&a.task, 200))
        .raw("</p><p class=\"meta\"><span>waiting ")
        .text(&html::span(waited))
        .raw("</span>");
    if a.approvals_required > 1 {
        h.raw("<span class=\"votes\">grants ")
            .num(a.votes.len())
            .raw("/")
            .num(a.approvals_required)
            .raw("</span>");
    }
    if a.expires_at.is_some() {
        h.raw("<span>expires ")
            .text(&html::time(&a.expires_at))
            .raw("</span>");
    }
    let mut labels: Vec<_> = a.labels.iter().collect();
    labels.sort();
    for (k, v) in labels {
        h.raw("<span class=\"label\">")
            .text(k)
            .raw("=")
            .text(v)
            .raw("</span>");
    }
    h.raw("</p></li>");
    h
}

/// At most `max` characters of `text`, with an ellipsis when cut.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}\u{2026}", &text[..at]),
        None => text.to_string(),
    }
}
