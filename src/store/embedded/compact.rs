//! Compaction: gives back the disk of deleted runs, a log segment at a
//! time, on the committer thread between rounds (so appends wait at most
//! one step, as for a checkpoint; they are never refused).
//!
//! Deleting a run leaves its event bytes dead in their segments; the
//! committer counts them per segment (`S` keys, see [`super::retention`]).
//! A sealed segment (wholly below the last checkpoint, so sled holds every
//! index write of its records) whose dead bytes reach a quarter of its size
//! is read; a span in it is live while the span index still points at it.
//! If its live bytes are at most half of it, it is compacted:
//!
//! 1. Each record with live spans is copied forward as a new record: the
//!    live spans' bytes unchanged (`moved` entries naming their old
//!    offsets) and `relink` entries for the global positions whose log
//!    index pointed at the old record, so consumer groups and WatchApprovals
//!    read the same live events at the same positions, in order. A record
//!    with no live span loses its log index entry (a group whose cursor is
//!    behind skips the deleted events). A last record marks the segment
//!    retired (`Q ‖ start`). All are fdatasynced once, then applied: span
//!    lists are rewritten in place (one sled value each, so a reader sees
//!    the old offset or the new one, both readable).
//! 2. A checkpoint makes sled hold all of it durably.
//! 3. The segment file is deleted. A reader holding a span into it reads
//!    again (see `EmbeddedStore::retrying`).
//!
//! A crash (kill -9) at any point loses nothing: before the records are
//! durable nothing changed; after, the replay at open applies them again
//! (they are absolute: a moved span is re-pointed only where a list still
//! points at its old offset, a relink is a put), and `Q` keys make open
//! delete a retired segment whose deletion was cut short. A crash between
//! steps leaves the old segment readable until then. Tests reach each step
//! with `AAA_TEST_CRASH_AT=compact:<step>`, which aborts the process there
//! (steps: `written`, `applied`, `checkpointed`).

use super::committer::Committer;
use super::record::{self, Round};
use super::{keys, spans, Result};
use crate::store::Compacted;

/// A segment is read when its dead bytes reach this share of its size...
const READ_AT: u64 = 4; // 1/4
/// ...and compacted when its live bytes are at most this share.
const COMPACT_AT: u64 = 2; // 1/2

/// Aborts the process at a named step when the tests ask for it (see the
/// module docs): a kill -9 at exactly that point.
fn crash_point(step: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var("AAA_TEST_CRASH_AT").ok());
    if at.as_deref().and_then(|at| at.strip_prefix("compact:")) == Some(step) {
        eprintln!(
            "aaa: AAA_TEST_CRASH_AT={}: aborting",
            at.as_deref().unwrap_or_default()
        );
        std::process::abort();
    }
}

impl Committer {
    /// One compaction step, if the store takes writes. A failure after
    /// its records reached the log leaves sled behind the log, as a failed
    /// round does: writes are refused until a restart replays it.
    pub(super) fn compact(&mut self) -> Result<Compacted> {
        if self.index_failed.is_some() || !*self.writable.borrow() {
            return Ok(Compacted::default());
        }
        let end = self.log.end();
        let step = self.compact_step();
        if let Err(e) = &step {
            if self.log.end() != end {
                tracing::error!("compaction failed after writing to the log: {e}; writes are refused until a restart");
                self.writable.send_replace(false);
                self.index_failed = Some(e.to_string());
            } else {
                tracing::warn!("compaction failed (nothing changed): {e}");
            }
        }
        step
    }

