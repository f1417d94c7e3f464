//! What opening a store needs, and nothing more: where it is, how much
//! memory and disk its files may take, where it counts, and a test's hold
//! on its commits. The server's `Config` makes one (`Config::store_settings`);
//! tools and tests make their own with [`Settings::new`].

use std::path::PathBuf;

use super::CommitHold;
use crate::metrics::Metrics;

/// sled's page cache, in MiB. With 100,000 runs parked the server's RSS
/// was 146-157 MiB with 64 and about 30 MiB less with 32; cycles and appends
/// measured the same with 40 as with 64 (sled's file stays in the OS cache).
pub const DEFAULT_CACHE_MIB: u64 = 40;

/// The embedded log's largest segment, in KiB (`--log-segment-kib`).
pub const DEFAULT_LOG_SEGMENT_KIB: u64 = 32 * 1024;

/// How to open a store (see [`super::open`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Directory of the embedded store; created if missing. Unused when
    /// `url` names a database.
    pub data_dir: PathBuf,
    /// Where the store is: `None` for the embedded store in `data_dir`, or
    /// a `postgres://` URL (see docs/postgres.md).
    pub url: Option<String>,
    /// Memory for sled's page cache (sled's own default is 1 GiB).
    pub cache_bytes: u64,
    /// The embedded log's largest segment file, in bytes: the unit in
    /// which compaction gives disk back.
    pub log_segment_bytes: u64,
    /// Where the store counts commits, disk use and pooled connections.
    pub metrics: Metrics,
    /// Tests only: holds the embedded store's commits while the test says
    /// so (see [`CommitHold`]). `None` in a real server.
    pub commit_hold: Option<CommitHold>,
}

impl Settings {
    /// Defaults for the embedded store in `data_dir`, counting into
    /// metrics of its own.
    pub fn new(data_dir: impl Into<PathBuf>) -> Settings {
        Settings {
            data_dir: data_dir.into(),
            url: None,
            cache_bytes: DEFAULT_CACHE_MIB * 1024 * 1024,
            log_segment_bytes: DEFAULT_LOG_SEGMENT_KIB * 1024,
            metrics: Metrics::new(),
            commit_hold: None,
        }
    }
}
