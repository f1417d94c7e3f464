//! Safe HTML by construction: markup comes only from `&'static str` in this
//! crate's source, and every other value (a model's arguments, a client's
//! labels, an error message) goes through [`Html::text`], which escapes it.

use std::fmt::Write as _;

use crate::present::{segment, short_time};

/// An HTML fragment being built.
#[derive(Default)]
pub struct Html(String);

impl Html {
    pub fn new() -> Html {
        Html(String::with_capacity(4096))
    }

    /// Markup written in this crate's source.
    pub fn raw(&mut self, markup: &'static str) -> &mut Html {
        self.0.push_str(markup);
        self
    }

    /// Any value, as text: in an element or a quoted attribute alike.
    pub fn text(&mut self, value: &str) -> &mut Html {
        for c in value.chars() {
            match c {
                '&' => self.0.push_str("&amp;"),
                '<' => self.0.push_str("&lt;"),
                '>' => self.0.push_str("&gt;"),
                '"' => self.0.push_str("&quot;"),
                '\'' => self.0.push_str("&#39;"),
                c => self.0.push(c),
            }
        }
        self
    }

    /// A number (nothing to escape).
    pub fn num(&mut self, value: impl std::fmt::Display) -> &mut Html {
        let _ = write!(self.0, "{value}");
        self
    }

    /// Another fragment built the same way.
    pub fn html(&mut self, other: &Html) -> &mut Html {
        self.0.push_str(&other.0);
        self
    }

    pub fn into_string(self) -> String {
        self.0
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A query string of the given pairs, each value percent-encoded; pairs
/// with an empty value are left out. Starts with `?` unless empty.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", segment(v)))
        .collect();
    match parts.is_empty() {
        true => String::new(),
        false => format!("?{}", parts.join("&")),
    }
}

/// A JSON text pretty-printed (numbers keep every digit); the text as it
/// is if it does not parse.
pub fn pretty_json(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) => serde_json::to_string_pretty(&value).unwrap_or_else(|_| text.to_string()),
        Err(_) => text.to_string(),
    }
}

/// "2026-12-03 09:12:04 UTC"; "" when unset.
pub fn time(timestamp: &Option<prost_types::Timestamp>) -> String {
    match timestamp {
        Some(_) => format!("{} UTC", short_time(timestamp)),
        None => String::new(),
    }
}

/// Milliseconds since the epoch of a timestamp (0 when unset).
pub fn millis(timestamp: &Option<prost_types::Timestamp>) -> i64 {
    timestamp.map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
}

/// "3 min", "2 h 5 min": a duration for people.
pub fn span(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_elements_and_attributes() {
        let mut html = Html::new();
        html.raw("<p title=\"")
            .text("\"><img src=x onerror=alert(1)>")
            .raw("\">")
            .text("<script>alert('x')</script> & co")
            .raw("</p>");
        assert_eq!(
            html.as_str(),
            "<p title=\"&quot;&gt;&lt;img src=x onerror=alert(1)&gt;\">\
             &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co</p>"
        );
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            query(&[("tool", "wire money"), ("run", "")]),
            "?tool=wire%20money"
        );
        assert_eq!(query(&[("run", "")]), "");
    }

    #[test]
    fn json_is_pretty_printed_with_every_digit() {
        assert_eq!(
            pretty_json(r#"{"amount":12345678901234567890,"to":"ACME"}"#),
            "{\n  \"amount\": 12345678901234567890,\n  \"to\": \"ACME\"\n}"
        );
        assert_eq!(pretty_json("not json"), "not json");
    }

    #[test]
    fn spans_read_like_people_say_them() {
        assert_eq!(span(5_000), "5 s");
        assert_eq!(span(125_000), "2 min");
        assert_eq!(span(3_900_000), "1 h 5 min");
    }
}
