//! Which runs this store may write: the shards it claimed and the epoch of
//! each claim (`aaa_shards`). A claim bumps the epochs, under the head
//! row's lock, so it falls between two commit rounds of any server; every
//! round then reads the epochs of the shards its batches touch (after
//! taking the head lock) and refuses a batch whose shard has moved on
//! ([`StoreError::Fenced`]). A server paused or cut off while another took
//! its runs over can never write to them again.
//!
//! Until the store claims runs, nothing is fenced (tools such as `aaa
//! migrate`, tests of the store alone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use deadpool_postgres::Object;

use super::{database_error, describe};
use crate::store::{Result, StoreError, WriteBatch};

#[derive(Default)]
pub(super) struct Ownership {
    /// Shard -> the epoch this store holds; `None` until it claims.
    held: Mutex<Option<HashMap<i16, i64>>>,
    /// Set when a round found a shard claimed by another server.
    lost: AtomicBool,
}

const CLAIM_ALL: &str = "UPDATE aaa_shards SET owner = $1, epoch = epoch + 1, \
    claimed_ms = (extract(epoch from clock_timestamp()) * 1000)::bigint \
    RETURNING shard, epoch";

/// The epochs of the shards a round touches, read after the head lock.
pub(super) const EPOCHS: &str = "SELECT shard, epoch FROM aaa_shards WHERE shard = ANY($1)";

impl Ownership {
    /// Claims every shard for `server`, fencing out whoever held them.
    pub async fn claim_all(&self, client: &mut Object, server: &str) -> Result<()> {
        let transaction = client.transaction().await.map_err(database_error)?;
        // The head lock orders the claim between commit rounds: a round
        // either committed before it, or reads the new epochs.
        transaction
            .query("SELECT position FROM aaa_head WHERE id = 1 FOR UPDATE", &[])
            .await
            .map_err(database_error)?;
        let rows = transaction
            .query(CLAIM_ALL, &[&server])
            .await
            .map_err(database_error)?;
        transaction.commit().await.map_err(database_error)?;
        let mut held = HashMap::with_capacity(rows.len());
        for row in rows {
            let shard: i16 = row.try_get(0).map_err(|e| corrupt(&e))?;
            let epoch: i64 = row.try_get(1).map_err(|e| corrupt(&e))?;
            held.insert(shard, epoch);
        }
        *self.held.lock().expect("poisoned") = Some(held);
        self.lost.store(false, Ordering::Release);
        Ok(())
    }

    /// The shards a round's batches touch, when this store is fenced.
    pub fn shards_of<'a>(&self, batches: impl Iterator<Item = &'a WriteBatch>) -> Option<Vec<i16>> {
        self.held.lock().expect("poisoned").as_ref()?;
        let mut shards: Vec<i16> = batches
            .flat_map(|b| b.runs())
            .map(|run| i16::from(run.shard()))
            .collect();
        shards.sort_unstable();
        shards.dedup();
        Some(shards)
    }

    /// Refuses the batch if a run it touches is in a shard whose epoch
    /// (`current`, read in the round) is not the one this store holds.
    pub fn check(&self, batch: &WriteBatch, current: &HashMap<i16, i64>) -> Result<()> {
        let held = self.held.lock().expect("poisoned");
        let Some(held) = held.as_ref() else {
            return Ok(());
        };
        for run in batch.runs() {
            let shard = i16::from(run.shard());
            let (held, current) = (
                held.get(&shard).copied().unwrap_or(-1),
                current.get(&shard).copied().unwrap_or(-1),
            );
            if held != current {
                if !self.lost.swap(true, Ordering::AcqRel) {
                    tracing::error!(
                        "another aaa server claimed the runs of this database (shard {shard}: \
                         epoch {current}, this server held {held}); this server writes no run \
                         any more: stop it, or restart it to take the runs back"
                    );
                }
                return Err(StoreError::Fenced {
                    shard: shard as u8,
                    held,
                    current,
                });
            }
        }
        Ok(())
    }

    /// Whether a round found this store fenced out.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

fn corrupt(e: &tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(format!("postgres: aaa_shards: {}", describe(e)))
}
