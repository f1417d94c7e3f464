//! Idempotency records are written once (see
//! [`StoreError::RequestRecorded`]). Two tries of one request can reach
//! the database from two servers (the runs changed owner between them), so
//! the check is made where every server's commits meet: each round reads,
//! after the head lock, which of the answers its batches record exist
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
