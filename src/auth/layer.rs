//! The tower layer in front of every service: authenticates the caller,
//! checks the RPC against [`super::RULES`], and hands the principal to the
//! handlers in the request extensions. One check covers every service.
//! A call that carries forwarded headers has its body read whole first
//! (bounded by the message limit), since its signature covers the body;
//! every other call passes with its body untouched.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::{BodyExt, Full, Limited};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::forwarded::{self, FromServer, Verifier};
use super::{authenticate_from, authorize, is_open, AuthConfig, ForwardedPeer, Principal};
use super::{Refusal, Throttle};

/// Checks every call against the auth config. Without one (local
/// development) it checks only what a forwarding server says about the
/// caller: its address, for the actor of the events the call appends.
#[derive(Clone)]
pub struct AuthLayer {
    auth: Option<Arc<AuthConfig>>,
    /// Wrong credentials per address, shared with the server's other doors.
    throttle: Arc<Throttle>,
    /// Verifies the calls other servers forward (and this server's web
    /// inbox makes), signed with the store's secret key.
    verifier: Arc<Verifier>,
    /// The largest request body read to verify a forwarded call (the
    /// message limit and its framing).
    max_request: usize,
    /// The status a refusal is answered with: the api's one mapping, handed
    /// in, so that auth needs nothing of the api.
    answer: fn(&Refusal) -> tonic::Status,
}

impl AuthLayer {
    pub fn new(
        auth: Option<Arc<AuthConfig>>,
        throttle: Arc<Throttle>,
        verifier: Verifier,
        max_request: usize,
        answer: fn(&Refusal) -> tonic::Status,
    ) -> Self {
        AuthLayer {
            auth,
            throttle,
            verifier: Arc::new(verifier),
            max_request,
            answer,
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    layer: AuthLayer,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for AuthService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let layer = &self.layer;
        let method = request.uri().path();
        let open = layer.auth.is_some() && is_open(method);
        if open || !forwarded::carried(request.headers()) {
            // A direct call: its own credentials; its body is not read.
            let checked = match &layer.auth {
                Some(auth) => direct(auth, &layer.throttle, &request),
                None => Ok(None),
            };
            return match checked {
                Ok(principal) => {
                    if let Some(principal) = principal {
                        request.extensions_mut().insert(principal);
                    }
                    Box::pin(self.inner.call(request))
                }
                Err(refusal) => refuse(layer, &refusal, &request),
            };
        }
        // A forwarded call: its signature covers its body, which is read
        // whole first (the forwarding server sent it whole). The service
        // `poll_ready` readied goes with the call; its clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = layer.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let method = parts.uri.path();
            let (body, bytes) = if forwarded::is_request_stream(method) {
                (body, bytes::Bytes::new())
            } else {
                match Limited::new(body, layer.max_request).collect().await {
                    Ok(collected) => {
                        let bytes = collected.to_bytes();
                        (Body::new(Full::new(bytes.clone())), bytes)
                    }
                    Err(_) => {
                        let refusal = Refusal::ForwardRefused(
                            "its request could not be read whole within the message limit",
                        );
                        let request = http::Request::from_parts(parts, ());
                        return refuse(&layer, &refusal, &request).await;
                    }
                }
            };
            let mut request = http::Request::from_parts(parts, body);
            match forwarded_caller(&layer, &request, &bytes) {
                Ok(caller) => {
                    // Its signature verified: a server of the cluster sent it.
                    request.extensions_mut().insert(FromServer);
                    match caller {
                        Caller::Principal(principal) => {
                            request.extensions_mut().insert(principal);
                        }
                        Caller::Peer(peer) => {
                            request.extensions_mut().insert(peer);
                        }
                    }
                }
                Err(refusal) => return refuse(&layer, &refusal, &request).await,
            }
            inner.call(request).await
        })
    }
}

/// Who the caller of a forwarded call is, as the forwarding server said.
enum Caller {
    Principal(Principal),
    Peer(ForwardedPeer),
}

/// Answers a refused call, and logs why. Whoever names no principal is
/// logged once a minute per address (anyone can send such calls, as fast
/// as they like): wrong credentials and the calls the throttle refuses by
/// `authenticate_from`, the others here; a principal's refusals each time.
fn refuse<B, E: Send + 'static>(
    layer: &AuthLayer,
    refusal: &Refusal,
    request: &http::Request<B>,
) -> BoxFuture<http::Response<Body>, E> {
    let method = request.uri().path();
    match refusal {
        Refusal::UnknownCredentials | Refusal::Throttled { .. } => {}
        Refusal::MissingCredentials
        | Refusal::MalformedCredentials(_)
        | Refusal::ForwardRefused(_) => {
            let address = remote_addr(request.extensions());
            if let Some(first) = layer.throttle.unnamed(address) {
                let (refused, _) = first.before.unwrap_or_default();
                tracing::warn!(
                    method,
                    peer = peer(request),
                    previous_minute_refused = refused,
                    "refused: {refusal}; more refusals of callers naming no principal from \
                     this address within a minute are counted, not logged"
                );
            }
        }
        _ => tracing::warn!(method, peer = peer(request), "refused: {refusal}"),
    }
    let status = (layer.answer)(refusal);
    Box::pin(async move { Ok(status.into_http()) })
}

