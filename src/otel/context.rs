//! W3C trace context (`traceparent`) and the span ids of a run's spans.
//!
//! A run's spans are made after the fact, from its committed events, by
//! whichever server owns it then. So their ids are not random: each is
//! derived from the run id and what the span is (the run, an approval, an
//! attempt), and every server, before or after a failover, names the same
//! span the same way. A worker is handed its attempt's span id before the
//! attempt's span exists, and makes its own span a child of it.

use sha2::{Digest, Sha256};

use crate::store::RunId;

/// The trace a run belongs to: the one its starter sent as `traceparent`,
/// or one of its own (its id is the run id's bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The starter's span: the parent of the run span.
    pub parent: Option<[u8; 8]>,
    /// What the starter decided about sampling (true for a trace of its own).
    pub sampled: bool,
}

impl TraceContext {
    /// A `traceparent` header value, version 00: `00-TRACE-SPAN-FLAGS`,
    /// lowercase hex, neither id all zeros. Other versions are read as 00
    /// (their first four fields), as the W3C spec asks.
    pub fn parse(text: &str) -> Result<TraceContext, String> {
        let bad = |why: &str| Err(format!("traceparent '{text}': {why}"));
        let fields: Vec<&str> = text.trim().split('-').collect();
        if fields.len() < 4 {
            return bad("expected 00-TRACE_ID-SPAN_ID-FLAGS");
        }
        let (version, trace, span, flags) = (fields[0], fields[1], fields[2], fields[3]);
        if version.len() != 2 || version == "ff" || !is_lower_hex(version) {
            return bad("the version is not two hex digits (ff is invalid)");
        }
        if version == "00" && fields.len() != 4 {
            return bad("version 00 has exactly four fields");
        }
        let trace_id: [u8; 16] = match hex_bytes(trace) {
            Some(id) => id,
            None => return bad("the trace id is not 32 lowercase hex digits"),
        };
        let span_id: [u8; 8] = match hex_bytes(span) {
            Some(id) => id,
            None => return bad("the parent id is not 16 lowercase hex digits"),
        };
        let flags: [u8; 1] = match hex_bytes(flags) {
            Some(flags) => flags,
            None => return bad("the flags are not two lowercase hex digits"),
        };
        if trace_id == [0; 16] || span_id == [0; 8] {
            return bad("an all-zero id is invalid");
        }
        Ok(TraceContext {
            trace_id,
            parent: Some(span_id),
            sampled: flags[0] & 1 == 1,
        })
    }

    /// The trace of a run whose starter sent none.
    pub fn of_run(run: RunId) -> TraceContext {
        TraceContext {
            trace_id: *run.as_bytes(),
            parent: None,
            sampled: true,
        }
    }

    /// The `traceparent` naming `span` of this trace.
    pub fn traceparent(&self, span: [u8; 8]) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(span),
            u8::from(self.sampled)
        )
    }
}

/// The id of a span of `run`: a hash of the run and what the span is.
pub fn span_id(run: RunId, what: &[&[u8]]) -> [u8; 8] {
    let mut hash = Sha256::new();
    hash.update(run.as_bytes());
    for part in what {
        hash.update((part.len() as u32).to_be_bytes());
        hash.update(part);
    }
    let digest = hash.finalize();
    let mut id = [0; 8];
    id.copy_from_slice(&digest[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// The run span.
pub fn run_span(run: RunId) -> [u8; 8] {
    span_id(run, &[b"run"])
}

/// The span of one attempt of a tool call.
pub fn attempt_span(run: RunId, call_id: &str, attempt: u32) -> [u8; 8] {
    span_id(
        run,
        &[b"execute_tool", call_id.as_bytes(), &attempt.to_be_bytes()],
    )
}

/// The span of one model call.
pub fn chat_span(run: RunId, call_id: &str) -> [u8; 8] {
    span_id(run, &[b"chat", call_id.as_bytes()])
}

/// The span of the approval of one call.
pub fn approval_span(run: RunId, call_id: &str) -> [u8; 8] {
    span_id(run, &[b"approval", call_id.as_bytes()])
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !is_lower_hex(text) {
        return None;
    }
    let bytes = hex::decode(text).ok()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_and_written_back() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = TraceContext::parse(text).expect("valid");
        assert!(context.sampled);
        let parent = context.parent.expect("a parent");
        assert_eq!(context.traceparent(parent), text);
        let unsampled = TraceContext::parse(&text.replace("-01", "-00")).expect("valid");
        assert!(!unsampled.sampled);
    }

    #[test]
    fn malformed_traceparents_are_refused_with_the_reason() {
        for (text, why) in [
            ("", "expected"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                "expected",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "trace id",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "all-zero",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "all-zero",
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                "four fields",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902-01",
                "parent id",
            ),
        ] {
            let error = TraceContext::parse(text).expect_err(text);
            assert!(error.contains(why), "{text}: {error}");
        }
    }

    #[test]
    fn span_ids_differ_by_what_they_name() {
        let run = RunId::new();
        assert_ne!(attempt_span(run, "c1", 1), attempt_span(run, "c1", 2));
        assert_ne!(approval_span(run, "c1"), chat_span(run, "c1"));
        assert_eq!(run_span(run), run_span(run));
    }
}
