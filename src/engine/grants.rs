//! Standing grants in memory: the engine's copy of every grant (loaded from
//! the store at start, so a standby that takes over loads them too), the
//! match of a requested call against them, and the count of their uses.
//!
//! The store keeps one record per use; here a use is counted twice over
//! until its commit is known: `committed` (the store's count) plus the
//! uses reserved by batches not yet durable. Taking a grant reserves a use
//! under the one mutex, so two runs racing for the last use cannot both
//! get it; a failed commit gives its reservation back and reads the counts
//! from the store again (a use that did land is then counted, so a count
//! can only err on the side of fewer uses left).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::domain::{GrantRecord, GrantUse, RunId};
use std::sync::Arc;

use crate::policy::{Budget, CallFacts, Condition};
use crate::store::{labels_match, SharedStore, StoreError};

use super::guard::{Pending, Rules};
use super::requests::request_scope;
use super::state::{GrantAsk, RunState};
use super::{Engine, Error};
use crate::domain::event::{sha256_hex, GrantStamp};
use crate::store::WriteBatch;
use prost::Message;

/// A grant and what the engine needs to apply it.
struct Live {
    record: GrantRecord,
    /// The compiled condition; None when there is none.
    condition: Option<Condition>,
    /// The stored condition no longer compiles (a newer CEL): the grant
    /// matches no call.
    broken: bool,
    /// Uses the store holds (as of the last load) or that this engine
    /// committed since.
    committed: u64,
    /// Uses of batches staged but not yet durable.
    reserved: BTreeSet<(RunId, String)>,
}

impl Live {
    fn new(record: GrantRecord, committed: u64) -> Live {
        // A stored condition compiled when the grant was created; one that
        // no longer does (a newer CEL) makes the grant match nothing.
        let (condition, broken) = match record.condition.as_str() {
            "" => (None, false),
            text => match Condition::compile(text) {
                Ok(condition) => (Some(condition), false),
                Err(e) => {
                    tracing::warn!(grant = %record.id, "grant condition does not compile: {e}; the grant matches no call");
                    (None, true)
                }
            },
        };
        Live {
            record,
            condition,
            broken,
            committed,
            reserved: BTreeSet::new(),
        }
    }

    fn uses(&self) -> u64 {
        self.committed + self.reserved.len() as u64
    }
}

/// Whether a grant is in force at `now_ms`: not revoked, not expired, not
/// used up (given `uses`).
pub fn in_force(grant: &GrantRecord, uses: u64, now_ms: i64) -> bool {
    grant.revoked_ms == 0
        && (grant.expires_ms == 0 || now_ms < grant.expires_ms)
        && (grant.max_uses == 0 || uses < grant.max_uses)
}

/// The run and call a grant is asked about.
pub struct Asked<'a> {
    pub run: RunId,
    pub call_id: &'a str,
    pub ask: GrantAsk<'a>,
    pub labels: &'a BTreeMap<String, String>,
    pub task: &'a str,
    pub started_by: &'a str,
    /// Computed on first need: only a grant bound to a digest asks for it,
    /// and most calls reviewed meet no such grant.
    pub arguments_sha256: std::cell::OnceCell<String>,
    pub now_ms: i64,
    /// Who may decide (a grant stands in for its creator).
    pub rules: Rules,
}

#[derive(Default)]
pub struct Grants {
    live: Mutex<BTreeMap<String, Live>>,
}

impl Grants {
    /// Reads every grant and its uses from the store, replacing what is
    /// known (reservations of batches in flight are kept).
    pub async fn load(&self, store: &SharedStore) -> Result<(), StoreError> {
        let stored = store.grants().await?;
        let mut live = self.live.lock().expect("poisoned");
        let mut fresh = BTreeMap::new();
        for (record, uses) in stored {
            let grant = match live.remove(&record.id) {
                Some(mut known) if known.record == record => {
                    known.committed = uses;
                    known
                }
                Some(known) => {
                    let mut grant = Live::new(record, uses);
                    grant.reserved = known.reserved;
                    grant
                }
                None => Live::new(record, uses),
            };
            fresh.insert(grant.record.id.clone(), grant);
        }
        *live = fresh;
        Ok(())
    }

    /// A grant the store now holds (created or revoked).
    pub fn put(&self, record: GrantRecord) {
        let mut live = self.live.lock().expect("poisoned");
        match live.get_mut(&record.id) {
            Some(known) => known.record = record,
            None => {
                live.insert(record.id.clone(), Live::new(record, 0));
            }
        }
    }

    /// The grant with this id and its uses.
    pub fn get(&self, id: &str) -> Option<(GrantRecord, u64)> {
        let live = self.live.lock().expect("poisoned");
        live.get(id).map(|g| (g.record.clone(), g.uses()))
    }

