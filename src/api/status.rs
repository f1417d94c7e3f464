//! The one mapping from engine errors to gRPC statuses, each with a
//! google.rpc.ErrorInfo (domain "aaa.v1") whose reason SDKs branch on.
//! Internal errors are logged here and reach clients without their details;
//! auth refusals (`refused`) are logged by the auth layer.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::auth::Refusal;
use crate::engine::Error;

pub const DOMAIN: &str = "aaa.v1";

pub fn to_status(error: Error) -> Status {
    let mut metadata = HashMap::new();
    let (code, reason) = match &error {
        Error::RunNotFound(run) => {
            metadata.insert("run_id".to_string(), run.clone());
            (Code::NotFound, "RUN_NOT_FOUND")
        }
        Error::CallNotFound { run, call } => {
            metadata.insert("run_id".to_string(), run.clone());
            metadata.insert("call_id".to_string(), call.clone());
            (Code::NotFound, "CALL_NOT_FOUND")
        }
        Error::InvalidField { field, .. } => {
            metadata.insert("field".to_string(), field.clone());
            (Code::InvalidArgument, "INVALID_FIELD")
        }
        Error::PayloadTooLarge { field, limit, .. } => {
            metadata.insert("field".to_string(), field.clone());
            metadata.insert("limit".to_string(), limit.to_string());
            (Code::InvalidArgument, "PAYLOAD_TOO_LARGE")
        }
        Error::ReservedEventType(_) => {
            metadata.insert("field".to_string(), "type".to_string());
            (Code::InvalidArgument, "RESERVED_EVENT_TYPE")
        }
        Error::RunFinished(run) => {
            metadata.insert("run_id".to_string(), run.clone());
            (Code::FailedPrecondition, "RUN_FINISHED")
        }
        Error::StaleAttempt { call, attempt } => {
            metadata.insert("call_id".to_string(), call.clone());
            metadata.insert("attempt".to_string(), attempt.to_string());
            (Code::FailedPrecondition, "STALE_ATTEMPT")
        }
        Error::ArgumentsMismatch { call, .. } => {
            metadata.insert("call_id".to_string(), call.clone());
            (Code::FailedPrecondition, "ARGUMENTS_MISMATCH")
        }
        Error::ToolNotRegistered { field, .. } => {
            metadata.insert("field".to_string(), field.clone());
            (Code::InvalidArgument, "TOOL_NOT_REGISTERED")
        }
        Error::InvalidToken => {
            metadata.insert("field".to_string(), "token".to_string());
            (Code::InvalidArgument, "INVALID_TOKEN")
        }
        Error::ShuttingDown => (Code::Unavailable, "SHUTTING_DOWN"),
        Error::Internal(detail) => {
            tracing::error!("internal error: {detail}");
            let details = ErrorDetails::with_error_info("INTERNAL_ERROR", DOMAIN, metadata);
            return Status::with_error_details(
                Code::Internal,
                "internal error; the server log has the details",
                details,
            );
        }
    };
    let details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    Status::with_error_details(code, error.to_string(), details)
}

/// A refusal of the auth layer or of Signal's role check. UNAUTHENTICATED
/// says nothing about which credential was wrong; PERMISSION_DENIED names
/// the roles that would do (metadata "roles", comma-separated).
pub fn refused(refusal: &Refusal) -> Status {
    let mut metadata = HashMap::new();
    let (code, reason) = match refusal {
        Refusal::MissingCredentials | Refusal::UnknownCredentials => {
            (Code::Unauthenticated, "UNAUTHENTICATED")
        }
        Refusal::MissingRole { needed, method, .. } => {
            metadata.insert("roles".to_string(), needed.join(","));
            metadata.insert("method".to_string(), method.clone());
            (Code::PermissionDenied, "PERMISSION_DENIED")
        }
        Refusal::NotRunOwner { run, .. } => {
            metadata.insert("run_id".to_string(), run.clone());
            (Code::PermissionDenied, "NOT_RUN_OWNER")
        }
        Refusal::SeparationOfDuties { run, .. } => {
            metadata.insert("run_id".to_string(), run.clone());
            (Code::PermissionDenied, "SEPARATION_OF_DUTIES")
        }
    };
    let details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    Status::with_error_details(code, refusal.to_string(), details)
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        refused(&refusal)
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        to_status(error)
    }
}
