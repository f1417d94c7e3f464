//! Which runs this store may write: the shards it claimed and the epoch of
//! each claim (`aaa_shards`). A claim bumps the epochs while it holds the
//! locks of those shards (see the committer's `LOCK_SHARDS`), so it falls
//! between two commit rounds of any server that touch them; every round
//! reads the epochs of the shards its batches touch (once it holds their
//! locks) and refuses a batch whose shard has moved on
//! ([`StoreError::Fenced`]). A server paused or cut off while another took
//! its runs over can never write to them again.
//!
//! The owner renews a lease on its shards; a standby claims them once every
//! lease has lapsed (its owner died or lost the database), and an owner
//! that closes its store gives them up at once. Times are the database's
//! clock, so servers' clocks need not agree.
//!
//! A server paused in the middle of a commit round (SIGSTOP, a VM frozen, a
//! swap storm) would hold its shards' locks, and with them every other
//! server's commits and claims of those shards, for as long as it stays
//! paused. So once a
//! store claims runs, each round's transaction carries a limit on idle time
//! (`idle_in_transaction_session_timeout`) of one lease: the database ends
//! the session of a server stalled that long mid-round, which frees the
//! lock; the round fails unacknowledged, and the fence refuses whatever the
//! server tries once it wakes.
//!
//! A server that claimed every shard and finds them all claimed by another
//! (it was paused, cut off, or the database was down longer than the
//! lease) stands by again: it claims the runs back once no lease is live
//! ([`stand_by_when_fenced`]), so the servers of a cluster always come back
//! to one owner and standbys, with no restart by hand.
//!
//! Until the store claims runs, nothing is fenced (tools such as `aaa
//! migrate`, tests of the store alone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use deadpool_postgres::Object;
use tokio::sync::Notify;

use super::errors::{database_error, describe};
use crate::store::{Result, Shards, StoreError, WriteBatch};

pub(super) struct Ownership {
    /// Shard -> the epoch this store holds; `None` until it claims.
    held: Mutex<Option<HashMap<i16, i64>>>,
    /// Set when this store found every shard it held claimed by another
    /// server (fenced out); cleared by a claim.
    lost: AtomicBool,
    /// Woken when `lost` is set, so the store stops saying it is writable.
    pub lost_notify: Notify,
    /// Woken when `lost` is set, so the server stands by again.
    fenced: Notify,
    /// The shards held: every change of `held` is sent here.
    pub holding: tokio::sync::watch::Sender<Shards>,
    /// The claim's lease in ms; 0 before a claim.
    lease_ms: AtomicI64,
    /// Set by a claim of every shard (one server owns the runs): losing one
    /// shard then means another server claimed them all, and all are lost.
    all_or_nothing: AtomicBool,
    /// When the last claim of every shard or renewal that kept them all was
    /// sent: the leases held run at least a lease from then.
    renewed: Mutex<Option<Instant>>,
}

impl Default for Ownership {
    fn default() -> Self {
        Ownership {
            held: Mutex::default(),
            lost: AtomicBool::default(),
            lost_notify: Notify::new(),
            fenced: Notify::new(),
            holding: tokio::sync::watch::Sender::new(Shards::none()),
            lease_ms: AtomicI64::new(0),
            all_or_nothing: AtomicBool::new(false),
            renewed: Mutex::new(None),
        }
    }
}

/// The database's time in milliseconds.
pub(super) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Limits a round's idle time in its transaction (ms, as text).
pub(super) const STALL_LIMIT: &str =
    "SELECT set_config('idle_in_transaction_session_timeout', $1, true)";

/// The epochs of the shards a round touches, read once it holds their
/// locks.
pub(super) const EPOCHS: &str = "SELECT shard, epoch FROM aaa_shards WHERE shard = ANY($1)";

/// Which shards a claim takes.
pub(super) enum Wanted {
    /// Every shard, fencing out whoever holds one.
    All,
    /// Every shard, but only if no lease is live (a standby's first claim).
    AllIfLapsed,
    /// These shards, those whose lease has lapsed.
    Lapsed(Vec<i16>),
}

