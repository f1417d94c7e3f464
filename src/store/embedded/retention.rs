//! Retention in the embedded store: which finished runs have expired,
//! deleting one whole in a single log record, and tombstones.
//!
//! Index entries (see [`keys`]): a finished run that follows the server's
//! retention is `X ‖ finish time ‖ run`; one with its own retention
//! ([`crate::domain::RETENTION_LABEL`]) is `Y ‖ expiry ‖ run`; one kept for
//! good has neither. Both are written with the summary that says the run
//! finished, so they commit with its last event. An idempotency record
//! that belongs to a run has `J ‖ run ‖ its key` beside it.
//!
//! Deleting a run ([`Committer::stage_expire`]) is one log record like any
//! round: first the tombstone (`Z ‖ run` → expired, until; `z ‖ until ‖
//! run`), then deletes of its summary, span lists, approvals, active mark,
//! index entries and idempotency records, a `forget` of its recent spans,
//! and the event bytes it leaves dead in each log segment (`S ‖ segment` →
//! bytes, absolute), which tells compaction where to look. Readers see the
//! record's entries land one by one: with the tombstone first, a run is
//! always either there or reported expired. Applying the record
//! again after a crash ends in the same state. The events themselves stay
//! in the log until compaction copies the live ones out of their segment
//! and deletes it (see [`super::compact`]).

use std::collections::HashMap;

use super::committer::Committer;
use super::record::Round;
use super::spans::Span;
use super::{decode, keys, spans, EmbeddedStore, Result, RunId, RunRecord};
use crate::domain::own_expiry;

/// The index entries that say when a finished run expires, for its summary.
pub(super) fn expiry_keys(run: RunId, record: &RunRecord) -> Option<Vec<u8>> {
    match own_expiry(record)? {
        None => Some(keys::timed(keys::FINISHED, record.updated_ms, run)),
        Some(at) => Some(keys::timed(keys::EXPIRES, at, run)),
    }
}

/// A tombstone's value: expired_ms ‖ until_ms.
fn tombstone(expired_ms: i64, until_ms: i64) -> [u8; 16] {
    let mut value = [0; 16];
    value[..8].copy_from_slice(&expired_ms.to_le_bytes());
    value[8..].copy_from_slice(&until_ms.to_le_bytes());
    value
}

fn parse_tombstone(value: &[u8]) -> Option<(i64, i64)> {
    Some((
        i64::from_le_bytes(value.get(..8)?.try_into().ok()?),
        i64::from_le_bytes(value.get(8..16)?.try_into().ok()?),
    ))
}

/// Dead event bytes per segment, as kept under `S` keys.
pub(super) fn load_dead(tree: &sled::Db) -> Result<HashMap<u64, u64>> {
    let mut dead = HashMap::new();
    for entry in tree.scan_prefix([keys::SEGMENT]) {
        let (key, value) = entry?;
        let start = key
            .get(1..9)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes);
        let bytes = value.as_ref().try_into().ok().map(u64::from_le_bytes);
        match (start, bytes) {
            (Some(start), Some(bytes)) => {
                dead.insert(start, bytes);
            }
            _ => return Err(super::corrupt(&key, "bad dead-bytes entry")),
        }
    }
    Ok(dead)
}

/// Indexes the finished runs of a data directory written before retention
/// existed (once: a meta key marks it done). Runs at open, before the
/// committer starts.
pub(super) fn backfill(tree: &sled::Db) -> Result<()> {
    let done = keys::meta("retention-index");
    if tree.contains_key(&done)? {
        return Ok(());
    }
    let mut indexed = 0;
    for entry in tree.scan_prefix([keys::RUN]) {
        let (key, value) = entry?;
        let record: RunRecord = decode(&key, &value)?;
        let Some(run) = RunId::from_slice(&key[1..]) else {
            continue;
        };
        if let Some(key) = expiry_keys(run, &record) {
            tree.insert(key, &[])?;
            indexed += 1;
        }
    }
    tree.insert(done, &[])?;
    if indexed > 0 {
        tracing::info!("indexed {indexed} finished runs for retention");
    }
    Ok(())
}