    /// The first grant in force (oldest first) that decides this call, with
    /// a use reserved for it; None when none does. Conditions are evaluated
    /// within `budget` and without the lock (a CEL thread does it), so a
    /// costly condition holds up no other call; a grant chosen is checked
    /// again under the lock before its use is reserved.
    pub fn take(&self, asked: &Asked, budget: &Arc<Budget>) -> Option<(GrantStamp, GrantUse)> {
        let candidates: Vec<(String, Option<Condition>)> = {
            let live = self.live.lock().expect("poisoned");
            live.values()
                .filter(|g| matches_but_condition(g, asked))
                .map(|g| (g.record.id.clone(), g.condition.clone()))
                .collect()
        };
        for (id, condition) in candidates {
            if let Some(condition) = condition {
                let holds = condition.evaluate(&asked.facts(), budget).unwrap_or_else(|e| {
                    tracing::info!(grant = %id, "grant condition could not be evaluated for a call: {e}; it does not match");
                    false
                });
                if !holds {
                    continue;
                }
            }
            let mut live = self.live.lock().expect("poisoned");
            let Some(grant) = live
                .get_mut(&id)
                .filter(|g| matches_but_condition(g, asked))
            else {
                continue;
            };
            grant
                .reserved
                .insert((asked.run, asked.call_id.to_string()));
            let record = &grant.record;
            return Some((
                GrantStamp {
                    id: record.id.clone(),
                    reason: record.reason.clone(),
                    created_by: record.created_by.clone(),
                },
                GrantUse {
                    grant: record.id.clone(),
                    run: asked.run,
                    call_id: asked.call_id.to_string(),
                },
            ));
        }
        None
    }

    /// The batch holding these uses is durable: they count for good.
    pub fn confirm(&self, uses: &[GrantUse]) {
        let mut live = self.live.lock().expect("poisoned");
        for used in uses {
            if let Some(grant) = live.get_mut(&used.grant) {
                if grant.reserved.remove(&(used.run, used.call_id.clone())) {
                    grant.committed += 1;
                }
            }
        }
    }

    /// The batch holding these uses was not committed: give them back.
    pub fn release(&self, uses: &[GrantUse]) {
        let mut live = self.live.lock().expect("poisoned");
        for used in uses {
            if let Some(grant) = live.get_mut(&used.grant) {
                grant.reserved.remove(&(used.run, used.call_id.clone()));
            }
        }
    }
}

impl Asked<'_> {
    /// What a grant's condition sees of the asked call.
    fn facts(&self) -> CallFacts<'_> {
        CallFacts {
            tool: self.ask.tool,
            arguments: self.ask.arguments,
            labels: self.labels,
            task: self.task,
            started_by: self.started_by,
            now_ms: self.now_ms,
        }
    }
}

/// Whether `grant` decides the asked call now, its condition aside.
fn matches_but_condition(grant: &Live, asked: &Asked) -> bool {
    let g = &grant.record;
    let ask = &asked.ask;
    g.tool == ask.tool
        && !grant.broken
        && in_force(g, grant.uses(), asked.now_ms)
        && (g.run_id.is_empty() || g.run_id == asked.run.to_string())
        && labels_match(&g.labels, asked.labels)
        && (g.started_by.is_empty() || g.started_by == asked.started_by)
        && (g.arguments_sha256.is_empty()
            || g.arguments_sha256 == *asked.arguments_sha256.get_or_init(|| sha256_hex(ask.arguments)))
        // Limited like the creator's own decision would be.
        && asked.rules.grant_may_decide(
            g,
            &Pending {
                run: asked.run,
                call_id: asked.call_id,
                started_by: asked.started_by,
                approvers: &ask.approvers,
                approvals_required: ask.approvals_required,
            },
        )
}

/// CreateGrant, validated by the api as far as it can without the store.
#[derive(Debug, Clone, Default)]
pub struct NewGrant {
    pub tool: String,
    pub run_id: String,
    pub labels: BTreeMap<String, String>,
    pub started_by: String,
    pub condition: String,
    pub arguments_sha256: String,
    /// 0: does not expire.
    pub expires_ms: i64,
    pub max_uses: u64,
    pub reason: String,
}

/// Who creates or revokes a grant: the principal (with auth off, the
/// caller's address) and, with auth on, its approver groups.
#[derive(Debug, Clone, Default)]
pub struct Grantor {
    pub principal: String,
    pub groups: Option<Vec<String>>,
}

/// Longest reason, in bytes.
const MAX_REASON: usize = 1024;

