//! How the server's things are shown to people, in the one form the web
//! inbox, the `aaa` command and webhooks share: the links of the inbox's
//! pages (paths and absolute URLs), times to the second, and the words for
//! run statuses. It sits beneath `web`, `cli` and `subscriptions`, so that
//! none of them imports another to write these the same way.

use std::fmt::Write as _;

use prost_types::Timestamp;

use crate::proto::RunStatus;

/// A path segment (a run or call id, a tool name) percent-encoded for a
/// URL; in a page it still goes through `web::html::Html::text`.
pub fn segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

/// The link of a call's page, relative to the site's root.
pub fn call_path(run_id: &str, call_id: &str) -> String {
    format!("/calls/{}/{}", segment(run_id), segment(call_id))
}

/// The link of a run's page.
pub fn run_path(run_id: &str) -> String {
    format!("/runs/{}", segment(run_id))
}

/// The absolute link of a call's page under `base` (`--public-url`).
pub fn call_url(base: &str, run_id: &str, call_id: &str) -> String {
    format!(
        "{}{}",
        base.trim_end_matches('/'),
        call_path(run_id, call_id)
    )
}

/// The absolute link of a run's page under `base`.
pub fn run_url(base: &str, run_id: &str) -> String {
    format!("{}{}", base.trim_end_matches('/'), run_path(run_id))
}

/// "2025-06-01 12:03:04" (UTC) for tables: to the second; "" when unset.
pub fn short_time(timestamp: &Option<Timestamp>) -> String {
    let full = timestamp.map_or_else(String::new, |t| t.to_string());
    let seconds = full.split(['.', 'Z']).next().unwrap_or_default();
    seconds.replacen('T', " ", 1)
}

/// The enum value's name without its prefix, lowercase:
/// RUN_STATUS_WAITING_FOR_APPROVAL -> "waiting_for_approval".
pub fn word(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_lowercase()
}

/// A run's status as a word ("waiting_for_approval"); an unknown value as
/// its number.
pub fn status_word(status: i32) -> String {
    RunStatus::try_from(status).map_or_else(
        |_| status.to_string(),
        |s| word(s.as_str_name(), "RUN_STATUS_"),
    )
}

/// The inverse of [`status_word`], for `--status` and the runs page's filter.
pub fn parse_status(text: &str) -> Result<RunStatus, String> {
    match RunStatus::from_str_name(&format!("RUN_STATUS_{}", text.to_uppercase())) {
        Some(status) if status != RunStatus::Unspecified => Ok(status),
        _ => Err("expected running, waiting_for_approval, completed, failed or cancelled".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_links_are_percent_encoded() {
        assert_eq!(segment("call-1"), "call-1");
        assert_eq!(segment("a/b c\"<"), "a%2Fb%20c%22%3C");
        assert_eq!(call_path("r 1", "c/2"), "/calls/r%201/c%2F2");
    }
}
