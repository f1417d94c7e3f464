//! Idempotency records are written once (see
//! [`StoreError::RequestRecorded`]). Two tries of one request can reach
//! the database from two servers (the runs changed owner between them), so
//! the check is made where every server's commits meet: each round takes
//! an advisory lock on each key it records (so two rounds recording one
//! key take turns) and then reads which of the answers its batches record exist
//! already, and refuses a batch that would record one again (or one an
//! earlier batch of the round records). The insert's `ON CONFLICT DO
//! NOTHING` keeps a recorded answer should a write ever get past this.

use std::collections::HashSet;

use tokio_postgres::Row;

use crate::store::{StoreError, WriteBatch};

/// Which of the round's (scope, request_id) keys are recorded already;
/// the primary key finds each.
pub(super) const ANSWERED: &str = "SELECT r.scope, r.request_id \
     FROM UNNEST($1::bytea[], $2::text[]) AS k(scope, request_id) \
     JOIN aaa_requests r ON r.scope = k.scope AND r.request_id = k.request_id";

/// The answers recorded, as the round's batches are staged.
#[derive(Default)]
pub(super) struct Answered {
    keys: HashSet<(Vec<u8>, String)>,
}

/// The advisory lock keys of a round's requests (see the committer's
/// `LOCK_REQUESTS`): a stable hash of each (scope, request_id). Two keys
/// that collide only make their rounds take turns.
pub(super) fn lock_keys(scopes: &[Vec<u8>], ids: &[String]) -> Vec<i64> {
    let mut keys: Vec<i64> = scopes
        .iter()
        .zip(ids)
        .map(|(scope, id)| {
            // FNV-1a, 64 bits: the same on every server and version.
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in scope.iter().chain([&0xff]).chain(id.as_bytes()) {
                hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
            }
            hash as i64
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

impl Answered {
    /// The keys the round's batches record, as ANSWERED's parameters.
    pub fn keys<'a>(batches: impl Iterator<Item = &'a WriteBatch>) -> (Vec<Vec<u8>>, Vec<String>) {
        batches
            .flat_map(WriteBatch::request_keys)
            .map(|(scope, request_id)| (scope.to_vec(), request_id.to_string()))
            .unzip()
    }

    pub fn read(rows: Vec<Row>) -> Result<Answered, tokio_postgres::Error> {
        let mut keys = HashSet::new();
        for row in rows {
            keys.insert((row.try_get(0)?, row.try_get(1)?));
        }
        Ok(Answered { keys })
    }

    /// Refuses a batch that records an answer recorded already.
    pub fn check(&self, batch: &WriteBatch) -> Result<(), StoreError> {
        for (scope, request_id) in batch.request_keys() {
            if self
                .keys
                .contains(&(scope.to_vec(), request_id.to_string()))
            {
                return Err(StoreError::RequestRecorded {
                    request_id: request_id.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Counts a staged batch's answers as recorded.
    pub fn record(&mut self, batch: &WriteBatch) {
        for (scope, request_id) in batch.request_keys() {
            self.keys.insert((scope.to_vec(), request_id.to_string()));
        }
    }
}
