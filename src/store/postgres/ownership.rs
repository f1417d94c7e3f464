//! Which runs this store may write: the shards it claimed and the epoch of
//! each claim (`aaa_shards`). A claim bumps the epochs, under the head
//! row's lock, so it falls between two commit rounds of any server; every
//! round then reads the epochs of the shards its batches touch (after
//! taking the head lock) and refuses a batch whose shard has moved on
//! ([`StoreError::Fenced`]). A server paused or cut off while another took
//! its runs over can never write to them again.
//!
//! The owner renews a lease on its shards; a standby claims them once every
//! lease has lapsed (its owner died or lost the database), and an owner
//! that closes its store gives them up at once. Times are the database's
//! clock, so servers' clocks need not agree.
//!
//! A server paused in the middle of a commit round (SIGSTOP, a VM frozen, a
//! swap storm) would hold the head row's lock, and with it every other
//! server's commits and claims, for as long as it stays paused. So once a
//! store claims runs, each round's transaction carries a limit on idle time
//! (`idle_in_transaction_session_timeout`) of one lease: the database ends
//! the session of a server stalled that long mid-round, which frees the
//! lock; the round fails unacknowledged, and the fence refuses whatever the
//! server tries once it wakes.
//!
//! Until the store claims runs, nothing is fenced (tools such as `aaa
//! migrate`, tests of the store alone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

use deadpool_postgres::Object;
use tokio::sync::Notify;

use super::{database_error, describe};
use crate::store::{Result, StoreError, WriteBatch};

pub(super) struct Ownership {
    /// Shard -> the epoch this store holds; `None` until it claims.
    held: Mutex<Option<HashMap<i16, i64>>>,
    /// Set when this store found its shards claimed by another server.
    lost: AtomicBool,
    /// Woken when `lost` is set, so the store stops saying it is writable.
    pub lost_notify: Notify,
    /// True from a claim until the store finds itself fenced out.
    pub holding: tokio::sync::watch::Sender<bool>,
    /// The claim's lease in ms; 0 before a claim.
    lease_ms: AtomicI64,
}

impl Default for Ownership {
    fn default() -> Self {
        Ownership {
            held: Mutex::default(),
            lost: AtomicBool::default(),
            lost_notify: Notify::new(),
            holding: tokio::sync::watch::Sender::new(false),
            lease_ms: AtomicI64::new(0),
        }
    }
}

/// The database's time in milliseconds.
pub(super) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Limits a round's idle time in its transaction (ms, as text).
pub(super) const STALL_LIMIT: &str =
    "SELECT set_config('idle_in_transaction_session_timeout', $1, true)";

/// The epochs of the shards a round touches, read after the head lock.
pub(super) const EPOCHS: &str = "SELECT shard, epoch FROM aaa_shards WHERE shard = ANY($1)";

impl Ownership {
    /// Claims every shard for `server` with a lease of `lease_ms`, fencing
    /// out whoever held them; with `standby`, only if no lease is live.
    /// Answers whether it claimed.
    pub async fn claim_all(
        &self,
        client: &mut Object,
        server: &str,
        lease_ms: i64,
        standby: bool,
    ) -> Result<bool> {
        let only_if_lapsed = match standby {
            true => format!(
                " WHERE NOT EXISTS (SELECT 1 FROM aaa_shards WHERE lease_until_ms > {NOW_MS})"
            ),
            false => String::new(),
        };
        let claim = format!(
            "UPDATE aaa_shards SET owner = $1, epoch = epoch + 1, claimed_ms = {NOW_MS}, \
             lease_until_ms = {NOW_MS} + $2{only_if_lapsed} RETURNING shard, epoch"
        );
        let transaction = client.transaction().await.map_err(database_error)?;
        // The head lock orders the claim between commit rounds: a round
        // either committed before it, or reads the new epochs.
        transaction
            .query("SELECT position FROM aaa_head WHERE id = 1 FOR UPDATE", &[])
            .await
            .map_err(database_error)?;
        let rows = transaction
            .query(&claim, &[&server, &lease_ms])
            .await
            .map_err(database_error)?;
        transaction.commit().await.map_err(database_error)?;
        if rows.is_empty() {
            return Ok(false);
        }
        let mut held = HashMap::with_capacity(rows.len());
        for row in rows {
            let shard: i16 = row.try_get(0).map_err(|e| corrupt(&e))?;
            let epoch: i64 = row.try_get(1).map_err(|e| corrupt(&e))?;
            held.insert(shard, epoch);
        }
        *self.held.lock().expect("poisoned") = Some(held);
        self.lease_ms.store(lease_ms, Ordering::Release);
        self.lost.store(false, Ordering::Release);
        self.holding.send_replace(true);
        Ok(true)
    }

