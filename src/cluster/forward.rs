//! How a call travels when this server does not serve it. [`Routed`] wraps
//! each aaa service: while this server's engine serves every shard it
//! calls the service. Otherwise (a standby, a server taking over, one that
//! lost the runs, or one holding a share of spread shards) it answers
//! reads itself from the database, serves a call for a run of a shard it
//! serves (the run named by the request) and a call that names no run, and
//! forwards every other call as it came, HTTP/2 frames and all, to the
//! owner of the run's shard, and passes the answer back: unary calls,
//! server streams and Subscribe's two-way stream alike. Which calls are
//! reads and which field names a call's run is each rpc's `aaa.v1.route`
//! option in proto/ (see [`routes`]).
//!
//! The caller was authenticated here; the owner learns who it is from a
//! signed header (see `auth::forwarded`) instead of its credentials, so the
//! owner checks roles and records the actor as for a direct call. The
//! signature is made for each owner the call is sent to, over the request
//! as sent, and is good there once. A unary
//! call whose owner cannot be reached at all (the connection is refused)
//! is sent once more, to the owner the database names then; one that
//! failed after it was sent is answered UNAVAILABLE, since the owner may
//! have applied it. A stream the owner stops answering ends with
//! UNAVAILABLE, and the caller resumes it as after any disconnect.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full, Limited};
use tonic::body::Body;
use tonic::codegen::http::{self, header, HeaderMap, Request, Response};
use tonic::server::NamedService;
use tonic::Status;

use super::routes::{self, Kind, Route};
use super::{unavailable, Cluster, Owner, ANY_SHARD};
use crate::auth::remote_addr;
use crate::auth::{forwarded, ForwardedPeer, Principal};

/// How many servers a call has passed through.
const HOPS: &str = "aaa-forward-hops";
/// A call forwarded this often is refused rather than sent on: the runs
/// are moving, and the caller retries.
const MAX_HOPS: u32 = 2;
/// How long a forwarded call waits for a shard between owners: a dead
/// owner's lease (3 s by default) and the next server's look.
const MOVE_WAIT: Duration = Duration::from_secs(5);
/// How often it reads who owns the shard meanwhile.
const LOOK_AGAIN: Duration = Duration::from_millis(200);

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

/// The slot of a service served here: filled while this server's engine
/// runs, empty while it has none (or swaps one for another).
pub type Slot<S> = Arc<RwLock<Option<S>>>;

/// A service served here for the runs of the shards this server's engine
/// serves, forwarded to the owner of the run's shard otherwise. `reads`,
/// where the service has reads, answers them from the database when this
/// server does not serve every shard.
pub struct Routed<S> {
    local: Slot<S>,
    reads: Option<S>,
    cluster: Arc<Cluster>,
    /// Largest request body buffered for a resend (the message limit).
    max_request: usize,
}

impl<S: NamedService> Routed<S> {
    pub fn new(local: Slot<S>, cluster: Arc<Cluster>, max_request: usize) -> Self {
        // A LOCAL rpc is served by the server asked, engine or not; a
        // Routed service has no engine's service on a standby to serve it.
        let prefix = format!("/{}/", S::NAME);
        if let Some(local) = routes::ROUTES
            .iter()
            .find(|r| r.kind == Kind::Local && r.method.starts_with(&prefix))
        {
            panic!(
                "{} is ROUTE_KIND_LOCAL, but its service is routed: register {} unwrapped",
                local.method,
                S::NAME
            );
        }
        Routed {
            local,
            reads: None,
            cluster,
            max_request,
        }
    }

    /// Answers the service's reads ([`Kind::Read`]) with `reads` while this
    /// server does not serve every shard.
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
        + Sync
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
        let serving = self.cluster.serving();
        let local = self.local.read().expect("poisoned").clone();
        // A path proto/ does not have (the service answers UNIMPLEMENTED)
        // goes where a call that names no run goes.
        let route = routes::find(request.uri().path());
        let kind = route.map_or(Kind::AnyOwner, |route| route.kind);
        match local {
            // Serving every shard, it serves every call.
            Some(mut local) if serving.is_all() => {
                return Box::pin(async move { local.call(request).await });
            }
            // A call that names no run (a worker's registration or poll, a
            // grant, a batch of decisions) is served by any server with an
            // engine.
            Some(mut local) if kind == Kind::AnyOwner && !serving.is_empty() => {
                return Box::pin(async move { local.call(request).await });
            }
            _ => {}
        }
        if let Some(reads) = &self.reads {
            if kind == Kind::Read {
                let mut reads = reads.clone();
                return Box::pin(async move { reads.call(request).await });
            }
        }
        let local = self.local.clone();
        let cluster = self.cluster.clone();
        let max_request = self.max_request;
        Box::pin(async move {
            Ok(route_call(&cluster, &local, request, route, max_request)
                .await
                .unwrap_or_else(|status| status.into_http()))
        })
    }
}

