//! GrantService: standing grants, created and revoked by approvers (the
//! engine applies them; see `engine::grants`), listed with their uses
//! from the store, so any server of a cluster answers ListGrants.

use tonic::{Request, Response, Status};

use super::{convert, peer_name, principal};
use crate::clock::Clock;
use crate::domain::check;
use crate::domain::GrantRecord;
use crate::engine::grants::{in_force, Grantor, NewGrant};
use crate::engine::{Engine, Error, Reads};
use crate::proto::{self, grant_service_server::GrantService};

pub struct GrantApi {
    reads: Reads,
    /// The owner's engine; None on a server that only reads (its writes
    /// are forwarded to the owner).
    engine: Option<Engine>,
    clock: Clock,
}

impl GrantApi {
    pub fn serving(engine: Engine) -> GrantApi {
        GrantApi {
            reads: engine.reads().clone(),
            clock: engine.clock().clone(),
            engine: Some(engine),
        }
    }

    pub fn reading(reads: Reads, clock: Clock) -> GrantApi {
        GrantApi {
            reads,
            engine: None,
            clock,
        }
    }

    fn engine(&self) -> Result<&Engine, Status> {
        self.engine.as_ref().ok_or_else(super::unavailable)
    }
}

/// Who creates or revokes: the principal, or with auth off the caller's
/// address (as events name such a caller), for the audit trail.
fn grantor<T>(request: &Request<T>) -> Grantor {
    Grantor {
        principal: peer_name(request),
        groups: principal(request).map(|p| p.groups.clone()),
    }
}

/// Unix milliseconds of a wire timestamp; 0 when unset.
fn millis(field: &str, at: Option<&prost_types::Timestamp>) -> Result<i64, Error> {
    let Some(at) = at else { return Ok(0) };
    if at.seconds <= 0 || !(0..1_000_000_000).contains(&at.nanos) {
        return Err(Error::invalid(field, "not a valid time after 1970"));
    }
    at.seconds
        .checked_mul(1000)
        .and_then(|ms| ms.checked_add(i64::from(at.nanos / 1_000_000)))
        .ok_or_else(|| Error::invalid(field, "too far in the future"))
}

pub fn grant(record: GrantRecord, uses: u64, now_ms: i64) -> proto::Grant {
    let active = in_force(&record, uses, now_ms);
    proto::Grant {
        active,
        uses,
        uses_left: (record.max_uses > 0).then(|| record.max_uses.saturating_sub(uses)),
        scope: Some(proto::GrantScope {
            run_id: record.run_id,
            labels: record.labels.into_iter().collect(),
            started_by: record.started_by,
        }),
        expires_at: convert::timestamp(record.expires_ms),
        created_at: convert::timestamp(record.created_ms),
        revoked_at: convert::timestamp(record.revoked_ms),
        id: record.id,
        tool: record.tool,
        condition: record.condition,
        arguments_sha256: record.arguments_sha256,
        max_uses: record.max_uses,
        reason: record.reason,
        created_by: record.created_by,
        creator_groups: record.creator_groups,
        revoked_by: record.revoked_by,
        revoke_reason: record.revoke_reason,
    }
}

#[tonic::async_trait]
impl GrantService for GrantApi {
    async fn create_grant(
        &self,
        request: Request<proto::CreateGrantRequest>,
    ) -> Result<Response<proto::CreateGrantResponse>, Status> {
        let engine = self.engine()?;
        let by = grantor(&request);
        let r = request.into_inner();
        check::check_size("condition", &r.condition, 4 * 1024)?;
        check::check_size("tool", &r.tool, 256)?;
        check::check_size("request_id", &r.request_id, check::MAX_NAME_BYTES)?;
        let scope = r.scope.unwrap_or_default();
        let new = NewGrant {
            tool: r.tool,
            run_id: scope.run_id,
            labels: scope.labels.into_iter().collect(),
            started_by: scope.started_by,
            condition: r.condition,
            arguments_sha256: r.arguments_sha256,
            expires_ms: millis("expires_at", r.expires_at.as_ref())?,
            max_uses: r.max_uses,
            reason: r.reason,
        };
        let (record, uses) = engine.create_grant(new, by, &r.request_id).await?;
        let now = engine.clock().now_ms();
        Ok(Response::new(proto::CreateGrantResponse {
            grant: Some(grant(record, uses, now)),
        }))
    }

    async fn revoke_grant(
        &self,
        request: Request<proto::RevokeGrantRequest>,
    ) -> Result<Response<proto::RevokeGrantResponse>, Status> {
        let engine = self.engine()?;
        let by = grantor(&request);
        let r = request.into_inner();
        if r.id.is_empty() {
            return Err(Error::invalid("id", "required: the grant to revoke").into());
        }
        let (record, uses) = engine.revoke_grant(&r.id, &r.reason, by).await?;
        let now = engine.clock().now_ms();
        Ok(Response::new(proto::RevokeGrantResponse {
            grant: Some(grant(record, uses, now)),
        }))
    }

    async fn list_grants(
        &self,
        request: Request<proto::ListGrantsRequest>,
    ) -> Result<Response<proto::ListGrantsResponse>, Status> {
        let r = request.into_inner();
        let now = self.clock.now_ms();
        let grants = self
            .reads
            .store()
            .grants()
            .await
            .map_err(Error::from)?
            .into_iter()
            .filter(|(g, _)| r.tool.is_empty() || g.tool == r.tool)
            .map(|(g, uses)| grant(g, uses, now))
            .filter(|g| r.include_revoked || g.active)
            .collect();
        Ok(Response::new(proto::ListGrantsResponse { grants }))
    }
}
