//! Why the engine refuses a request. Mapped to gRPC statuses once, in
//! `api::status`.

use crate::domain::check::Invalid;
use crate::domain::token::InvalidToken;

/// A refusal; none of them changes a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("run '{0}' not found")]
    RunNotFound(String),
    /// The run finished and was deleted by retention at `expired_ms`.
    #[error("run '{run}' finished and was deleted by retention (its events, summary and approvals are gone)")]
    RunExpired { run: String, expired_ms: i64 },
    #[error("grant '{0}' not found")]
    GrantNotFound(String),
    #[error("run '{run}' has no approval request or call '{call}'")]
    CallNotFound { run: String, call: String },
    #[error("{field}: {message}")]
    InvalidField { field: String, message: String },
    #[error("{field} is {size} bytes, more than the limit of {limit} bytes")]
    PayloadTooLarge {
        field: String,
        size: usize,
        limit: usize,
    },
    #[error("type: '{0}' is reserved for the engine; clients may append aaa.approval.granted, aaa.approval.denied and types outside the 'aaa.' prefix")]
    ReservedEventType(String),
    #[error("run '{0}' has finished")]
    RunFinished(String),
    #[error("attempt {attempt} of call '{call}' is not the current attempt")]
    StaleAttempt { call: String, attempt: u32 },
    #[error("arguments_sha256 {expected} does not match the requested arguments of call '{call}' (sha256 {actual})")]
    ArgumentsMismatch {
        call: String,
        expected: String,
        actual: String,
    },
    #[error("{approver} already voted for call '{call}'; its other grants must come from other approvers")]
    AlreadyVoted { call: String, approver: String },
    #[error("{field}: no worker has registered a tool named '{name}'")]
    ToolNotRegistered { field: String, name: String },
    #[error("token: not a task token of this server")]
    InvalidToken,
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the store cannot take writes ({0}); nothing of this call was written, retry later")]
    StorageUnavailable(String),
    /// Another server claimed the run: this one no longer writes it.
    #[error("{0}; nothing of this call was written: send it to the server that runs this deployment now")]
    OwnershipLost(String),
    /// Who may do what (auth on): a refusal found by the engine, such as a
    /// task token of another principal.
    #[error("{0}")]
    Refused(#[from] crate::auth::Refusal),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The run is not there: never was, or deleted by retention.
    pub fn is_missing_run(&self) -> bool {
        matches!(self, Error::RunNotFound(_) | Error::RunExpired { .. })
    }

    /// Why `run` is not in the store: deleted by retention (while its
    /// tombstone lasts), or not found.
    pub async fn missing_run(store: &crate::store::SharedStore, run: crate::store::RunId) -> Error {
        match store.expired_at(run).await {
            Ok(Some(expired_ms)) => Error::RunExpired {
                run: run.to_string(),
                expired_ms,
            },
            Ok(None) => Error::RunNotFound(run.to_string()),
            Err(e) => e.into(),
        }
    }

    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Error::InvalidField {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl Error {
    /// The same error with every client value clipped to a short prefix
    /// (see `domain::clip`), for messages that stay small.
    pub fn clipped(self) -> Self {
        use crate::domain::clip::clip;
        match self {
            Error::RunNotFound(run) => Error::RunNotFound(clip(&run)),
            Error::RunExpired { run, expired_ms } => Error::RunExpired {
                run: clip(&run),
                expired_ms,
            },
            Error::CallNotFound { run, call } => Error::CallNotFound {
                run: clip(&run),
                call: clip(&call),
            },
            Error::InvalidField { field, message } => Error::InvalidField {
                field: clip(&field),
                message,
            },
            Error::PayloadTooLarge { field, size, limit } => Error::PayloadTooLarge {
                field: clip(&field),
                size,
                limit,
            },
            Error::ReservedEventType(kind) => Error::ReservedEventType(clip(&kind)),
            Error::RunFinished(run) => Error::RunFinished(clip(&run)),
            Error::StaleAttempt { call, attempt } => Error::StaleAttempt {
                call: clip(&call),
                attempt,
            },
            Error::ArgumentsMismatch {
                call,
                expected,
                actual,
            } => Error::ArgumentsMismatch {
                call: clip(&call),
                expected: clip(&expected),
                actual,
            },
            Error::AlreadyVoted { call, approver } => Error::AlreadyVoted {
                call: clip(&call),
                approver: clip(&approver),
            },
            Error::ToolNotRegistered { field, name } => Error::ToolNotRegistered {
                field: clip(&field),
                name: clip(&name),
            },
            other => other,
        }
    }
}

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Self {
        match invalid {
            Invalid::Field { field, message } => Error::InvalidField { field, message },
            Invalid::TooLarge { field, size, limit } => {
                Error::PayloadTooLarge { field, size, limit }
            }
        }
    }
}

impl From<InvalidToken> for Error {
    fn from(_: InvalidToken) -> Self {
        Error::InvalidToken
    }
}

impl From<crate::store::StoreError> for Error {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::Closed => Error::ShuttingDown,
            crate::store::StoreError::Io(e) => Error::StorageUnavailable(e.to_string()),
            crate::store::StoreError::Unavailable(cause) => Error::StorageUnavailable(cause),
            // Another server wrote the run first (two servers on one
            // database): nothing was written, the run's state is read again
            // before its next change, so a retry is right.
            conflict @ crate::store::StoreError::Conflict { .. } => {
                Error::StorageUnavailable(conflict.to_string())
            }
            // Nothing was written; the engine reads the grants again, so a
            // retry decides without the stale grant.
            stale @ crate::store::StoreError::GrantUnusable(_) => {
                Error::StorageUnavailable(stale.to_string())
            }
            // An earlier try of the request committed first: nothing was
            // written; the engine reads the answer recorded (see
            // `Engine::once`), and a client's retry does too.
            recorded @ crate::store::StoreError::RequestRecorded { .. } => {
                Error::StorageUnavailable(recorded.to_string())
            }
            fenced @ crate::store::StoreError::Fenced { .. } => {
                Error::OwnershipLost(fenced.to_string())
            }
            other => Error::Internal(other.to_string()),
        }
    }
}