impl Ownership {
    /// Claims shards for `server` with a lease of `lease_ms` (see
    /// [`Wanted`]), bumping their epochs. Answers the shards it claimed.
    pub async fn claim(
        &self,
        client: &mut Object,
        server: &str,
        lease_ms: i64,
        wanted: Wanted,
    ) -> Result<Shards> {
        let sent = Instant::now();
        let set = format!(
            "UPDATE aaa_shards SET owner = $1, epoch = epoch + 1, claimed_ms = {NOW_MS}, \
             lease_until_ms = {NOW_MS} + $2"
        );
        let transaction = client.transaction().await.map_err(database_error)?;
        // The locks of the shards it may take, taken as a round takes them,
        // order the claim between commit rounds: a round touching them
        // either committed before it, or reads the new epochs.
        let may_take: Vec<i16> = match &wanted {
            Wanted::Lapsed(shards) => shards.clone(),
            Wanted::All | Wanted::AllIfLapsed => (0..crate::domain::SHARDS as i16).collect(),
        };
        transaction
            .query(super::committer::LOCK_SHARDS, &[&may_take])
            .await
            .map_err(database_error)?;
        self.all_or_nothing
            .store(!matches!(wanted, Wanted::Lapsed(_)), Ordering::Release);
        let rows = match wanted {
            Wanted::All => {
                let claim = format!("{set} RETURNING shard, epoch");
                transaction.query(&claim, &[&server, &lease_ms]).await
            }
            Wanted::AllIfLapsed => {
                let claim = format!(
                    "{set} WHERE NOT EXISTS (SELECT 1 FROM aaa_shards \
                     WHERE lease_until_ms > {NOW_MS}) RETURNING shard, epoch"
                );
                transaction.query(&claim, &[&server, &lease_ms]).await
            }
            Wanted::Lapsed(shards) => {
                let claim = format!(
                    "{set} WHERE shard = ANY($3) AND lease_until_ms <= {NOW_MS} \
                     RETURNING shard, epoch"
                );
                transaction
                    .query(&claim, &[&server, &lease_ms, &shards])
                    .await
            }
        }
        .map_err(database_error)?;
        transaction.commit().await.map_err(database_error)?;
        let mut claimed = Shards::none();
        let mut held = self.held.lock().expect("poisoned");
        let held = held.get_or_insert_with(HashMap::new);
        for row in rows {
            let shard: i16 = row.try_get(0).map_err(|e| corrupt(&e))?;
            let epoch: i64 = row.try_get(1).map_err(|e| corrupt(&e))?;
            held.insert(shard, epoch);
            claimed.insert(shard_of(shard)?);
        }
        self.lease_ms.store(lease_ms, Ordering::Release);
        if !held.is_empty() {
            self.lost.store(false, Ordering::Release);
        }
        let holding = set_of(held);
        // The oldest lease held counts: shards held before this claim keep
        // the time of their last renewal.
        if self.holding.borrow().is_empty() {
            *self.renewed.lock().expect("poisoned") = Some(sent);
        }
        self.holding.send_replace(holding);
        Ok(claimed)
    }

    /// Extends the lease of every shard this store still holds. Shards
    /// claimed by another server meanwhile are dropped from the held ones.
    pub async fn renew(&self, client: &Object, lease_ms: i64) -> Result<()> {
        let Some((shards, epochs)) = self.held_lists() else {
            return Ok(());
        };
        let sent = Instant::now();
        let renew = format!(
            "UPDATE aaa_shards s SET lease_until_ms = {NOW_MS} + $3 \
             FROM UNNEST($1::int2[], $2::int8[]) AS h(shard, epoch) \
             WHERE s.shard = h.shard AND s.epoch = h.epoch RETURNING s.shard"
        );
        let rows = client
            .query(&renew, &[&shards, &epochs, &lease_ms])
            .await
            .map_err(database_error)?;
        let mut renewed = Vec::with_capacity(rows.len());
        for row in rows {
            renewed.push(row.try_get::<_, i16>(0).map_err(|e| corrupt(&e))?);
        }
        let gone: Vec<(i16, i64)> = shards
            .into_iter()
            .zip(epochs)
            .filter(|(shard, _)| !renewed.contains(shard))
            .collect();
        let kept_every_one = gone.is_empty();
        for (shard, epoch) in gone {
            self.lose(shard, epoch, "its lease was renewed by another server");
        }
        if kept_every_one {
            *self.renewed.lock().expect("poisoned") = Some(sent);
        }
        Ok(())
    }

