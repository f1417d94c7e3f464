//! An error's text with the texts of its causes, for messages that must
//! say why (a TLS handshake or a refused connection says so only in its
//! source).

/// The error's text followed by each cause's that it does not already
/// contain, joined by ": ".
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(source) = cause {
        let more = source.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = source.source();
    }
    text
}