    /// One compaction step: compacts (or drops) one segment if one is worth
    /// it; `segments == 0` when none was.
    pub(super) fn compact_step(&mut self) -> Result<Compacted> {
        let Some((start, size)) = self.pick_victim()? else {
            return Ok(Compacted::default());
        };
        let records = self.log.scan(start)?;
        let mut live_bytes = 0u64;
        let mut live: Vec<Vec<bool>> = Vec::with_capacity(records.len());
        for record in &records {
            let mut flags = Vec::with_capacity(record.spans.len());
            for span in &record.spans {
                let indexed = spans::is_indexed(&self.tree, span.run, span.last_seq, span.offset)?;
                if indexed {
                    live_bytes += span.block.len() as u64;
                }
                flags.push(indexed);
            }
            live.push(flags);
        }
        let dead = self.reclaim.dead.get(&start).copied().unwrap_or(0);
        if live_bytes * COMPACT_AT > size {
            self.reclaim.rejected.insert(start, dead);
            return Ok(Compacted::default());
        }

        // 1. Copy the live spans forward, retire the segment.
        let mut rounds = Vec::new();
        let mut last = Round::new(self.next_position);
        for (record, flags) in records.iter().zip(&live) {
            let mut links = Vec::new();
            for &position in &record.links {
                if self.links_to(position, record.at)? {
                    links.push(position);
                }
            }
            if flags.iter().any(|&l| l) {
                let mut round = Round::new(self.next_position);
                for (span, _) in record.spans.iter().zip(flags).filter(|(_, &l)| l) {
                    round.moved(span.offset, span.run, span.last_seq, &span.block);
                }
                for position in links {
                    round.relink(position);
                }
                rounds.push(round);
            } else {
                for position in links {
                    last.delete(&keys::log(position));
                }
            }
        }
        last.delete(&keys::segment(start));
        last.put(&keys::retired(start), &[]);
        rounds.push(last);
        let offsets = self.log.append_all(&rounds)?;
        crash_point("written");
        for (round, at) in rounds.iter().zip(offsets) {
            record::apply(round, at, &self.tree, &self.applied())?;
        }
        self.reclaim.dead.remove(&start);
        self.reclaim.rejected.remove(&start);
        crash_point("applied");

        // 2. Durable in sled: nothing points into the segment any more.
        self.checkpoint()?;
        crash_point("checkpointed");

        // 3. Delete it.
        self.log.delete_segment(start)?;
        self.tree.remove(keys::retired(start))?;
        let moved_bytes = live_bytes;
        tracing::info!(
            segment = start,
            size,
            moved_bytes,
            "compacted a log segment: its live events copied forward, the file deleted"
        );
        Ok(Compacted {
            segments: 1,
            moved_bytes,
            freed_bytes: size,
        })
    }

    /// Whether the log index entry of `position` points at the record at
    /// `at` (a relink may have taken it elsewhere already).
    fn links_to(&self, position: u64, at: u64) -> Result<bool> {
        Ok(self
            .tree
            .get(keys::log(position))?
            .is_some_and(|v| v.as_ref() == at.to_le_bytes()))
    }

    /// The sealed segment with the most dead bytes, at least [`READ_AT`]
    /// of it, not rejected since; checkpoints first when the best one is
    /// not sealed yet.
    fn pick_victim(&mut self) -> Result<Option<(u64, u64)>> {
        let worth = |this: &Committer, start: u64, size: u64| {
            let dead = this.reclaim.dead.get(&start).copied().unwrap_or(0);
            let rejected = this.reclaim.rejected.get(&start).copied();
            // Read again once another eighth of it died.
            dead * READ_AT >= size && rejected.is_none_or(|at| dead >= at + size / 8)
        };
        let best = |this: &Committer, sealed_to: u64| {
            this.log
                .sealed(sealed_to)
                .into_iter()
                .filter(|&(start, size)| worth(this, start, size))
                .max_by_key(|&(start, _)| this.reclaim.dead.get(&start).copied().unwrap_or(0))
        };
        if let Some(victim) = best(self, self.checkpointed) {
            return Ok(Some(victim));
        }
        // A segment below the log's end but past the last checkpoint: make
        // it sealed.
        if best(self, self.log.end()).is_some() {
            self.checkpoint()?;
            return Ok(best(self, self.checkpointed));
        }
        Ok(None)
    }
}