    /// Whether this store holds shards and no other server can have
    /// claimed one of them since: the last claim or renewal of each was
    /// sent less than a lease ago. (A server started with `--take-over`
    /// claims them all regardless and fences this one at its next commit
    /// or renewal.)
    pub fn holds_for_sure(&self) -> bool {
        let lease_ms = self.lease_ms.load(Ordering::Acquire);
        let renewed = *self.renewed.lock().expect("poisoned");
        lease_ms > 0
            && !self.is_lost()
            && renewed.is_some_and(|sent| {
                sent.elapsed() < std::time::Duration::from_millis(lease_ms as u64)
            })
            && !self.holding.borrow().is_empty()
    }

    /// Gives up held shards at once (`None`: all of them; a server
    /// stopping), so that another server need not wait for their leases to
    /// lapse. They are no longer held from the moment this is called.
    pub async fn release(&self, client: &Object, shards: Option<Shards>) -> Result<()> {
        let (shards, epochs): (Vec<i16>, Vec<i64>) = {
            let mut held = self.held.lock().expect("poisoned");
            let Some(held) = held.as_mut() else {
                return Ok(());
            };
            let released: Vec<(i16, i64)> = held
                .iter()
                .filter(|(shard, _)| {
                    shards.is_none_or(|wanted| wanted.contains(shard_of(**shard).unwrap_or(0)))
                })
                .map(|(s, e)| (*s, *e))
                .collect();
            for (shard, _) in &released {
                held.remove(shard);
            }
            self.holding.send_replace(set_of(held));
            released.into_iter().unzip()
        };
        if shards.is_empty() {
            return Ok(());
        }
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
    /// epoch (`current`, read in the round) is not the one this store
    /// holds; a shard held at an older epoch is dropped from the held ones.
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
                if let StoreError::Fenced { shard, held, .. } = fenced {
                    self.lose(
                        i16::from(shard),
                        held,
                        "a commit found it claimed by another",
                    );
                }
                Err(fenced)
            }
        }
    }

    /// Drops `shard` from the held ones if it is still held at `epoch`;
    /// when no shard is left, this store was fenced out.
    fn lose(&self, shard: i16, epoch: i64, why: &str) {
        let fenced_out = {
            let mut held = self.held.lock().expect("poisoned");
            let Some(held) = held.as_mut() else {
                return;
            };
            if held.get(&shard) != Some(&epoch) {
                return;
            }
            match self.all_or_nothing.load(Ordering::Acquire) {
                true => held.clear(),
                false => {
                    held.remove(&shard);
                    tracing::warn!("this server lost shard {shard} ({why})");
                }
            }
            self.holding.send_replace(set_of(held));
            held.is_empty()
        };
        if fenced_out && !self.lost.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "other aaa servers claimed every shard this server held; it writes no run now"
            );
            self.lost_notify.notify_one();
            self.fenced.notify_one();
        }
    }

    /// Whether this store found itself fenced out of every shard it held.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

fn set_of(held: &HashMap<i16, i64>) -> Shards {
    held.keys()
        .filter_map(|shard| shard_of(*shard).ok())
        .collect()
}

fn shard_of(shard: i16) -> Result<u8> {
    u8::try_from(shard).map_err(|_| {
        StoreError::Corrupt(format!("postgres: aaa_shards: shard {shard} out of range"))
    })
}

/// Until `stop`: each time the store finds itself fenced out of every shard
/// it claimed (one server owning them all), stands by again, looking every
/// `every`, and claims every shard once no lease is live. Meanwhile the
/// server forwards every call (it holds no shard) and its health says
/// SERVING again, as any standby's does.
pub(super) async fn stand_by_when_fenced(
    pool: deadpool_postgres::Pool,
    ownership: std::sync::Arc<Ownership>,
    server: String,
    lease_ms: i64,
    every: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            () = ownership.fenced.notified() => {}
            () = stop.cancelled() => return,
        }
        tracing::warn!(
            "standing by again: taking the runs back once no server has renewed its claim \
             for {lease_ms} ms"
        );
        // A standby, not a store in trouble: health says SERVING again
        // at the committer's next probe.
        ownership.lost.store(false, Ordering::Release);
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => return,
            }
            let claimed = match pool.get().await {
                Ok(mut client) => {
                    ownership
                        .claim(&mut client, &server, lease_ms, Wanted::AllIfLapsed)
                        .await
                }
                Err(e) => Err(StoreError::Unavailable(e.to_string())),
            };
            match claimed {
                Ok(claimed) if !claimed.is_empty() => {
                    tracing::info!("took the runs over again");
                    break;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("standing by: {e}"),
            }
        }
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
