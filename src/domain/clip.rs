//! Client values quoted in errors and logs are clipped to a short prefix
//! with their length: an error must stay a few hundred bytes, or clients
//! refuse the trailer it travels in (grpcio's limit is 8 KiB).

/// Longest client value quoted whole, in bytes.
const WHOLE_BYTES: usize = 96;
/// How much of a longer one is quoted. A clipped value is itself shorter
/// than [`WHOLE_BYTES`], so clipping twice changes nothing.
const CLIP_BYTES: usize = 64;

/// `value`, or its first [`CLIP_BYTES`] (on a char boundary) and its length.
pub fn clip(value: &str) -> String {
    if value.len() <= WHOLE_BYTES {
        return value.to_string();
    }
    format!("{}... ({} bytes)", prefix(value, CLIP_BYTES), value.len())
}

/// The longest prefix of `value` of at most `max` bytes.
pub fn prefix(value: &str, max: usize) -> &str {
    let mut end = max.min(value.len());
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}
