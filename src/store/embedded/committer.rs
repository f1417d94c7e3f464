//! The committer thread's state: the log it appends to, sled, the recent
//! spans, the pending approvals in memory, the positions it gives out and
//! the bookkeeping of compaction. Its rounds (see [`super::rounds`]),
//! deletions of runs (see [`super::retention`]) and compaction steps (see
//! [`super::compact`]) all change it; so does the checkpoint, here. It is
//! also the only caller of sled's flush (STACK.md, trap 1), at checkpoints:
//! the recent spans go to sled, sled is flushed with a mark saying how far
//! it holds the log, and its file fsynced (flush alone is not an fsync,
//! trap 2).

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio::sync::watch;

use super::log::{Log, Mark};
use super::record::Applied;
use super::spans::Recent;
use super::Result;

pub(super) struct Committer {
    pub tree: sled::Db,
    pub data_file: File,
    pub log: Log,
    pub recent: Arc<Recent>,
    pub pending: Arc<super::pending::Pending>,
    /// Log offset of the last checkpoint.
    pub checkpointed: u64,
    pub next_position: u64,
    pub durable: watch::Sender<u64>,
    pub durable_position: Arc<AtomicU64>,
    /// False while writes fail (see `super::rounds`).
    pub writable: watch::Sender<bool>,
    /// The disk's free space and the reserve kept on it.
    pub space: super::space::Space,
    /// The reserve is missing: writes are refused until it can be made
    /// again (see [`super::space`]).
    pub short: bool,
    /// Why sled failed, once it has: sled keeps an I/O error for good (its
    /// "global error"), so writes are refused until a restart replays the log.
    pub index_failed: Option<String>,
    pub metrics: crate::metrics::Metrics,
    /// Dead bytes per log segment, for compaction (see `super::compact`).
    pub reclaim: Reclaim,
    /// A test's hold on the rounds; `None` in a real server.
    pub hold: Option<crate::store::CommitHold>,
}

/// The committer's bookkeeping for compaction (see [`super::compact`]).
#[derive(Default)]
pub(super) struct Reclaim {
    /// Dead event bytes per segment (mirrors the `S` keys).
    pub dead: HashMap<u64, u64>,
    /// Segments read and found too live: their dead bytes then, so they are
    /// read again only once more of them died.
    pub rejected: HashMap<u64, u64>,
}

impl Reclaim {
    pub fn new(dead: HashMap<u64, u64>) -> Reclaim {
        Reclaim {
            dead,
            rejected: HashMap::new(),
        }
    }
}

impl Committer {
    /// What applying a record updates besides sled.
    pub(super) fn applied(&self) -> Applied<'_> {
        Applied {
            recent: &self.recent,
            pending: &self.pending,
        }
    }

    /// Writes fail for a cause the log may see go away (not sled's).
    pub(super) fn probing(&self) -> bool {
        !*self.writable.borrow() && self.index_failed.is_none()
    }

    /// Makes the reserve if it is missing; whether writes may go on.
    pub(super) fn has_reserve(&mut self) -> bool {
        if self.short && matches!(self.space.keep(), Ok(true)) {
            tracing::info!("made the reserve of free space again");
            self.short = false;
        }
        !self.short
    }

    /// Tries to make the reserve or the segment whose making failed; says
    /// SERVING again when it could.
    pub(super) fn probe(&mut self) {
        if self.has_reserve() && self.log.prepare_now().is_ok() {
            tracing::info!("the log can be written again");
            self.writable.send_replace(true);
        }
    }

    /// Makes sled hold every applied record durably, spans included, with a
    /// mark saying so.
    pub(super) fn checkpoint(&mut self) -> Result<()> {
        // sled's flush needs room: on a short disk the reserve gives it,
        // and writes stop until the reserve is made again.
        if let Ok(true) = self.space.release_if_short() {
            self.short = true;
            self.writable.send_replace(false);
        }
        let started = std::time::Instant::now();
        let mark = Mark {
            offset: self.log.end(),
            next_position: self.next_position,
        };
        let lists = self.recent.write_out(&self.tree)?;
        let written = started.elapsed();
        mark.save(&self.tree)?;
        self.tree.flush()?;
        self.data_file.sync_data()?;
        self.checkpointed = mark.offset;
        let families = self.metrics.families();
        families.store_fsyncs.inc();
        families
            .store_checkpoint_seconds
            .observe(started.elapsed().as_secs_f64());
        tracing::debug!(
            "checkpoint at log offset {}: {lists} span lists in {written:?}, flushed in {:?}",
            mark.offset,
            started.elapsed() - written
        );
        Ok(())
    }
}
