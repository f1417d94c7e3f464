//! The caller's deadline, answered DEADLINE_EXCEEDED. tonic's transport
//! honours `grpc-timeout` in a layer outside every one of ours and answers
//! CANCELLED "Timeout expired" when it passes, which the gRPC spec and our
//! clients' retry rules (docs/api.md) read as the caller having gone away,
//! not as a deadline. This [`layer`], the outermost of ours, keeps the same
//! deadline a little earlier (so it is the one that fires) and answers
//! DEADLINE_EXCEEDED.
//!
//! What a call did before its deadline passed is not undone: an append
//! that was committing completes (the engine commits in a task of its own),
//! and a retry with the same request_id returns its answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::http;
use tonic::Status;

/// How much earlier than tonic's our deadline is. Ours is fixed in `call`,
/// which tonic's layer makes before it starts its own timer, and tonic
/// polls the call before its timer, so ours wins even with none; the
/// margin only keeps the two out of one tick of the timer wheel.
const AHEAD: Duration = Duration::from_millis(2);

#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

/// The layer: in front of every service, before authentication.
pub fn layer() -> DeadlineLayer {
    DeadlineLayer
}

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
}

type Response = http::Response<tonic::body::Body>;

impl<S, B> tower::Service<http::Request<B>> for Deadline<S>
where
    S: tower::Service<http::Request<B>, Response = Response>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let timeout = request
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse);
        // Fixed now, not when the future is first polled (which a busy
        // runtime may do later than tonic starts its timer).
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t.saturating_sub(AHEAD));
        let answer = self.inner.call(request);
        match deadline {
            None => Box::pin(answer),
            Some(deadline) => Box::pin(async move {
                match tokio::time::timeout_at(deadline, answer).await {
                    Ok(answered) => answered,
                    Err(_) => Ok(Status::deadline_exceeded(
                        "the caller's deadline (grpc-timeout) passed before the call finished; \
                         what it appended, if anything, is durable: retry with the same request_id",
                    )
                    .into_http()),
                }
            }),
        }
    }
}

/// A `grpc-timeout` value: at most 8 digits and a unit (H, M, S, m, u, n).
fn parse(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(parse("500m"), Some(Duration::from_millis(500)));
        assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "m", "123456789m", "5x", "-5m", "5 m"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
