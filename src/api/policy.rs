//! PolicyService: the approval policy this server runs with, and its
//! reload. Each server answers for itself (its own `--policy` file).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::engine::Error;
use crate::policy::{Policy, PolicyHandle};
use crate::proto::policy_service_server::PolicyService;
use crate::proto::{
    GetPolicyRequest, GetPolicyResponse, ReloadPolicyRequest, ReloadPolicyResponse,
};

pub struct PolicyApi {
    pub policy: Option<Arc<PolicyHandle>>,
}

fn describe(handle: &PolicyHandle, policy: &Policy) -> GetPolicyResponse {
    GetPolicyResponse {
        loaded: true,
        sha256: policy.sha256.clone(),
        rules: policy
            .rule_names()
            .into_iter()
            .map(str::to_string)
            .collect(),
        file: handle.file.display().to_string(),
    }
}

#[tonic::async_trait]
impl PolicyService for PolicyApi {
    async fn get_policy(
        &self,
        _request: Request<GetPolicyRequest>,
    ) -> Result<Response<GetPolicyResponse>, Status> {
        let answer = match &self.policy {
            Some(handle) => describe(handle, &handle.current()),
            None => GetPolicyResponse::default(),
        };
        Ok(Response::new(answer))
    }

    async fn reload_policy(
        &self,
        _request: Request<ReloadPolicyRequest>,
    ) -> Result<Response<ReloadPolicyResponse>, Status> {
        let Some(handle) = &self.policy else {
            return Err(Error::invalid(
                "policy",
                "this server runs without a policy: start it with --policy FILE",
            )
            .into());
        };
        let policy = handle.reload().map_err(|e| {
            tracing::warn!("policy reload refused, the policy in force stays: {e}");
            Error::invalid("policy", e)
        })?;
        tracing::info!(sha256 = %policy.sha256, "policy reloaded from {}", handle.file.display());
        Ok(Response::new(ReloadPolicyResponse {
            policy: Some(describe(handle, &policy)),
        }))
    }
}
