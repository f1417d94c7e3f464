//! Retention: finished runs are deleted once they finished longer ago than
//! their retention (the server's `--retention`, or the run's own
//! [`crate::domain::RETENTION_LABEL`]), optionally archived first; then the
//! store gives the space back (see `Store::compact`). Running and waiting
//! runs are never deleted: the store lists finished runs only, and deletes
//! a run only if its summary still says it finished.
//!
//! One background task sweeps: at start, every [`sweep_interval`], and at
//! each advance of a manual clock (so tests move time instead of waiting).
//! Each run is deleted under its lock, after its archive file (if any) is
//! durable, and its cached state is dropped, so no call sees half of it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::domain::Retention;
use crate::store::{RunId, WriteBatch};

use super::{Engine, Error};

/// Runs read and deleted per store call: a bounded batch, on either store.
const SWEEP_BATCH: usize = 128;
/// Tombstones dropped per store call.
const TOMBSTONE_BATCH: usize = 1024;
/// Compaction steps per sweep, at most; the next sweep goes on.
const COMPACTION_STEPS: usize = 64;
/// The longest a tombstone lasts (and how long it lasts with retention
/// forever, for runs with a retention of their own).
pub const MAX_TOMBSTONE: Duration = Duration::from_secs(7 * 86_400);
/// The shortest a tombstone lasts.
pub const MIN_TOMBSTONE: Duration = Duration::from_secs(3_600);

/// How often the sweep runs: a tenth of the retention, between one
/// second and a minute.
pub fn sweep_interval(retention: Retention) -> Duration {
    match retention {
        Retention::Forever => Duration::from_secs(60),
        Retention::Ms(ms) => Duration::from_millis((ms / 10).max(0) as u64)
            .clamp(Duration::from_secs(1), Duration::from_secs(60)),
    }
}

/// How long a deleted run's tombstone lasts: as the server was told
/// (`--tombstone`), else as long as the retention, within
/// [`MIN_TOMBSTONE`] and [`MAX_TOMBSTONE`].
pub fn tombstone_for(retention: Retention, told: Option<Duration>) -> Duration {
    if let Some(told) = told {
        return told;
    }
    match retention {
        Retention::Forever => MAX_TOMBSTONE,
        Retention::Ms(ms) => {
            Duration::from_millis(ms.max(0) as u64).clamp(MIN_TOMBSTONE, MAX_TOMBSTONE)
        }
    }
}

/// Parses `--tombstone`: a duration as [`Retention::parse`] takes it, up
/// to [`MAX_TOMBSTONE`].
pub fn parse_tombstone(text: &str) -> Result<Duration, String> {
    match Retention::parse(text) {
        Ok(Retention::Ms(ms)) if ms as u128 <= MAX_TOMBSTONE.as_millis() => {
            Ok(Duration::from_millis(ms as u64))
        }
        _ => Err(format!(
            "'{}' is not a tombstone's life: give a whole number and a unit, up to 7d, e.g. 1h",
            text.trim()
        )),
    }
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Finished runs deleted.
    pub deleted: u64,
    /// Of them, archived first.
    pub archived: u64,
    pub tombstones_dropped: u64,
    /// Log segments compacted away (the embedded store).
    pub segments_compacted: u64,
    /// Live bytes compaction copied forward.
    pub bytes_moved: u64,
    /// Disk given back.
    pub bytes_freed: u64,
    /// Deleted runs with events past a consumer group's cursor, summed over
    /// groups: the events a group skips (see docs/retention.md).
    pub group_skips: u64,
}

