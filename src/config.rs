//! Server configuration: the validated values `serve` runs with.

use std::path::PathBuf;
use std::time::Duration;

/// Everything `serve` needs besides its listener. Build it with
/// [`Config::new`] and adjust the public fields.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory of the sled database; created if missing.
    pub data_dir: PathBuf,
    /// Longest a PollTask waits for a task before answering empty.
    pub poll_wait_cap: Duration,
    /// Lease of a task attempt whose tool sets no heartbeat timeout.
    pub default_heartbeat_timeout: Duration,
    /// How long a graceful shutdown waits for in-flight calls.
    pub shutdown_grace: Duration,
    /// How many idle run states stay cached in memory.
    pub run_cache_size: usize,
    /// Memory for sled's page cache (its default is 1 GiB).
    pub store_cache_bytes: u64,
}

impl Config {
    /// Defaults for a server keeping its data in `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Config {
            data_dir: data_dir.into(),
            poll_wait_cap: Duration::from_secs(30),
            default_heartbeat_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            run_cache_size: 1_024,
            store_cache_bytes: 64 * 1024 * 1024,
        }
    }
}
