//! Checks of client text every road shares: names (tools, models, event
//! types, label keys, request ids) and sizes. A refusal names the field.

/// Longest name (tool, model, event type, label key, request id).
pub const MAX_NAME_BYTES: usize = 256;

/// Client input that is refused before anything is done with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("{field}: {message}")]
    Field { field: String, message: String },
    #[error("{field} is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        field: String,
        size: usize,
        limit: usize,
    },
}

impl Invalid {
    pub fn field(field: &str, message: impl Into<String>) -> Self {
        Invalid::Field {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

pub fn check_size(field: &str, text: &str, limit: usize) -> Result<(), Invalid> {
    if text.len() > limit {
        return Err(Invalid::TooLarge {
            field: field.to_string(),
            size: text.len(),
            limit,
        });
    }
    Ok(())
}

/// The model that drives the runs of MCP sessions. Only aaa's MCP gateway
/// serves it: a worker serving it would take the sessions' turns.
pub const MCP_MODEL: &str = "aaa.mcp";

/// The worker identity aaa's MCP gateway takes its tasks under: a worker
/// calling itself so would be recorded as the gateway.
pub const MCP_WORKER: &str = "aaa.mcp";

/// A worker's identity (RegisterWorker, PollTask): not the one aaa's MCP
/// gateway works under.
pub fn worker_identity(field: &str, text: &str) -> Result<(), Invalid> {
    if text == MCP_WORKER {
        return Err(Invalid::field(
            field,
            format!("'{MCP_WORKER}' is reserved for aaa's MCP gateway; name another identity"),
        ));
    }
    Ok(())
}

/// A model a worker names (RegisterWorker, PollTask): a name, and not one
/// aaa serves itself.
pub fn served_model(field: &str, text: &str) -> Result<(), Invalid> {
    name(field, text)?;
    if text == MCP_MODEL {
        return Err(Invalid::field(
            field,
            format!("'{MCP_MODEL}' is reserved for aaa's MCP gateway; name another model"),
        ));
    }
    Ok(())
}

/// A name: non-empty, at most 256 bytes, letters, digits and `_-.:/`.
pub fn name(field: &str, text: &str) -> Result<(), Invalid> {
    if text.is_empty() {
        return Err(Invalid::field(field, "required"));
    }
    check_size(field, text, MAX_NAME_BYTES)?;
    if let Some(bad) = text
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.:/".contains(*c)))
    {
        return Err(Invalid::field(
            field,
            format!("'{text}' contains '{bad}'; use letters, digits and _ - . : /"),
        ));
    }
    Ok(())
}