/// Serves a call here if its run's shard is served here, or forwards it to
/// the shard's owner (a call that names no run: to the owner of
/// [`ANY_SHARD`]).
async fn route_call<S>(
    cluster: &Cluster,
    local: &Slot<S>,
    request: Request<Body>,
    route: Option<&Route>,
    max_request: usize,
) -> Result<Response<Body>, Status>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let (mut parts, body) = request.into_parts();
    if let Some(route) = route.filter(|route| route.request_stream) {
        // A request stream (Subscribe's, served by the owner of its group's
        // shard): its first message (the open) names the key; the rest is
        // passed on as it comes, never buffered or resent.
        let (first, rest) = first_message(body, max_request).await?;
        let shard = shard_of(route, &first, &parts.extensions).unwrap_or(ANY_SHARD);
        let body = Body::new(Prepended {
            first: Some(first),
            rest,
        });
        if cluster.serves_soon(shard).await {
            return serve_here(local, Request::from_parts(parts, body)).await;
        }
        let caller = prepare_forward(&mut parts)?;
        let Some(owner) = cluster.owner_of(shard).await? else {
            return Err(taking_over());
        };
        // A request stream's signature covers no body (see auth::forwarded).
        let method = parts.uri.path().to_string();
        sign(
            cluster,
            &mut parts.headers,
            caller,
            &method,
            &owner.address,
            &[],
        );
        return send(cluster, &owner, Request::from_parts(parts, body))
            .await
            .map_err(|(status, _)| status);
    }
    let bytes = Limited::new(body, max_request)
        .collect()
        .await
        .map_err(|e| Status::out_of_range(format!("the request could not be read whole: {e}")))?
        .to_bytes();
    let serving = cluster.serving();
    let shard = route
        .and_then(|route| shard_of(route, &bytes, &parts.extensions))
        .or_else(|| serving.iter().next())
        .unwrap_or(ANY_SHARD);
    if !cluster.serves_soon(shard).await {
        let caller = prepare_forward(&mut parts)?;
        match forward(cluster, &parts, caller, &bytes, shard).await? {
            Some(response) => return Ok(response),
            // The database names this server the owner now: it is taking
            // the shard over, and the call is served here once it serves.
            None if cluster.serves_soon(shard).await => {}
            None => return Err(taking_over()),
        }
    }
    serve_here(
        local,
        Request::from_parts(parts, Body::new(Full::new(bytes))),
    )
    .await
}

/// Serves the call with this server's engine's service, if it has one.
async fn serve_here<S>(local: &Slot<S>, request: Request<Body>) -> Result<Response<Body>, Status>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S: Clone,
{
    let service = local.read().expect("poisoned").clone();
    match service {
        Some(mut service) => Ok(service.call(request).await.unwrap_or_else(|e| match e {})),
        None => Err(taking_over()),
    }
}

/// UNAVAILABLE: this server owns the shard and is starting to serve it.
fn taking_over() -> Status {
    unavailable("this server is taking these runs over; retry shortly", "")
}

/// The shard of the run (or group) a buffered gRPC request, or a request
/// stream's first message, names (see [`Route::shard`]).
fn shard_of(route: &Route, framed: &[u8], extensions: &http::Extensions) -> Option<u8> {
    // A gRPC message: a compression flag, a 4-byte length, the message.
    let message = framed.get(5..)?;
    if framed.first() != Some(&0) {
        return None;
    }
    let caller = extensions
        .get::<Principal>()
        .map_or("", |p| p.name.as_str());
    route.shard(message, caller)
}

/// Reads a request stream's first gRPC message whole (flag, length,
/// message); answers it with the rest of the stream.
async fn first_message(mut body: Body, max_request: usize) -> Result<(Bytes, Body), Status> {
    let mut first = bytes::BytesMut::new();
    loop {
        if first.len() >= 5 {
            let length = u32::from_be_bytes([first[1], first[2], first[3], first[4]]) as usize;
            if length > max_request {
                return Err(Status::out_of_range(format!(
                    "the first message is {length} bytes, more than the limit of {max_request}"
                )));
            }
            if first.len() >= 5 + length {
                return Ok((first.freeze(), body));
            }
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    first.extend_from_slice(&data);
                }
            }
            Some(Err(status)) => return Err(status),
            // It ended first: the service answers what it got.
            None => return Ok((first.freeze(), body)),
        }
    }
}

/// A request stream whose first bytes were read already.
struct Prepended {
    first: Option<Bytes>,
    rest: Body,
}

impl http_body::Body for Prepended {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(first) = self.first.take().filter(|first| !first.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }
}