fn check_reason(reason: &str) -> Result<(), Error> {
    if reason.trim().is_empty() {
        return Err(Error::invalid(
            "reason",
            "say why, for the audit trail: a reason is required",
        ));
    }
    if reason.len() > MAX_REASON {
        return Err(Error::invalid(
            "reason",
            format!("at most {MAX_REASON} bytes"),
        ));
    }
    Ok(())
}

impl Engine {
    /// CreateGrant: checks the grant, stores it, and from then on applies
    /// it; returns it with its uses. With a request_id it is done once (see
    /// [`super::requests`]): a retry creates nothing and answers the grant
    /// the first try created, as it is now.
    pub async fn create_grant(
        &self,
        new: NewGrant,
        by: Grantor,
        request_id: &str,
    ) -> Result<(GrantRecord, u64), Error> {
        if request_id.is_empty() {
            return Ok((self.store_grant(new, by, None).await?, 0));
        }
        // With auth off the grantor is the caller's address, which a retry
        // on another connection does not share: ids are kept per principal
        // only when there are principals.
        let principal = match by.groups {
            Some(_) => by.principal.as_str(),
            None => "",
        };
        let scope = request_scope(b"grant", principal);
        let answer = (scope.clone(), request_id.to_string());
        let engine = self.clone();
        let work = async move { engine.store_grant(new, by, Some(answer)).await };
        let decode = |bytes: &[u8]| {
            GrantRecord::decode(bytes).map_err(|e| Error::Internal(format!("recorded grant: {e}")))
        };
        let (record, recorded) = self
            .once(scope, request_id.to_string(), decode, |_| false, work)
            .await?;
        if !recorded {
            return Ok((record, 0));
        }
        // The first try's commit may have landed unseen by this server.
        if self.inner.grants.get(&record.id).is_none() {
            self.reload_grants().await;
        }
        Ok(self.inner.grants.get(&record.id).unwrap_or((record, 0)))
    }

    /// Checks a new grant and commits it, with the answer to its request
    /// (a scope and request id) when it has one.
    async fn store_grant(
        &self,
        new: NewGrant,
        by: Grantor,
        answer: Option<(Vec<u8>, String)>,
    ) -> Result<GrantRecord, Error> {
        let now = self.now_ms();
        if new.tool.is_empty() {
            return Err(Error::invalid("tool", "a grant names the tool it grants"));
        }
        if self.inner.store.tool(&new.tool).await?.is_none() {
            return Err(Error::invalid(
                "tool",
                format!("no worker has registered a tool named '{}'", new.tool),
            ));
        }
        if !new.run_id.is_empty() {
            let run = RunId::parse(&new.run_id).ok_or_else(|| {
                Error::invalid("scope.run_id", format!("'{}' is not a run id", new.run_id))
            })?;
            if self.inner.store.run(run).await?.is_none() {
                return Err(Error::invalid(
                    "scope.run_id",
                    format!("no run has the id {run}"),
                ));
            }
        }
        if new.labels.keys().any(String::is_empty) {
            return Err(Error::invalid("scope.labels", "a label needs a key"));
        }
        if !new.condition.is_empty() {
            Condition::compile(&new.condition).map_err(|e| Error::invalid("condition", e))?;
        }
        let sha256 = new.arguments_sha256.to_ascii_lowercase();
        if !sha256.is_empty()
            && (sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(Error::invalid(
                "arguments_sha256",
                "64 hex digits: the SHA-256 of the call's canonical JSON arguments",
            ));
        }
        if new.expires_ms != 0 && new.expires_ms <= now {
            return Err(Error::invalid(
                "expires_at",
                "is in the past: a grant must expire later than now",
            ));
        }
        check_reason(&new.reason)?;
        let record = GrantRecord {
            id: uuid::Uuid::now_v7().to_string(),
            tool: new.tool,
            run_id: new.run_id,
            labels: new.labels,
            started_by: new.started_by,
            condition: new.condition,
            arguments_sha256: sha256,
            expires_ms: new.expires_ms,
            max_uses: new.max_uses,
            reason: new.reason,
            created_by: by.principal,
            created_ms: now,
            groups_enforced: by.groups.is_some(),
            creator_groups: by.groups.unwrap_or_default(),
            revoked_ms: 0,
            revoked_by: String::new(),
            revoke_reason: String::new(),
        };
        let mut batch = WriteBatch::default();
        batch.put_grant(&record);
        if let Some((scope, request_id)) = &answer {
            batch.put_request(scope, request_id, record.encode_to_vec());
        }
        self.inner.store.commit(batch).await?;
        self.inner.grants.put(record.clone());
        tracing::info!(
            grant = %record.id,
            tool = %record.tool,
            created_by = %record.created_by,
            max_uses = record.max_uses,
            expires_ms = record.expires_ms,
            reason = %record.reason,
            "standing grant created"
        );
        Ok(record)
    }