/// The caller a forwarded call names, once its signature verifies for this
/// call (`body`, as received) at this server: with auth on, its principal,
/// whose roles must allow the method; with auth off, the client's address.
fn forwarded_caller(
    layer: &AuthLayer,
    request: &http::Request<Body>,
    body: &[u8],
) -> Result<Caller, Refusal> {
    let method = request.uri().path();
    // Wall time: signatures are compared across servers' clocks.
    let now_ms = crate::clock::now_ms();
    let name = layer
        .verifier
        .verify(request.headers(), method, body, now_ms)?
        .ok_or(Refusal::ForwardRefused("it carries no principal"))?;
    let Some(auth) = &layer.auth else {
        return Ok(Caller::Peer(ForwardedPeer(name.to_string())));
    };
    let principal = auth.principal_named(name).ok_or(Refusal::ForwardRefused(
        "it names a principal this server's auth config does not have",
    ))?;
    authorize(method, &principal)?;
    Ok(Caller::Principal(principal))
}

/// The principal of a call that was not forwarded, `None` for open
/// methods, or why it is refused.
fn direct<B>(
    auth: &AuthConfig,
    throttle: &Throttle,
    request: &http::Request<B>,
) -> Result<Option<Principal>, Refusal> {
    let method = request.uri().path();
    if is_open(method) {
        return Ok(None);
    }
    let principal = credentials(auth, throttle, request.headers(), request.extensions())?;
    authorize(method, &principal)?;
    Ok(Some(principal))
}

/// The principal a request's own credentials name: its bearer token, or
/// else its client certificate, through the throttle. gRPC calls and plain
/// HTTP (`/metrics`, MCP) authenticate the same way.
pub fn credentials(
    auth: &AuthConfig,
    throttle: &Throttle,
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
) -> Result<Principal, Refusal> {
    let bearer = bearer_token(headers)?;
    let certs = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.peer_certs());
    let cert = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
    if let (None, Some(der)) = (bearer, cert) {
        require_client_auth(der)?;
    }
    authenticate_from(auth, throttle, remote_addr(extensions), bearer, cert)
}

/// The token of the one `authorization: Bearer TOKEN` header, if any. A
/// header in any other form is refused before anything is hashed: two of
/// them (which one would count?), another scheme or none, an empty token,
/// bytes that are not visible ASCII.
fn bearer_token(headers: &http::HeaderMap) -> Result<Option<&str>, Refusal> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Refusal::MalformedCredentials(
            "more than one authorization header",
        ));
    }
    let value = value.to_str().map_err(|_| {
        Refusal::MalformedCredentials("the authorization header is not visible ASCII")
    })?;
    // The scheme name is case-insensitive (RFC 9110, section 11.1).
    let token = match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token,
        _ => {
            return Err(Refusal::MalformedCredentials(
                "the authorization header is not `Bearer TOKEN`",
            ))
        }
    };
    if token.trim().is_empty() {
        return Err(Refusal::MalformedCredentials(
            "the authorization header has an empty token",
        ));
    }
    Ok(Some(token))
}

/// A client certificate names a caller only when it says it is for client
/// authentication: its extendedKeyUsage must be present and hold clientAuth
/// (the TLS layer checks the chain, and the usage only when it is present).
fn require_client_auth(der: &[u8]) -> Result<(), Refusal> {
    let refused = |why| Err(Refusal::MalformedCredentials(why));
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return refused("the client certificate cannot be parsed");
    };
    match cert.extended_key_usage() {
        Ok(Some(usage)) if usage.value.client_auth => Ok(()),
        Ok(Some(_)) => refused("the client certificate's extendedKeyUsage lacks clientAuth"),
        Ok(None) => {
            refused("the client certificate has no extendedKeyUsage (clientAuth is required)")
        }
        Err(_) => refused("the client certificate's extendedKeyUsage cannot be read"),
    }
}

/// The caller's address, for the log line of a refusal.
fn peer<B>(request: &http::Request<B>) -> String {
    remote_addr(request.extensions()).map_or_else(|| "unknown".to_string(), |a| a.to_string())
}

/// The address a call came from, over TCP or TLS.
pub fn remote_addr(extensions: &http::Extensions) -> Option<std::net::SocketAddr> {
    extensions
        .get::<TcpConnectInfo>()
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .map(|i| i.get_ref())
        })
        .and_then(|i| i.remote_addr())
}
