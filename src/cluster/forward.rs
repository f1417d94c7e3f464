//! How a call travels when this server does not serve it. [`Routed`] wraps
//! each aaa service: while this server owns the runs it calls the service;
//! otherwise (a standby, a server taking over, one that lost the runs) it
//! answers [`READS`] itself from the database, and forwards every other
//! call as it came, HTTP/2 frames and all, to the owner's address, and
//! passes the answer back: unary calls, server streams and Subscribe's
//! two-way stream alike.
//!
//! The caller was authenticated here; the owner learns who it is from a
//! signed header (see `auth::forwarded`) instead of its credentials, so the
//! owner checks roles and records the actor as for a direct call. A unary
//! call whose owner cannot be reached at all (the connection is refused)
//! is sent once more, to the owner the database names then; one that
//! failed after it was sent is answered UNAVAILABLE, since the owner may
//! have applied it. A stream the owner stops answering ends with
//! UNAVAILABLE, and the caller resumes it as after any disconnect.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full, Limited};
use tonic::body::Body;
use tonic::codegen::http::{self, header, HeaderMap, Request, Response};
use tonic::server::NamedService;
use tonic::Status;

use super::{unavailable, Cluster, Owner};
use crate::auth::remote_addr;
use crate::auth::{forwarded, ForwardedPeer, Principal};

/// How many servers a call has passed through.
const HOPS: &str = "aaa-forward-hops";
/// A call forwarded this often is refused rather than sent on: the runs
/// are moving, and the caller retries.
const MAX_HOPS: u32 = 2;
/// The calls every server answers from the database, owner or not.
const READS: [&str; 6] = [
    "/aaa.v1.RunService/GetRun",
    "/aaa.v1.RunService/ListRuns",
    "/aaa.v1.RunService/StreamEvents",
    "/aaa.v1.ApprovalService/ListApprovals",
    "/aaa.v1.ApprovalService/WatchApprovals",
    "/aaa.v1.GrantService/ListGrants",
];
/// The one call whose request is a stream (it is not buffered or resent).
const SUBSCRIBE: &str = "/aaa.v1.SubscriptionService/Subscribe";

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

/// A service served here while this server owns the runs, forwarded to
/// the owner otherwise. `local` is filled once this server's engine runs;
/// `reads`, where the service has reads, answers them meanwhile.
pub struct Routed<S> {
    local: Arc<OnceLock<S>>,
    reads: Option<S>,
    cluster: Arc<Cluster>,
    /// Largest request body buffered for a resend (the message limit).
    max_request: usize,
}

impl<S> Routed<S> {
    pub fn new(local: Arc<OnceLock<S>>, cluster: Arc<Cluster>, max_request: usize) -> Self {
        Routed {
            local,
            reads: None,
            cluster,
            max_request,
        }
    }

    /// Answers the service's [`READS`] with `reads` while this server does
    /// not own the runs.
    pub fn with_reads(self, reads: Option<S>) -> Self {
        Routed { reads, ..self }
    }
}

impl<S: Clone> Clone for Routed<S> {
    fn clone(&self) -> Self {
        Routed {
            local: self.local.clone(),
            reads: self.reads.clone(),
            cluster: self.cluster.clone(),
            max_request: self.max_request,
        }
    }
}

impl<S: NamedService> NamedService for Routed<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<Request<Body>> for Routed<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Response<Body>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Tonic's services are always ready; a forward waits in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if self.cluster.serves_here() {
            if let Some(local) = self.local.get() {
                let mut local = local.clone();
                return Box::pin(async move { local.call(request).await });
            }
        }
        if let Some(reads) = &self.reads {
            if READS.contains(&request.uri().path()) {
                let mut reads = reads.clone();
                return Box::pin(async move { reads.call(request).await });
            }
        }
        let cluster = self.cluster.clone();
        let max_request = self.max_request;
        Box::pin(async move {
            Ok(forward(&cluster, request, max_request)
                .await
                .unwrap_or_else(|status| status.into_http()))
        })
    }
}

