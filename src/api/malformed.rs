//! Requests whose bytes do not decode as the method's message. tonic
//! answers them INTERNAL ("failed to decode Protobuf message: ...") before
//! any handler runs, with no ErrorInfo; the fault is the client's. This
//! [`layer`], in front of every service, turns such answers into
//! INVALID_ARGUMENT with reason MALFORMED_REQUEST; [`from_stream`] does the
//! same for a message read from a client stream.

use tonic::codegen::http;
use tonic::{Code, Status};

use super::status;

/// How tonic's prost codec starts the message of a decode failure.
const DECODE_FAILURE: &str = "failed to decode Protobuf message";

/// The status a client should see for a failure reading its stream.
pub fn from_stream(received: Status) -> Status {
    match decode_failure(received.code(), received.message()) {
        Some(detail) => status::malformed(detail),
        None => received,
    }
}

/// The decoder's words when `message` is one of tonic's decode failures.
fn decode_failure(code: Code, message: &str) -> Option<&str> {
    if code != Code::Internal {
        return None;
    }
    let detail = message.strip_prefix(DECODE_FAILURE)?;
    Some(detail.trim_start_matches(':').trim())
}

/// The layer: a plain map of every response, no allocation per call.
pub fn layer() -> tower::util::MapResponseLayer<fn(Response) -> Response> {
    tower::util::MapResponseLayer::new(rewrite as fn(Response) -> Response)
}

type Response = http::Response<tonic::body::Body>;

fn rewrite(response: Response) -> Response {
    // A decode failure is answered before any message, so its status is in
    // the headers (a trailers-only response). Answers that stream, and
    // every OK, carry no grpc-status header and pass untouched.
    let internal = response
        .headers()
        .get("grpc-status")
        .is_some_and(|code| code.as_bytes() == b"13");
    if !internal {
        return response;
    }
    match Status::from_header_map(response.headers()) {
        Some(refused) => match decode_failure(refused.code(), refused.message()) {
            Some(detail) => status::malformed(detail).into_http(),
            None => response,
        },
        None => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_decode_failures_are_recognised() {
        let detail = decode_failure(
            Code::Internal,
            "failed to decode Protobuf message: StartRunRequest.task: invalid string value: data is not UTF-8 encoded",
        );
        assert_eq!(
            detail,
            Some("StartRunRequest.task: invalid string value: data is not UTF-8 encoded")
        );
        assert_eq!(decode_failure(Code::Internal, "internal error"), None);
        assert_eq!(
            decode_failure(Code::InvalidArgument, "failed to decode Protobuf message"),
            None
        );
        let status = from_stream(Status::internal("failed to decode Protobuf message: x"));
        assert_eq!(status.code(), Code::InvalidArgument);
    }
}
