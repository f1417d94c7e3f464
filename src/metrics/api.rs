//! The api's metrics, as a tower layer in front of the gRPC services:
//! calls by method and status code, their latency, and the streams and
//! long polls open. A call's code is read where gRPC puts it: in the
//! response headers when it failed at once, else in the trailers at the
//! end of its body (so a stream that ends in an error counts as one).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame};
use tonic::codegen::http;

use super::{MethodCode, MethodLabel, Metrics};

/// Methods that hold their call open (streams and long polls): counted
/// as open streams, and their latency is not a call's latency.
const HELD_OPEN: &[&str] = &[
    "RunService/StreamEvents",
    "ApprovalService/WatchApprovals",
    "WorkerService/PollTask",
    "SubscriptionService/Subscribe",
    "ClusterService/PeerPoll",
];

#[derive(Clone)]
pub struct ApiMetricsLayer {
    metrics: Metrics,
}

impl ApiMetricsLayer {
    pub fn new(metrics: Metrics) -> Self {
        ApiMetricsLayer { metrics }
    }
}

impl<S> tower::Layer<S> for ApiMetricsLayer {
    type Service = ApiMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ApiMetrics<S> {
    inner: S,
    metrics: Metrics,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for ApiMetrics<S>
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

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = Call::new(self.metrics.clone(), request.uri().path());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let (parts, body) = response.into_parts();
            let mut call = call;
            match grpc_status(&parts.headers) {
                Some(code) => {
                    call.end(code);
                    Ok(http::Response::from_parts(parts, body))
                }
                None => {
                    call.open();
                    let body = Observed {
                        inner: body,
                        call: Some(call),
                    };
                    Ok(http::Response::from_parts(
                        parts,
                        tonic::body::Body::new(body),
                    ))
                }
            }
        })
    }
}

/// One call being answered, counted once when it ends.
struct Call {
    metrics: Metrics,
    method: &'static str,
    held_open: bool,
    started: Instant,
    opened: bool,
}

impl Call {
    fn new(metrics: Metrics, path: &str) -> Call {
        let method = method_label(path);
        let held_open = HELD_OPEN.contains(&method);
        Call {
            metrics,
            method,
            held_open,
            started: Instant::now(),
            opened: false,
        }
    }

    /// The response headers are out; the body (and the code) follow.
    fn open(&mut self) {
        if self.held_open {
            self.opened = true;
            self.streams().inc();
        }
    }

    fn streams(&self) -> prometheus_client::metrics::gauge::Gauge {
        self.metrics
            .families()
            .api_open_streams
            .get_or_create(&MethodLabel {
                method: self.method,
            })
            .clone()
    }

    fn end(&mut self, code: &'static str) {
        let families = self.metrics.families();
        families
            .api_requests
            .get_or_create(&MethodCode {
                method: self.method,
                code,
            })
            .inc();
        if !self.held_open {
            families
                .api_request_seconds
                .get_or_create(&MethodLabel {
                    method: self.method,
                })
                .observe(self.started.elapsed().as_secs_f64());
        }
        if std::mem::take(&mut self.opened) {
            self.streams().dec();
        }
    }
}

/// A response body that counts its call when its trailers pass, or as
/// CANCELLED when it is dropped before (the client went away).
struct Observed {
    inner: tonic::body::Body,
    call: Option<Call>,
}

impl Body for Observed {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = grpc_status(trailers).unwrap_or("UNKNOWN");
                    if let Some(mut call) = self.call.take() {
                        call.end(code);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(mut call) = self.call.take() {
                    call.end("INTERNAL");
                }
            }
            Poll::Ready(None) => {
                if let Some(mut call) = self.call.take() {
                    call.end("OK");
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if let Some(mut call) = self.call.take() {
            call.end("CANCELLED");
        }
    }
}

/// The health and reflection methods, as labelled.
const OTHER_METHODS: &[&str] = &[
    "grpc.health.v1.Health/Check",
    "grpc.health.v1.Health/Watch",
    "grpc.health.v1.Health/List",
    "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// `Service/Method` for the aaa api, health and reflection; `other` for
/// any other path (a client cannot mint label values). Static strings, so
/// that counting a call allocates nothing.
fn method_label(path: &str) -> &'static str {
    let path = path.strip_prefix('/').unwrap_or(path);
    let aaa = crate::auth::RULES.iter().find_map(|(rule, _)| {
        let rule = rule.strip_prefix("/aaa.v1.")?;
        (Some(rule) == path.strip_prefix("aaa.v1.")).then_some(rule)
    });
    aaa.or_else(|| OTHER_METHODS.iter().find(|m| **m == path).copied())
        .unwrap_or("other")
}

/// The status code a gRPC response names, if this header map has one.
fn grpc_status(headers: &http::HeaderMap) -> Option<&'static str> {
    let value = headers.get("grpc-status")?;
    let code = value
        .to_str()
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(2);
    Some(code_name(tonic::Code::from_i32(code)))
}

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_methods_name_a_series() {
        assert_eq!(
            method_label("/aaa.v1.RunService/StartRun"),
            "RunService/StartRun"
        );
        assert_eq!(method_label("/aaa.v1.RunService/Made-Up"), "other");
        assert_eq!(method_label("/aaa.v1.RunService/StartRunX"), "other");
        assert_eq!(method_label("/x"), "other");
        assert_eq!(
            method_label("/grpc.health.v1.Health/Check"),
            "grpc.health.v1.Health/Check"
        );
        // A health or reflection path a client makes up is not a series.
        assert_eq!(method_label("/grpc.health.v1.Health/Made-Up"), "other");
        assert_eq!(
            method_label("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            "grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        );
    }
}
