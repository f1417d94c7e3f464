//! The data directory as this version finds it at open: the layout
//! version it reads (refusing others by name, upgrading the one before),
//! how it opens sled there, the task-token key kept in it, and the lock
//! that keeps other processes out while a store has it open.

use std::path::Path;
use std::time::Duration;

use super::{corrupt, keys, Result, StoreError};

/// The layout this version reads and writes. Version 1 kept events in sled
/// and had a `wal` file; version 2 had event pointers without their last
/// event's time (and rewrote the run summary on every append); version 3
/// had one pointer per span, written at every append, where version 4 has
/// lists written at checkpoints. Nothing converts any of them. Version 5
/// adds retention (expiry index entries, tombstones, dead bytes per
/// segment) and log entries that version 4 cannot read (a deleted run,
/// compaction's copies): a version 4 directory is upgraded in place at
/// open (its finished runs indexed), and an older aaa refuses a version 5
/// one by name instead of misreading its log.
pub(super) const LAYOUT: &str = "5";
/// The layout this version upgrades to [`LAYOUT`] at open.
const UPGRADED: &str = "4";

/// Resolves once nobody holds the lock on `file` (or it cannot be read).
pub(super) async fn unlocked(file: &Path) {
    let mut pause = Duration::from_millis(1);
    loop {
        let Ok(file) = std::fs::File::open(file) else {
            return;
        };
        if !matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)) {
            return;
        }
        drop(file);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// How the store opens sled in `dir`.
pub(super) fn sled_config(dir: &Path, cache_bytes: u64) -> sled::Config {
    sled::Config::new()
        .path(dir)
        // We flush ourselves, at the committer's checkpoints; sled's
        // background flusher would only add concurrent flushes (STACK.md,
        // trap 1).
        .flush_every_ms(None)
        .cache_capacity(cache_bytes)
        // Pages bigger than a quarter segment go to blob files that sled
        // never fsyncs. 8 MiB segments keep every page we write (records are
        // capped at 64 KiB of data, leaves split at 17 entries) in the main
        // file, which the committer does fsync.
        .segment_size(8 * 1024 * 1024)
}

/// The error for a data directory of another layout.
fn other_layout(version: &str) -> StoreError {
    StoreError::Format(format!(
        "the data directory has layout version {version}; this aaa reads version {LAYOUT} only (and upgrades version {UPGRADED}; start with an empty --data-dir)"
    ))
}

/// Refuses a database of another layout; marks a new one as ours.
pub(super) fn check_format(tree: &sled::Db, dir: &Path) -> Result<()> {
    let name = keys::meta("format");
    match tree.get(&name)? {
        Some(format) if format == LAYOUT.as_bytes() => Ok(()),
        Some(format) if format == UPGRADED.as_bytes() => {
            // Made durable by the first checkpoint, after the backfill of
            // the retention index (which runs again if a crash comes first).
            tree.insert(&name, LAYOUT.as_bytes())?;
            Ok(())
        }
        Some(format) => Err(other_layout(&String::from_utf8_lossy(&format))),
        None if tree.first()?.is_some() || dir.join("wal").exists() => Err(other_layout("1")),
        None => {
            tree.insert(&name, LAYOUT.as_bytes())?;
            Ok(())
        }
    }
}

/// Reads the task-token key, or makes and stores one. Runs in `open`,
/// before the committer starts, so this flush cannot race another.
pub(super) fn token_key(tree: &sled::Db, data_file: &std::fs::File) -> Result<[u8; 32]> {
    let name = keys::meta("token-key");
    if let Some(stored) = tree.get(&name)? {
        return stored
            .as_ref()
            .try_into()
            .map_err(|_| corrupt(&name, "token key is not 32 bytes"));
    }
    let key = crate::domain::random_key();
    tree.insert(&name, &key[..])?;
    tree.flush()?;
    data_file.sync_data()?;
    Ok(key)
}
