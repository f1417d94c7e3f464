//! The one mapping from engine errors to gRPC statuses, each with a
//! google.rpc.ErrorInfo (domain "aaa.v1") whose reason SDKs branch on.
//! Reasons are the names of the proto's `ErrorReason` enum, so a reason the
//! proto does not declare cannot be sent. Internal errors are logged here
//! and reach clients without their details; auth refusals (`refused`) are
//! logged by the auth layer.
//!
//! Every client value an error carries (ids, names, fields) is clipped
//! (`domain::clip`): an error must stay a few hundred bytes, or
//! clients refuse the trailer it travels in (grpcio's limit is 8 KiB).

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::auth::Refusal;
use crate::domain::clip::{clip, prefix};
use crate::engine::Error;
use crate::proto::ErrorReason;

pub const DOMAIN: &str = "aaa.v1";

/// Longest message a status carries, in bytes.
const MAX_MESSAGE_BYTES: usize = 512;

/// A status with an ErrorInfo; the message is cut at [`MAX_MESSAGE_BYTES`]
/// and metadata values clipped, whatever the caller built them from.
pub fn error_status(
    code: Code,
    reason: ErrorReason,
    message: &str,
    metadata: HashMap<String, String>,
) -> Status {
    let metadata: HashMap<String, String> = metadata
        .into_iter()
        .map(|(key, value)| (key, clip(&value)))
        .collect();
    let message = if message.len() > MAX_MESSAGE_BYTES {
        format!("{}...", prefix(message, MAX_MESSAGE_BYTES))
    } else {
        message.to_string()
    };
    let details = ErrorDetails::with_error_info(reason.as_str_name(), DOMAIN, metadata);
    Status::with_error_details(code, message, details)
}

pub fn to_status(error: Error) -> Status {
    let error = error.clipped();
    let mut metadata = HashMap::new();
    let (code, reason) = match &error {
        Error::RunNotFound(run) => {
            metadata.insert("run_id".to_string(), run.clone());
            (Code::NotFound, ErrorReason::RunNotFound)
        }
        Error::RunExpired { run, expired_ms } => {
            metadata.insert("run_id".to_string(), run.clone());
            metadata.insert("expired_ms".to_string(), expired_ms.to_string());
            (Code::NotFound, ErrorReason::RunExpired)
        }
        Error::GrantNotFound(id) => {
            metadata.insert("grant_id".to_string(), id.clone());
            (Code::NotFound, ErrorReason::GrantNotFound)
        }
        Error::CallNotFound { run, call } => {
            metadata.insert("run_id".to_string(), run.clone());
            metadata.insert("call_id".to_string(), call.clone());
            (Code::NotFound, ErrorReason::CallNotFound)
        }
        Error::InvalidField { field, .. } => {
            metadata.insert("field".to_string(), field.clone());
            (Code::InvalidArgument, ErrorReason::InvalidField)
        }
        Error::PayloadTooLarge { field, limit, .. } => {
            metadata.insert("field".to_string(), field.clone());
            metadata.insert("limit".to_string(), limit.to_string());
            (Code::InvalidArgument, ErrorReason::PayloadTooLarge)
        }
        Error::ReservedEventType(_) => {
            metadata.insert("field".to_string(), "type".to_string());
            (Code::InvalidArgument, ErrorReason::ReservedEventType)
        }
        Error::RunFinished(run) => {
            metadata.insert("run_id".to_string(), run.clone());
            (Code::FailedPrecondition, ErrorReason::RunFinished)
        }
        Error::StaleAttempt { call, attempt } => {
            metadata.insert("call_id".to_string(), call.clone());
            metadata.insert("attempt".to_string(), attempt.to_string());
            (Code::FailedPrecondition, ErrorReason::StaleAttempt)
        }
        Error::ArgumentsMismatch { call, .. } => {
            metadata.insert("call_id".to_string(), call.clone());
            (Code::FailedPrecondition, ErrorReason::ArgumentsMismatch)
        }
        Error::AlreadyVoted { call, approver } => {
            metadata.insert("call_id".to_string(), call.clone());
            metadata.insert("approver".to_string(), approver.clone());
            (Code::FailedPrecondition, ErrorReason::AlreadyVoted)
        }
        Error::ToolNotRegistered { field, .. } => {
            metadata.insert("field".to_string(), field.clone());
            (Code::InvalidArgument, ErrorReason::ToolNotRegistered)
        }
        Error::InvalidToken => {
            metadata.insert("field".to_string(), "token".to_string());
            (Code::InvalidArgument, ErrorReason::InvalidToken)
        }
        Error::Refused(refusal) => return refused(refusal),
        Error::OwnershipLost(_) => (Code::Unavailable, ErrorReason::OwnershipLost),
        Error::ShuttingDown => (Code::Unavailable, ErrorReason::ShuttingDown),
        Error::StorageUnavailable(cause) => {
            tracing::warn!("refused a write: the store is unavailable: {cause}");
            (Code::Unavailable, ErrorReason::StorageUnavailable)
        }
        Error::Internal(detail) => {
            tracing::error!("internal error: {detail}");
            return error_status(
                Code::Internal,
                ErrorReason::InternalError,
                "internal error; the server log has the details",
                metadata,
            );
        }
    };
    error_status(code, reason, &error.to_string(), metadata)
}