impl Committer {
    /// Adds the deletion of `run` to the round, if it is a finished run:
    /// see the module docs. `dead` holds the round's dead-bytes totals so
    /// far (starting from the committer's).
    pub(super) fn stage_expire(
        &mut self,
        run: RunId,
        expired_ms: i64,
        until_ms: i64,
        out: &mut Round,
    ) -> Result<()> {
        let summary_key = keys::run_scoped(keys::RUN, run);
        let Some(value) = self.tree.get(&summary_key)? else {
            return Ok(());
        };
        let record: RunRecord = decode(&summary_key, &value)?;
        if !crate::domain::is_finished_status(record.status) {
            return Ok(());
        }
        // The tombstone before anything is deleted, then the summary: a
        // record's entries reach sled one by one, so a reader between two
        // of them finds the run or its tombstone, never neither (a run
        // read as unknown, RUN_NOT_FOUND, while it expired). From the
        // summary's delete on the run is gone for readers.
        out.put(
            &keys::run_scoped(keys::TOMBSTONE, run),
            &tombstone(expired_ms, until_ms),
        );
        out.put(&keys::timed(keys::TOMBSTONE_UNTIL, until_ms, run), &[]);
        out.delete(&summary_key);
        if let Some(key) = expiry_keys(run, &record) {
            out.delete(&key);
        }
        out.delete(&keys::run_scoped(keys::ACTIVE, run));
        for prefix in [keys::APPROVAL, keys::RUN_REQUEST] {
            for key in self.tree.scan_prefix(keys::run_scoped(prefix, run)).keys() {
                let key = key?;
                if prefix == keys::RUN_REQUEST {
                    out.delete(&key[17..]);
                }
                out.delete(&key);
            }
        }
        let mut spans: Vec<Span> = self.recent.of(run);
        for entry in self.tree.scan_prefix(keys::run_scoped(keys::EVENT, run)) {
            let (key, value) = entry?;
            spans.extend(spans::decode(&key, &value)?);
            out.delete(&key);
        }
        out.forget(run);
        // Overlapping lists (a crash mid-checkpoint) name a span twice.
        spans.sort_by_key(|s| s.offset);
        spans.dedup_by_key(|s| s.offset);
        let mut by_segment: HashMap<u64, u64> = HashMap::new();
        for span in &spans {
            if let Some(start) = self.log.segment_of(span.offset) {
                *by_segment.entry(start).or_default() += u64::from(span.len);
            }
        }
        for (start, bytes) in by_segment {
            let total = self.reclaim.dead.entry(start).or_default();
            *total += bytes;
            out.put(&keys::segment(start), &total.to_le_bytes());
        }
        Ok(())
    }
}

impl EmbeddedStore {
    /// See [`crate::store::Store::expired_runs`].
    pub(super) fn expired_runs(
        &self,
        now_ms: i64,
        default_ms: Option<i64>,
        limit: usize,
    ) -> Result<Vec<RunId>> {
        let tree = &self.inner.tree;
        let mut out = Vec::new();
        let mut due = |family: u8, until: i64| -> Result<()> {
            if until < 0 {
                return Ok(());
            }
            let end = time_prefix(family, until.saturating_add(1));
            for key in tree.range(vec![family]..end).keys() {
                if out.len() >= limit {
                    break;
                }
                let key = key?;
                let (_, run) =
                    keys::parse_timed(&key).ok_or_else(|| super::corrupt(&key, "bad key"))?;
                match self.get::<RunRecord>(&keys::run_scoped(keys::RUN, run))? {
                    Some(record) if expiry_keys(run, &record).as_deref() == Some(&key[..]) => {
                        out.push(run)
                    }
                    // An entry its run no longer has (the run is gone, or
                    // its summary was written again): dropped here, as
                    // tombstones are (a replay may bring it back; the next
                    // sweep drops it again).
                    _ => {
                        tree.remove(&key)?;
                    }
                }
            }
            Ok(())
        };
        if let Some(default_ms) = default_ms {
            due(keys::FINISHED, now_ms.saturating_sub(default_ms))?;
        }
        due(keys::EXPIRES, now_ms)?;
        Ok(out)
    }

    /// See [`crate::store::Store::expired_at`].
    pub(super) fn expired_at(&self, run: RunId) -> Result<Option<i64>> {
        let key = keys::run_scoped(keys::TOMBSTONE, run);
        match self.inner.tree.get(&key)? {
            Some(value) => parse_tombstone(&value)
                .map(|(expired, _)| Some(expired))
                .ok_or_else(|| super::corrupt(&key, "bad tombstone")),
            None => Ok(None),
        }
    }

    /// Tombstones due at `now_ms` or before, as (until key, run).
    pub(super) fn due_tombstones(&self, now_ms: i64, limit: usize) -> Result<Vec<(i64, RunId)>> {
        let end = time_prefix(keys::TOMBSTONE_UNTIL, now_ms.saturating_add(1));
        self.inner
            .tree
            .range(vec![keys::TOMBSTONE_UNTIL]..end)
            .keys()
            .take(limit)
            .map(|key| {
                let key = key?;
                keys::parse_timed(&key).ok_or_else(|| super::corrupt(&key, "bad key"))
            })
            .collect()
    }
}

/// `<family> ‖ time_ms`: below every [`keys::timed`] key of a later time.
fn time_prefix(family: u8, time_ms: i64) -> Vec<u8> {
    let mut k = vec![family];
    k.extend_from_slice(&(time_ms.max(0) as u64).to_be_bytes());
    k
}

impl EmbeddedStore {
    /// See [`crate::store::Store::drop_tombstones`]. Removed from sled
    /// directly, not through the log: a crash before the next checkpoint
    /// may bring one back (the replay puts it again), and the next sweep
    /// drops it again.
    pub(super) fn drop_tombstones(&self, now_ms: i64, limit: usize) -> Result<usize> {
        let due = self.due_tombstones(now_ms, limit)?;
        for &(until_ms, run) in &due {
            self.inner
                .tree
                .remove(keys::run_scoped(keys::TOMBSTONE, run))?;
            self.inner
                .tree
                .remove(keys::timed(keys::TOMBSTONE_UNTIL, until_ms, run))?;
        }
        Ok(due.len())
    }
}
