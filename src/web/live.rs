//! Live updates as Server-Sent Events, each fed by a gRPC stream made as
//! the signed-in person: the inbox follows WatchApprovals (a new request
//! is sent as its rendered row, a resolution as its key, and every change
//! with the count the title shows), a run's timeline follows StreamEvents.
//! A stream ends when the browser goes, when its gRPC stream ends, when
//! the server stops, so that no open page holds up a graceful shutdown,
//! and at its next update once its session no longer stands (signed out
//! elsewhere), so that a page left open stops receiving.

use std::collections::HashSet;
use std::convert::Infallible;

use axum::extract::{Path, Query, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::events;
use super::inbox::{row, Filters};
use super::session::Session;
use super::{refusal, status_page, Visitor, Web};
use crate::proto::{stream_events_response, watch_approvals_response, StreamEventsRequest};

/// Items waiting for a slow browser before the stream waits.
const BUFFER: usize = 32;

type Sender = mpsc::Sender<Result<SseEvent, Infallible>>;

fn sse(rx: mpsc::Receiver<Result<SseEvent, Infallible>>) -> Response {
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn event(name: &'static str, data: serde_json::Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event(name).data(data.to_string()))
}

pub async fn approvals(
    State(web): State<Web>,
    visitor: Visitor,
    Query(filters): Query<Filters>,
) -> Response {
    let request = match filters.watch_request() {
        Ok(request) => request,
        Err(message) => return refusal(StatusCode::BAD_REQUEST, &message),
    };
    let mut stream = match visitor.caller.watch_approvals(request).await {
        Ok(stream) => stream,
        Err(status) => return status_page(&status),
    };
    let (tx, rx) = mpsc::channel(BUFFER);
    let stopping = web.0.settings.stopping.clone();
    let out = Out {
        tx,
        web,
        session: visitor.session,
    };
    tokio::spawn(async move {
        let mut pending: HashSet<String> = HashSet::new();
        let mut live = false;
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = stopping.cancelled() => return,
                () = out.tx.closed() => return,
            };
            let Ok(Some(message)) = message else { return };
            let Some(item) = message.item else { continue };
            let sent = match item {
                watch_approvals_response::Item::Requested(a) => {
                    let key = format!("{}/{}", a.run_id, a.call_id);
                    let new = pending.insert(key.clone());
                    if !new || !(live || filters.wants(&a.run_id, &a.call_id)) {
                        continue;
                    }
                    let row = row(&a, crate::clock::now_ms());
                    send(
                        &out,
                        event(
                            "requested",
                            json!({"key": key, "row": row.as_str(), "count": pending.len()}),
                        ),
                    )
                    .await
                }
                watch_approvals_response::Item::Resolved(r) => {
                    let key = format!("{}/{}", r.run_id, r.call_id);
                    if !pending.remove(&key) || !live {
                        continue;
                    }
                    send(
                        &out,
                        event("resolved", json!({"key": key, "count": pending.len()})),
                    )
                    .await
                }
                watch_approvals_response::Item::Voted(v) => {
                    let key = format!("{}/{}", v.run_id, v.call_id);
                    let text = format!("grants {}/{}", v.votes, v.approvals_required);
                    send(&out, event("voted", json!({"key": key, "votes": text}))).await
                }
                watch_approvals_response::Item::SnapshotComplete(_) => {
                    live = true;
                    send(&out, event("count", json!({"count": pending.len()}))).await
                }
                watch_approvals_response::Item::Heartbeat(_) => continue,
            };
            if !sent {
                return;
            }
        }
    });
    sse(rx)
}

/// Where a stream's items go: the browser, while its session stands.
struct Out {
    tx: Sender,
    web: Web,
    session: Session,
}

/// Sends an item to the browser; false when the stream is to end (the
/// browser went, or the session no longer stands).
async fn send(out: &Out, item: Result<SseEvent, Infallible>) -> bool {
    if !matches!(out.web.0.sessions.stands(&out.session).await, Ok(true)) {
        return false;
    }
    out.tx.send(item).await.is_ok()
}

#[derive(Deserialize)]
pub struct After {
    #[serde(default)]
    after: u64,
}

pub async fn run_events(
    State(web): State<Web>,
    visitor: Visitor,
    Path(run_id): Path<String>,
    Query(after): Query<After>,
) -> Response {
    let request = StreamEventsRequest {
        run_id,
        after_seq: after.after,
        follow: true,
        stop_at_end: true,
        ..Default::default()
    };
    let mut stream = match visitor.caller.stream_events(request).await {
        Ok(stream) => stream,
        Err(status) => return status_page(&status),
    };
    let (tx, rx) = mpsc::channel(BUFFER);
    let stopping = web.0.settings.stopping.clone();
    let out = Out {
        tx,
        web,
        session: visitor.session,
    };
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = stopping.cancelled() => return,
                () = out.tx.closed() => return,
            };
            let Ok(Some(message)) = message else { return };
            let Some(stream_events_response::Item::Event(e)) = message.item else {
                continue;
            };
            let terminal = events::is_terminal(&e.r#type);
            let status = e.r#type.rsplit('.').next().unwrap_or("").to_string();
            let item = events::item(&e);
            let data = json!({
                "seq": e.seq,
                "item": item.as_str(),
                "ended": if terminal { status } else { String::new() },
            });
            if !send(&out, event("event", data)).await || terminal {
                return;
            }
        }
    });
    sse(rx)
}