/// The ErrorReason name and message `error` gets as a status, for answers
/// that report an error per item (DecideApprovals).
pub fn reason_and_message(error: Error) -> (String, String) {
    let status = to_status(error);
    let reason = status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
        .unwrap_or_default();
    (reason, status.message().to_string())
}

/// A request whose bytes did not decode as the method's message. tonic
/// answers those INTERNAL without an ErrorInfo; the fault is the client's.
pub fn malformed(detail: &str) -> Status {
    error_status(
        Code::InvalidArgument,
        ErrorReason::MalformedRequest,
        &format!("the request is not a valid message of the method's type: {detail}"),
        HashMap::new(),
    )
}

/// A refusal of the auth layer or of Signal's role check. UNAUTHENTICATED
/// says nothing about which credential was wrong; PERMISSION_DENIED names
/// the roles that would do (metadata "roles", comma-separated).
pub fn refused(refusal: &Refusal) -> Status {
    let mut metadata = HashMap::new();
    let (code, reason) = match refusal {
        Refusal::MissingCredentials
        | Refusal::UnknownCredentials
        | Refusal::MalformedCredentials(_)
        | Refusal::ForwardRefused(_) => (Code::Unauthenticated, ErrorReason::Unauthenticated),
        Refusal::Throttled { retry_after_s } => {
            metadata.insert("retry_after_s".to_string(), retry_after_s.to_string());
            (Code::Unauthenticated, ErrorReason::Unauthenticated)
        }
        Refusal::ForwardNotNow(_) => (Code::Unavailable, ErrorReason::OwnerUnavailable),
        Refusal::MissingRole { needed, method, .. } => {
            metadata.insert("roles".to_string(), needed.join(","));
            metadata.insert("method".to_string(), method.clone());
            (Code::PermissionDenied, ErrorReason::PermissionDenied)
        }
        Refusal::NotRunOwner { run, .. } => {
            metadata.insert("run_id".to_string(), run.clone());
            (Code::PermissionDenied, ErrorReason::NotRunOwner)
        }
        Refusal::SeparationOfDuties { run, .. } => {
            metadata.insert("run_id".to_string(), run.clone());
            (Code::PermissionDenied, ErrorReason::SeparationOfDuties)
        }
        Refusal::NotAllowedToServe { kind, name, .. } => {
            metadata.insert(kind.to_string(), name.clone());
            (Code::PermissionDenied, ErrorReason::NotAllowedToServe)
        }
        Refusal::IdentityTaken { identity } => {
            metadata.insert("identity".to_string(), identity.clone());
            (Code::PermissionDenied, ErrorReason::IdentityTaken)
        }
        Refusal::NotTaskHolder { .. } => (Code::PermissionDenied, ErrorReason::NotTaskHolder),
        Refusal::NotAnApproverForCall { call, groups, .. } => {
            metadata.insert("call_id".to_string(), call.clone());
            metadata.insert("groups".to_string(), groups.join(","));
            (Code::PermissionDenied, ErrorReason::NotAnApproverForCall)
        }
    };
    error_status(code, reason, &refusal.to_string(), metadata)
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        refused(&refusal)
    }
}

impl From<crate::domain::check::Invalid> for Status {
    fn from(invalid: crate::domain::check::Invalid) -> Self {
        to_status(invalid.into())
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        to_status(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_client_values_are_clipped_in_message_and_metadata() {
        let id = "r".repeat(60_000);
        let status = to_status(Error::CallNotFound {
            run: id.clone(),
            call: "é".repeat(5_000),
        });
        assert!(status.message().len() < 400, "{}", status.message());
        assert!(status.message().contains("(60000 bytes)"));
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, "CALL_NOT_FOUND");
        assert!(info.metadata["run_id"].len() < 100);
        assert!(info.metadata["call_id"].ends_with("(10000 bytes)"));
        assert_eq!(clip("short"), "short");
        assert_eq!(clip(&clip(&id)), clip(&id));
    }
}
