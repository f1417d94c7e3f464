//! Plain HTTP beside gRPC on the same port. A request whose content-type
//! is not `application/grpc…` goes to an axum router (`/metrics`, the web
//! inbox), which authenticates its callers itself; every gRPC request goes
//! on to the auth layer and the services. The router has no gRPC path, so
//! nothing reaches a service around the auth layer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use tonic::codegen::http;
use tower::ServiceExt;

/// Sends the requests that are not gRPC to `router`.
#[derive(Clone)]
pub struct HttpLayer {
    router: Router,
}

impl HttpLayer {
    pub fn new(router: Router) -> Self {
        HttpLayer { router }
    }
}

impl<S> tower::Layer<S> for HttpLayer {
    type Service = HttpOrGrpc<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpOrGrpc {
            inner,
            router: self.router.clone(),
        }
    }
}

#[derive(Clone)]
pub struct HttpOrGrpc<S> {
    inner: S,
    router: Router,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for HttpOrGrpc<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if is_grpc(&request) {
            return Box::pin(self.inner.call(request));
        }
        let router = self.router.clone();
        Box::pin(async move {
            let request = request.map(axum::body::Body::new);
            let response = match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok(response.map(tonic::body::Body::new))
        })
    }
}

/// gRPC (and gRPC-Web) requests say so in their content-type.
fn is_grpc<B>(request: &http::Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

/// What a router handler answers when it refuses: a status and one line.
/// The answer of a plain HTTP door (`/metrics`, MCP) to a caller the auth
/// check refused: 403 for a missing role, 429 with `Retry-After` for an
/// address the throttle holds back, 401 otherwise; the reason as text.
pub fn refused(refusal: &crate::auth::Refusal) -> axum::response::Response {
    use crate::auth::Refusal;
    let status = match refusal {
        Refusal::MissingRole { .. } => http::StatusCode::FORBIDDEN,
        Refusal::Throttled { .. } => http::StatusCode::TOO_MANY_REQUESTS,
        _ => http::StatusCode::UNAUTHORIZED,
    };
    let mut response = plain(status, format!("{refusal}\n"));
    if let Refusal::Throttled { retry_after_s } = refusal {
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, (*retry_after_s).into());
    }
    response
}

pub fn plain(status: http::StatusCode, text: impl Into<String>) -> axum::response::Response {
    let mut response = axum::response::Response::new(axum::body::Body::from(text.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
