//! What the engine is told at start: its clock, limits, and the parts of
//! the server's configuration it reads (built from `Config` by the server).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::domain::Retention;
use crate::metrics::Metrics;
use crate::otel::Tracer;
use crate::policy::PolicyHandle;
use crate::providers::ModelsConfig;

#[derive(Clone)]
pub struct Settings {
    /// Event times, deadlines, timers and leases.
    pub clock: Clock,
    pub metrics: Metrics,
    /// Where spans go; `None`: no traces.
    pub tracer: Option<Arc<Tracer>>,
    /// Longest a PollTask waits for a task before answering empty.
    pub poll_wait_cap: Duration,
    /// Lease of a task attempt whose tool sets no heartbeat timeout.
    pub default_heartbeat_timeout: Duration,
    /// How many idle run states stay cached in memory.
    pub run_cache_size: usize,
    /// The run's starter may not decide its calls (auth on), so neither may
    /// a grant the starter made.
    pub separation_of_duties: bool,
    /// Providers of the built-in model; `None`: runs cannot ask for it.
    pub models: Option<Arc<ModelsConfig>>,
    /// The approval policy; `None`: every call follows its tool's settings.
    pub policy: Option<Arc<PolicyHandle>>,
    /// How long finished runs are kept by default.
    pub retention: Retention,
    /// How long a deleted run's tombstone lasts; `None`: as long as the
    /// retention, between an hour and 7 days.
    pub tombstone: Option<Duration>,
    /// Where finished runs are archived before retention deletes them.
    pub archive_dir: Option<PathBuf>,
}
