//! The tower layer in front of every service: authenticates the caller,
//! checks the RPC against [`super::RULES`], and hands the principal to the
//! handlers in the request extensions. One check covers every service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::{authorize, forwarded, is_open, AuthConfig, ForwardedPeer, Principal, Refusal};

/// Checks every call against the auth config. Without one (local
/// development) it checks only what a forwarding server says about the
/// caller: its address, for the actor of the events the call appends.
#[derive(Clone)]
pub struct AuthLayer {
    auth: Option<Arc<AuthConfig>>,
    /// The store's secret key, which signs calls other servers forward.
    key: Arc<[u8; 32]>,
}

impl AuthLayer {
    pub fn new(auth: Option<Arc<AuthConfig>>, key: [u8; 32]) -> Self {
        AuthLayer {
            auth,
            key: Arc::new(key),
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            auth: self.auth.clone(),
            key: self.key.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Option<Arc<AuthConfig>>,
    key: Arc<[u8; 32]>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let checked = match &self.auth {
            Some(auth) => check(auth, &self.key[..], &request).map(|p| p.map(Caller::Principal)),
            None => forwarded_peer(&self.key[..], &request).map(|p| p.map(Caller::Peer)),
        };
        // A signature that is there passed the checks above (a bad one is
        // refused), so the call came from a server of the cluster.
        if checked.is_ok() && request.headers().contains_key(forwarded::SIGNATURE) {
            request.extensions_mut().insert(forwarded::FromServer);
        }
        match checked {
            Ok(Some(Caller::Principal(principal))) => {
                request.extensions_mut().insert(principal);
            }
            Ok(Some(Caller::Peer(peer))) => {
                request.extensions_mut().insert(peer);
            }
            Ok(None) => {}
            Err(refusal) => {
                tracing::warn!(
                    method = request.uri().path(),
                    peer = peer(&request),
                    "refused: {refusal}"
                );
                let status = crate::api::status::refused(&refusal);
                return Box::pin(async move { Ok(status.into_http()) });
            }
        }
        Box::pin(self.inner.call(request))
    }
}

/// Who the caller is, as far as this server knows.
enum Caller {
    Principal(Principal),
    Peer(ForwardedPeer),
}

/// With auth off: the address of the client a forwarded call came from,
/// once the forwarding server's signature verifies; `None` for a call
/// that was not forwarded.
fn forwarded_peer<B>(
    key: &[u8],
    request: &http::Request<B>,
) -> Result<Option<ForwardedPeer>, Refusal> {
    let method = request.uri().path();
    let now_ms = crate::engine::now_ms();
    let peer = forwarded::verify(request.headers(), key, method, now_ms)?;
    Ok(peer.map(|address| ForwardedPeer(address.to_string())))
}

/// The caller's principal, `None` for open methods, or why it is refused.
fn check<B>(
    auth: &AuthConfig,
    key: &[u8],
    request: &http::Request<B>,
) -> Result<Option<Principal>, Refusal> {
    let method = request.uri().path();
    if is_open(method) {
        return Ok(None);
    }
    // Wall time: signatures are compared across servers' clocks.
    let now_ms = crate::engine::now_ms();
    if let Some(name) = forwarded::verify(request.headers(), key, method, now_ms)? {
        let principal = auth
            .principal_named(name)
            .ok_or(Refusal::UnknownCredentials)?;
        authorize(method, &principal)?;
        return Ok(Some(principal));
    }
    let principal = credentials(auth, request.headers(), request.extensions())?;
    authorize(method, &principal)?;
    Ok(Some(principal))
}

/// The principal a request's own credentials name: its bearer token, or
/// else its client certificate. gRPC calls and plain HTTP (`/metrics`)
/// authenticate the same way.
pub fn credentials(
    auth: &AuthConfig,
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
    auth.authenticate(bearer, cert)
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