    /// Extends the lease of every shard this store still holds. A shard
    /// claimed by another server meanwhile makes the store lost.
    pub async fn renew(&self, client: &Object, lease_ms: i64) -> Result<()> {
        let Some((shards, epochs)) = self.held_lists() else {
            return Ok(());
        };
        let renew = format!(
            "UPDATE aaa_shards s SET lease_until_ms = {NOW_MS} + $3 \
             FROM UNNEST($1::int2[], $2::int8[]) AS h(shard, epoch) \
             WHERE s.shard = h.shard AND s.epoch = h.epoch"
        );
        let renewed = client
            .execute(&renew, &[&shards, &epochs, &lease_ms])
            .await
            .map_err(database_error)?;
        if renewed < shards.len() as u64 {
            self.mark_lost(&format!(
                "{} of its {} shards",
                shards.len() as u64 - renewed,
                shards.len()
            ));
        }
        Ok(())
    }

    /// Gives the held shards up at once (a server stopping), so that a
    /// standby need not wait for the lease to lapse.
    pub async fn release(&self, client: &Object) -> Result<()> {
        let Some((shards, epochs)) = self.held_lists() else {
            return Ok(());
        };
        client
            .execute(
                "UPDATE aaa_shards s SET lease_until_ms = 0 \
                 FROM UNNEST($1::int2[], $2::int8[]) AS h(shard, epoch) \
                 WHERE s.shard = h.shard AND s.epoch = h.epoch",
                &[&shards, &epochs],
            )
            .await
            .map_err(database_error)?;
        Ok(())
    }

    /// How long a round's transaction may sit idle (ms, as text): one
    /// lease, once the store claimed runs; no limit before.
    pub fn stall_limit(&self) -> Option<String> {
        let lease_ms = self.lease_ms.load(Ordering::Acquire);
        (lease_ms > 0).then(|| lease_ms.to_string())
    }

    fn held_lists(&self) -> Option<(Vec<i16>, Vec<i64>)> {
        let held = self.held.lock().expect("poisoned");
        Some(held.as_ref()?.iter().map(|(s, e)| (*s, *e)).unzip())
    }

    /// The shards a round's batches touch, when this store is fenced.
    pub fn shards_of<'a>(&self, batches: impl Iterator<Item = &'a WriteBatch>) -> Option<Vec<i16>> {
        self.held.lock().expect("poisoned").as_ref()?;
        let mut shards: Vec<i16> = batches.flat_map(|b| b.shards()).map(i16::from).collect();
        shards.sort_unstable();
        shards.dedup();
        Some(shards)
    }

    /// Refuses the batch if a run or group it touches is in a shard whose
    /// epoch (`current`, read in the round) is not the one this store holds.
    pub fn check(&self, batch: &WriteBatch, current: &HashMap<i16, i64>) -> Result<()> {
        let refusal = {
            let held = self.held.lock().expect("poisoned");
            let Some(held) = held.as_ref() else {
                return Ok(());
            };
            batch.shards().into_iter().find_map(|shard| {
                let key = i16::from(shard);
                let held = held.get(&key).copied().unwrap_or(-1);
                let current = current.get(&key).copied().unwrap_or(-1);
                (held != current).then_some(StoreError::Fenced {
                    shard,
                    held,
                    current,
                })
            })
        };
        match refusal {
            None => Ok(()),
            Some(fenced) => {
                self.mark_lost(&fenced.to_string());
                Err(fenced)
            }
        }
    }

    fn mark_lost(&self, what: &str) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "another aaa server claimed the runs of this database ({what}); this server \
                 writes no run any more: stop it, or restart it to take the runs back"
            );
            self.lost_notify.notify_one();
            self.holding.send_replace(false);
        }
    }

    /// Whether this store found itself fenced out.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

/// Renews the claim every `every` until `stop`. A renewal the database
/// does not take (it is unreachable) is only logged: if the lease lapses
/// meanwhile, a standby may take the runs, and the fence keeps this store
/// from writing them after that.
pub(super) async fn renew_every(
    pool: deadpool_postgres::Pool,
    ownership: std::sync::Arc<Ownership>,
    lease_ms: i64,
    every: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        if ownership.is_lost() {
            return;
        }
        let renewed = match pool.get().await {
            Ok(client) => ownership.renew(&client, lease_ms).await,
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
        };
        if let Err(e) = renewed {
            tracing::warn!("could not renew the claim on the runs: {e}");
        }
    }
}

fn corrupt(e: &tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(format!("postgres: aaa_shards: {}", describe(e)))
}