async fn forward(
    cluster: &Cluster,
    request: Request<Body>,
    max_request: usize,
) -> Result<Response<Body>, Status> {
    let (mut parts, body) = request.into_parts();
    let hops = parts
        .headers
        .get(HOPS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(0);
    if hops >= MAX_HOPS {
        return Err(unavailable(
            &format!(
                "the call passed {hops} servers without reaching the owner of the runs (they \
                 are moving between servers); retry shortly"
            ),
            "",
        ));
    }
    let caller = caller(&parts.extensions);
    prepare_headers(cluster, &mut parts.headers, hops, caller, parts.uri.path());

    if parts.uri.path() == SUBSCRIBE {
        let owner = cluster.owner().await?;
        let request = Request::from_parts(parts, body);
        return send(cluster, &owner, request)
            .await
            .map_err(|(status, _)| status);
    }
    let bytes = Limited::new(body, max_request)
        .collect()
        .await
        .map_err(|e| Status::out_of_range(format!("the request could not be read whole: {e}")))?
        .to_bytes();
    let mut refused_by: Option<String> = None;
    loop {
        let owner = cluster.owner().await?;
        if refused_by.as_deref() == Some(owner.server.as_str()) {
            return Err(unavailable(
                &format!(
                    "the owner of the runs, {} at {}, refuses connections (it stopped; another \
                     server takes the runs over once its lease lapses); retry shortly",
                    owner.server, owner.address
                ),
                &owner.server,
            ));
        }
        let mut request = Request::new(Body::new(Full::new(bytes.clone())));
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = parts.uri.clone();
        *request.version_mut() = parts.version;
        *request.headers_mut() = parts.headers.clone();
        match send(cluster, &owner, request).await {
            Ok(response) => return Ok(response),
            Err((_, true)) => refused_by = Some(owner.server.clone()),
            Err((status, false)) => return Err(status),
        }
    }
}

/// Who the owner is told the caller is: its principal; with auth off, the
/// address it called from (as a server before this one said, or as this
/// server sees it).
fn caller(extensions: &http::Extensions) -> Option<String> {
    if let Some(principal) = extensions.get::<Principal>() {
        return Some(principal.name.clone());
    }
    if let Some(peer) = extensions.get::<ForwardedPeer>() {
        return Some(peer.0.clone());
    }
    remote_addr(extensions).map(|addr| addr.to_string())
}

/// The caller's credentials stay here: the owner gets the caller, signed,
/// and the hop count instead.
fn prepare_headers(
    cluster: &Cluster,
    headers: &mut HeaderMap,
    hops: u32,
    caller: Option<String>,
    method: &str,
) {
    headers.remove(header::AUTHORIZATION);
    headers.remove(forwarded::PRINCIPAL);
    headers.remove(forwarded::SIGNATURE);
    headers.insert(HOPS, http::HeaderValue::from(hops + 1));
    if let Some(name) = caller {
        let now_ms = crate::engine::now_ms();
        forwarded::sign(headers, &cluster.key, &name, method, now_ms);
    }
}

/// Sends one call to the owner. On failure: the status to answer, and
/// whether the call surely never reached the owner (safe to send again).
async fn send(
    cluster: &Cluster,
    owner: &Owner,
    request: Request<Body>,
) -> Result<Response<Body>, (Status, bool)> {
    let mut channel = owner.channel.clone();
    match tower::ServiceExt::oneshot(&mut channel, request).await {
        Ok(response) => {
            let server = owner.server.clone();
            Ok(response.map(|body| {
                Body::new(Forwarded {
                    body,
                    server,
                    ended: false,
                })
            }))
        }
        Err(e) => {
            cluster.forget(owner);
            let refused = never_connected(&e);
            let message = format!(
                "the owner of the runs, {} at {}, did not answer ({}){}",
                owner.server,
                owner.address,
                crate::api::status::clip(&crate::causes::with_causes(&e)),
                if refused {
                    ""
                } else {
                    "; the call may or may not have been applied"
                },
            );
            Err((unavailable(&message, &owner.server), refused))
        }
    }
}

/// Whether the error says the connection was never made.
fn never_connected(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::TimedOut
            );
        }
        cause = e.source();
    }
    false
}

/// The owner's answer, passed on; if its connection breaks mid-answer (a
/// stream whose owner died), the answer ends with UNAVAILABLE instead of a
/// reset, so callers treat it as any disconnect and resume.
struct Forwarded {
    body: Body,
    server: String,
    ended: bool,
}

impl http_body::Body for Forwarded {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                self.ended = true;
                let status = unavailable(
                    &format!(
                        "the owner of the runs, {}, stopped answering ({e}); resume the call",
                        self.server
                    ),
                    &self.server,
                );
                let mut trailers = HeaderMap::new();
                match status.add_header(&mut trailers) {
                    Ok(()) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                    Err(status) => Poll::Ready(Some(Err(status))),
                }
            }
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }
}