/// Refuses a call that has been forwarded too often, and readies its
/// headers for the next hop; answers who the owner is to be told the
/// caller is (signed for each owner it is sent to).
fn prepare_forward(parts: &mut http::request::Parts) -> Result<Option<String>, Status> {
    let hops = parts
        .headers
        .get(HOPS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(0);
    if hops >= MAX_HOPS {
        return Err(unavailable(
            &format!(
                "the call passed {hops} servers without reaching the owner of its run (the \
                 runs are moving between servers); retry shortly"
            ),
            "",
        ));
    }
    strip_headers(&mut parts.headers, hops);
    Ok(caller(&parts.extensions))
}

/// Sends a buffered call to the owner of `shard`; `None` when the
/// database names this server the owner (the call is served here). A
/// shard between owners (its owner died and its lease has not lapsed, or
/// no server has claimed it yet) is waited for, up to [`MOVE_WAIT`], so
/// the call reaches the next owner instead of failing.
async fn forward(
    cluster: &Cluster,
    parts: &http::request::Parts,
    caller: Option<String>,
    bytes: &Bytes,
    shard: u8,
) -> Result<Option<Response<Body>>, Status> {
    let until = tokio::time::Instant::now() + MOVE_WAIT;
    let mut refused_by: Option<String> = None;
    loop {
        let owner = match cluster.owner_of(shard).await {
            Ok(Some(owner)) => owner,
            Ok(None) => return Ok(None),
            Err(status) => {
                look_again_before(until, status).await?;
                continue;
            }
        };
        if refused_by.as_deref() == Some(owner.server.as_str()) {
            let status = unavailable(
                &format!(
                    "the owner of the run, {} at {}, refuses connections (it stopped; another \
                     server takes its runs over once its lease lapses); retry shortly",
                    owner.server, owner.address
                ),
                &owner.server,
            );
            look_again_before(until, status).await?;
            cluster.forget_owners();
            continue;
        }
        let mut request = Request::new(Body::new(Full::new(bytes.clone())));
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = parts.uri.clone();
        *request.version_mut() = parts.version;
        *request.headers_mut() = parts.headers.clone();
        // Signed for this owner, now: a signature is good at one server,
        // once, and a server that started since refuses older ones.
        sign(
            cluster,
            request.headers_mut(),
            caller.clone(),
            parts.uri.path(),
            &owner.address,
            bytes,
        );
        match send(cluster, &owner, request).await {
            Ok(response) => return Ok(Some(response)),
            Err((_, true)) => refused_by = Some(owner.server.clone()),
            Err((status, false)) => return Err(status),
        }
    }
}

/// Waits a moment before who owns the shard is read again; `status` if
/// that would pass `until`.
async fn look_again_before(until: tokio::time::Instant, status: Status) -> Result<(), Status> {
    if tokio::time::Instant::now() + LOOK_AGAIN > until {
        return Err(status);
    }
    tokio::time::sleep(LOOK_AGAIN).await;
    Ok(())
}

/// Who the owner is told the caller is: its principal; with auth off, the
/// address it called from (as a server before this one said, or as this
/// server sees it).
pub(crate) fn caller(extensions: &http::Extensions) -> Option<String> {
    if let Some(principal) = extensions.get::<Principal>() {
        return Some(principal.name.clone());
    }
    if let Some(peer) = extensions.get::<ForwardedPeer>() {
        return Some(peer.0.clone());
    }
    remote_addr(extensions).map(|addr| addr.to_string())
}

/// The caller's credentials stay here: the owner gets the caller, signed
/// (see [`sign`]), and the hop count instead.
fn strip_headers(headers: &mut HeaderMap, hops: u32) {
    headers.remove(header::AUTHORIZATION);
    headers.remove(forwarded::PRINCIPAL);
    headers.remove(forwarded::SIGNATURE);
    headers.insert(HOPS, http::HeaderValue::from(hops + 1));
}

/// Signs `caller` (if known) on a call of `method` to the server at `to`
/// whose request body is `body` (not read for a request stream).
fn sign(
    cluster: &Cluster,
    headers: &mut HeaderMap,
    caller: Option<String>,
    method: &str,
    to: &str,
    body: &[u8],
) {
    let Some(name) = caller else {
        return;
    };
    let call = forwarded::Call { method, to, body };
    forwarded::sign(headers, &cluster.key, &name, &call, crate::clock::now_ms());
}

/// The metadata of a call this server makes to the server at `to` for
/// `caller` (see `caller`): a first hop, signed for this one request
/// (`body`, its gRPC frames; see `forwarded::unary_body`; empty for a
/// request stream).
pub(crate) fn signed_for(
    cluster: &Cluster,
    caller: Option<String>,
    method: &str,
    to: &str,
    body: &[u8],
) -> tonic::metadata::MetadataMap {
    let mut headers = HeaderMap::new();
    strip_headers(&mut headers, 0);
    sign(cluster, &mut headers, caller, method, to, body);
    tonic::metadata::MetadataMap::from_headers(headers)
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
                crate::domain::clip::clip(&crate::causes::with_causes(&e)),
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