    /// RevokeGrant: the grant stops granting before this returns (in
    /// memory first, so no call can take it while the revocation commits).
    /// Revoking a revoked grant changes nothing.
    pub async fn revoke_grant(
        &self,
        id: &str,
        reason: &str,
        by: Grantor,
    ) -> Result<(GrantRecord, u64), Error> {
        check_reason(reason)?;
        let (mut record, uses) = self
            .inner
            .grants
            .get(id)
            .ok_or_else(|| Error::GrantNotFound(id.to_string()))?;
        if record.revoked_ms != 0 {
            return Ok((record, uses));
        }
        record.revoked_ms = self.now_ms();
        record.revoked_by = by.principal;
        record.revoke_reason = reason.to_string();
        self.inner.grants.put(record.clone());
        let mut batch = WriteBatch::default();
        batch.put_grant(&record);
        if let Err(e) = self.inner.store.commit(batch).await {
            // Not revoked after all: memory follows the store again.
            self.reload_grants().await;
            return Err(e.into());
        }
        // Again: a reload while this committed may have read the grant
        // as it was.
        self.inner.grants.put(record.clone());
        tracing::info!(
            grant = %record.id,
            revoked_by = %record.revoked_by,
            uses,
            reason = %record.revoke_reason,
            "standing grant revoked"
        );
        Ok((record, uses))
    }

    /// Reads the grants from the store again, after a commit that held a
    /// grant's use or revocation failed (it may have landed).
    pub(super) async fn reload_grants(&self) {
        if let Err(e) = self.inner.grants.load(&self.inner.store).await {
            tracing::warn!("reading the standing grants again failed: {e}");
        }
    }

    /// The standing grant that decides a requested call, if one does,
    /// with a use reserved for it (see [`Grants::take`]).
    pub(super) fn take_grant(
        &self,
        state: &RunState,
        call_id: &str,
        verdict: &crate::policy::Verdict,
        now_ms: i64,
        budget: &Arc<Budget>,
    ) -> Option<(GrantStamp, GrantUse)> {
        let ask = state.grant_ask(call_id, verdict)?;
        self.inner.grants.take(
            &Asked {
                run: state.id,
                call_id,
                ask,
                labels: &state.spec.labels,
                task: &state.spec.task,
                started_by: &state.started_by,
                arguments_sha256: std::cell::OnceCell::new(),
                now_ms,
                rules: self.rules(),
            },
            budget,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grant(max_uses: u64) -> GrantRecord {
        GrantRecord {
            id: "g".into(),
            tool: "wire_money".into(),
            max_uses,
            reason: "r".into(),
            ..Default::default()
        }
    }

    /// Takes the grant for `call` of `run`, if it decides the call.
    fn take(grants: &Grants, run: RunId, call: &str) -> Option<GrantUse> {
        let arguments = json!({"amount": 1});
        let labels = BTreeMap::new();
        let asked = Asked {
            run,
            call_id: call,
            ask: GrantAsk {
                tool: "wire_money",
                arguments: &arguments,
                approvals_required: 1,
                approvers: Vec::new(),
            },
            labels: &labels,
            task: "",
            started_by: "",
            arguments_sha256: std::cell::OnceCell::new(),
            now_ms: 0,
            rules: Rules::default(),
        };
        grants.take(&asked, &Budget::new()).map(|(_, used)| used)
    }

    #[test]
    fn a_reserved_use_counts_until_its_commit_is_known() {
        let grants = Grants::default();
        grants.put(grant(2));
        let run = RunId::new();
        let first = take(&grants, run, "call-1").expect("the first use");
        let second = take(&grants, run, "call-2").expect("the second use");
        assert_eq!(take(&grants, run, "call-3"), None, "two reserved: used up");
        // The first commit failed: its use is free again; the second landed.
        grants.release(&[first]);
        grants.confirm(&[second]);
        assert_eq!(grants.get("g").map(|(_, uses)| uses), Some(1));
        let third = take(&grants, run, "call-3").expect("the freed use");
        grants.confirm(&[third]);
        assert_eq!(take(&grants, run, "call-4"), None);
        assert_eq!(grants.get("g").map(|(_, uses)| uses), Some(2));
    }

    #[test]
    fn a_revoked_expired_or_used_up_grant_is_not_in_force() {
        let mut g = grant(1);
        assert!(in_force(&g, 0, 1_000));
        assert!(!in_force(&g, 1, 1_000), "used up");
        g.max_uses = 0;
        assert!(in_force(&g, 1_000_000, 1_000), "unlimited");
        g.expires_ms = 1_000;
        assert!(!in_force(&g, 0, 1_000), "expired at its expiry");
        g.expires_ms = 0;
        g.revoked_ms = 5;
        assert!(!in_force(&g, 0, 1_000), "revoked");
    }
}