impl Engine {
    /// The retention task: sweeps until shutdown.
    pub(super) async fn run_retention(self) {
        let clock = self.clock().clone();
        let interval = sweep_interval(self.inner.settings.retention);
        let mut advances = clock.advances();
        loop {
            advances.mark_seen();
            match self.sweep().await {
                Ok(swept) if swept.deleted + swept.segments_compacted > 0 => tracing::info!(
                    deleted = swept.deleted,
                    archived = swept.archived,
                    tombstones_dropped = swept.tombstones_dropped,
                    segments_compacted = swept.segments_compacted,
                    bytes_freed = swept.bytes_freed,
                    "retention sweep"
                ),
                Ok(_) => {}
                Err(Error::ShuttingDown) => return,
                Err(e) => tracing::error!("retention sweep failed (tried again later): {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = advances.next() => {}
                _ = self.shutdown_token().cancelled() => return,
            }
        }
    }

    /// Deletes (and archives) every run whose retention has passed, drops
    /// tombstones that ran out, and compacts.
    pub async fn sweep(&self) -> Result<Swept, Error> {
        let retention = self.inner.settings.retention;
        let default_ms = match retention {
            Retention::Forever => None,
            Retention::Ms(ms) => Some(ms),
        };
        let mut swept = Swept::default();
        let result = self.sweep_into(retention, default_ms, &mut swept).await;
        count(self.metrics().families(), &swept);
        result.map(|()| swept)
    }

    async fn sweep_into(
        &self,
        retention: Retention,
        default_ms: Option<i64>,
        swept: &mut Swept,
    ) -> Result<(), Error> {
        let now = self.now_ms();
        // Groups whose cursor is behind a deleted run's last event skip
        // its events they had not read: counted, and said per group.
        let mut groups: Option<Vec<(crate::store::Cursor, String)>> = None;
        let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
        let until = now.saturating_add(
            tombstone_for(retention, self.inner.settings.tombstone).as_millis() as i64,
        );
        let mut failed = Vec::new();
        loop {
            if self.shutdown_token().is_cancelled() {
                return Err(Error::ShuttingDown);
            }
            let runs: Vec<RunId> = self
                .inner
                .store
                .expired_runs(
                    now,
                    default_ms,
                    SWEEP_BATCH + failed.len(),
                    &self.inner.shards,
                )
                .await?
                .into_iter()
                .filter(|run| !failed.contains(run))
                .collect();
            if runs.is_empty() {
                break;
            }
            let full = runs.len() >= SWEEP_BATCH;
            let deletions = runs.into_iter().map(|run| async move {
                let result = self.expire(run, now, until).await;
                (run, result)
            });
            let results = futures_util::future::join_all(deletions).await;
            if groups.is_none() {
                let list = self.inner.store.list_groups().await?;
                groups = Some(
                    list.into_iter()
                        .map(|g| (g.log_cursor(), g.name))
                        .collect::<Vec<_>>(),
                );
            }
            for (run, result) in results {
                match result {
                    Ok((archived, last_position)) => {
                        swept.deleted += 1;
                        swept.archived += u64::from(archived);
                        for (cursor, group) in groups.iter().flatten() {
                            if cursor.passes(run, last_position) {
                                *skipped.entry(group.clone()).or_default() += 1;
                                swept.group_skips += 1;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(%run, "could not delete an expired run (kept, tried again at the next sweep): {e}");
                        failed.push(run);
                    }
                }
            }
            if !full {
                break;
            }
        }
        for (group, runs) in &skipped {
            tracing::warn!(
                group = %group,
                runs,
                "consumer group is behind retention: the events of {runs} deleted runs past its cursor are skipped (only those it had read already may still be delivered)"
            );
        }
        loop {
            let dropped = self
                .inner
                .store
                .drop_tombstones(now, TOMBSTONE_BATCH)
                .await?;
            swept.tombstones_dropped += dropped as u64;
            if dropped < TOMBSTONE_BATCH {
                break;
            }
        }
        for _ in 0..COMPACTION_STEPS {
            if self.shutdown_token().is_cancelled() {
                break;
            }
            let step = self.inner.store.compact().await?;
            swept.segments_compacted += step.segments;
            swept.bytes_moved += step.moved_bytes;
            swept.bytes_freed += step.freed_bytes;
            if step.segments == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Deletes one expired run under its lock, archived first when the
    /// server archives: whether it wrote an archive, and the global
    /// position of the run's last event.
    async fn expire(&self, run: RunId, now: i64, until: i64) -> Result<(bool, u64), Error> {
        let _guard = self.lock_run(run).await;
        let last_seq = self.inner.store.run(run).await?.map_or(0, |r| r.last_seq);
        let last_position = match last_seq {
            0 => 0,
            seq => self
                .inner
                .store
                .event(run, seq)
                .await?
                .map_or(0, |e| e.position),
        };
        let archived = match &self.inner.settings.archive_dir {
            Some(dir) => {
                let events = self.inner.store.run_events(run, 0, usize::MAX).await?;
                if !events.is_empty() {
                    let dir = dir.clone();
                    tokio::task::spawn_blocking(move || crate::archive::write(&dir, run, &events))
                        .await
                        .map_err(|e| Error::Internal(format!("archive task failed: {e}")))?
                        .map_err(|e| {
                            Error::StorageUnavailable(format!(
                                "the archive of run {run} cannot be written: {e}"
                            ))
                        })?;
                }
                true
            }
            None => false,
        };
        let mut batch = WriteBatch::default();
        batch.expire_run(run, now, until);
        let committed = self.inner.store.commit(batch).await;
        // Whatever the outcome, the next call reads the run again.
        self.inner.cache.lock().expect("poisoned").pop(&run);
        committed?;
        Ok((archived, last_position))
    }
}

/// Adds a sweep to the retention counters of `/metrics`.
fn count(families: &crate::metrics::Families, swept: &Swept) {
    let counts = [
        ("deleted", swept.deleted),
        ("archived", swept.archived),
        ("tombstones_dropped", swept.tombstones_dropped),
        ("group_skips", swept.group_skips),
    ];
    for (what, n) in counts {
        let label = crate::metrics::RetentionLabel { what };
        families.retention_runs.get_or_create(&label).inc_by(n);
    }
    families
        .retention_segments_compacted
        .inc_by(swept.segments_compacted);
    families.retention_bytes_freed.inc_by(swept.bytes_freed);
    families.retention_bytes_moved.inc_by(swept.bytes_moved);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tombstones_life_is_what_the_server_was_told_else_the_retention_within_bounds() {
        assert_eq!(parse_tombstone("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_tombstone("7d"), Ok(MAX_TOMBSTONE));
        for bad in ["0", "forever", "8d", "1.5h", ""] {
            let error = parse_tombstone(bad).expect_err(bad);
            assert!(error.contains("not a tombstone's life"), "{bad}: {error}");
        }
        let minute = Duration::from_secs(60);
        assert_eq!(tombstone_for(Retention::Ms(20_000), Some(minute)), minute);
        assert_eq!(tombstone_for(Retention::Ms(20_000), None), MIN_TOMBSTONE);
        assert_eq!(tombstone_for(Retention::Forever, None), MAX_TOMBSTONE);
    }
}
