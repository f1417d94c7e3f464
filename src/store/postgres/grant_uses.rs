//! Standing grants are counted where every server's commits meet: in the
//! round's transaction, which locks the grants it uses (`FOR UPDATE`, in
//! id order, after its shards' head rows), so two rounds using one grant
//! take turns whatever their shards. An engine decides with the
//! grants it has in memory, which may be behind another server's (a grant
//! revoked there, or used up there a moment ago); so each round reads the
//! grants its batches use, and refuses a batch that uses a revoked or
//! deleted grant, or one use more than the grant allows. The engine then
//! reads the grants again and decides anew (a person is asked).

use std::collections::{HashMap, HashSet};

use tokio_postgres::Row;
use uuid::Uuid;

use crate::store::{GrantRecord, Op, StoreError, WriteBatch};

/// The grants a round uses: whether revoked, their limit, their uses.
pub(super) const GRANTS: &str = "SELECT g.id, g.record, \
     (SELECT count(*) FROM aaa_grant_uses u WHERE u.grant_id = g.id) \
     FROM aaa_grants g WHERE g.id = ANY($1) ORDER BY g.id FOR UPDATE OF g";
/// Uses already recorded among those of the round's runs (recording one
/// again is no new use).
pub(super) const RECORDED: &str = "SELECT grant_id, run_id, call_id FROM aaa_grant_uses \
     WHERE grant_id = ANY($1) AND run_id = ANY($2)";

/// The state of the grants a round uses, as its batches are staged.
#[derive(Default)]
pub(super) struct GrantUses {
    grants: HashMap<String, Limit>,
    recorded: HashSet<(String, Uuid, String)>,
}

struct Limit {
    revoked: bool,
    /// 0: unlimited.
    max_uses: u64,
    used: u64,
}

impl GrantUses {
    /// The grant ids and run ids the round's batches use grants for.
    pub fn keys<'a>(batches: impl Iterator<Item = &'a WriteBatch>) -> (Vec<String>, Vec<Uuid>) {
        let mut grants = Vec::new();
        let mut runs = Vec::new();
        for used in batches.flat_map(WriteBatch::grant_uses) {
            grants.push(used.grant);
            runs.push(used.run.as_uuid());
        }
        grants.sort_unstable();
        grants.dedup();
        runs.sort_unstable();
        runs.dedup();
        (grants, runs)
    }

    pub fn read(grants: Vec<Row>, recorded: Vec<Row>) -> Result<GrantUses, tokio_postgres::Error> {
        let mut uses = GrantUses::default();
        for row in grants {
            let id: String = row.try_get(0)?;
            let record: Vec<u8> = row.try_get(1)?;
            let used: i64 = row.try_get(2)?;
            // A record that does not decode counts as revoked: no use of
            // it is taken on trust.
            let limit = match <GrantRecord as prost::Message>::decode(record.as_slice()) {
                Ok(grant) => Limit {
                    revoked: grant.revoked_ms != 0,
                    max_uses: grant.max_uses,
                    used: used.max(0) as u64,
                },
                Err(_) => Limit {
                    revoked: true,
                    max_uses: 0,
                    used: 0,
                },
            };
            uses.grants.insert(id, limit);
        }
        for row in recorded {
            uses.recorded
                .insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
        }
        Ok(uses)
    }

    /// The batch's uses not recorded yet.
    fn new_uses(&self, batch: &WriteBatch) -> Vec<crate::store::GrantUse> {
        batch
            .grant_uses()
            .into_iter()
            .filter(|u| {
                let key = (u.grant.clone(), u.run.as_uuid(), u.call_id.clone());
                !self.recorded.contains(&key)
            })
            .collect()
    }

    /// Refuses the batch if one of its grant uses is of a grant revoked,
    /// unknown or used up. Only a batch that decides something is checked:
    /// a use commits with the event of the call it grants, and uses
    /// without events are copies of uses made before (`aaa migrate`).
    pub fn check(&self, batch: &WriteBatch) -> Result<(), StoreError> {
        if batch.events().is_empty() {
            return Ok(());
        }
        let mut wanted: HashMap<String, u64> = HashMap::new();
        for used in self.new_uses(batch) {
            *wanted.entry(used.grant).or_default() += 1;
        }
        for (grant, more) in wanted {
            let usable = self.grants.get(&grant).is_some_and(|limit| {
                !limit.revoked && (limit.max_uses == 0 || limit.used + more <= limit.max_uses)
            });
            if !usable {
                return Err(StoreError::GrantUnusable(grant));
            }
        }
        Ok(())
    }

    /// Counts the uses of a batch that passed [`GrantUses::check`] and is
    /// staged; a grant it writes (a revocation) counts for the batches after.
    pub fn record(&mut self, batch: &WriteBatch) {
        for used in self.new_uses(batch) {
            if let Some(limit) = self.grants.get_mut(&used.grant) {
                limit.used += 1;
            }
            self.recorded
                .insert((used.grant, used.run.as_uuid(), used.call_id));
        }
        for op in batch.ops() {
            if let Op::PutGrant(grant) = op {
                let limit = self.grants.entry(grant.id.clone()).or_insert(Limit {
                    revoked: false,
                    max_uses: 0,
                    used: 0,
                });
                limit.revoked = grant.revoked_ms != 0;
                limit.max_uses = grant.max_uses;
            }
        }
    }
}
