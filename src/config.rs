//! Server configuration: the validated values `serve` runs with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::AuthConfig;
use crate::clock::Clock;
use crate::policy::PolicyHandle;
use crate::providers::ModelsConfig;
use crate::subscriptions::WebhookConfig;

/// sled's page cache, in MiB (`--store-cache-mib`; see
/// [`crate::store::DEFAULT_CACHE_MIB`]).
pub const DEFAULT_STORE_CACHE_MIB: u64 = crate::store::DEFAULT_CACHE_MIB;

/// How long finished runs are kept by default (`--retention`).
pub const DEFAULT_RETENTION: crate::domain::Retention =
    crate::domain::Retention::Ms(30 * 86_400_000);

/// The embedded log's largest segment, in KiB (`--log-segment-kib`).
pub const DEFAULT_LOG_SEGMENT_KIB: u64 = crate::store::DEFAULT_LOG_SEGMENT_KIB;

/// Open client connections served at once (see [`Config::max_connections`]).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;

/// Everything `serve` needs besides its listener. Build it with
/// [`Config::new`] and adjust the public fields.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory of the embedded store; created if missing. Unused when
    /// `store_url` names a database.
    pub data_dir: PathBuf,
    /// Where the store is: `None` for the embedded store in `data_dir`, or
    /// a `postgres://` URL (see docs/postgres.md).
    pub store_url: Option<String>,
    /// Longest a PollTask waits for a task before answering empty.
    pub poll_wait_cap: Duration,
    /// Lease of a task attempt whose tool sets no heartbeat timeout.
    pub default_heartbeat_timeout: Duration,
    /// How long a graceful shutdown waits for in-flight calls.
    pub shutdown_grace: Duration,
    /// How many idle run states stay cached in memory.
    pub run_cache_size: usize,
    /// Memory for sled's page cache (sled's own default is 1 GiB).
    pub store_cache_bytes: u64,
    /// Principals, roles and TLS; `None` serves anyone (local development).
    pub auth: Option<Arc<AuthConfig>>,
    /// Largest request message; larger ones are refused by tonic (OUT_OF_RANGE).
    pub max_message_bytes: usize,
    /// Concurrent calls (streams) one HTTP/2 connection may have open.
    pub max_streams_per_connection: u32,
    /// Open client connections; one more is told so (HTTP/2 GOAWAY) and
    /// closed. A connection counts from its accept to its close.
    pub max_connections: usize,
    /// How long a new connection may take to send its HTTP/2 preface and
    /// settings before it is closed (a stalled or half-open client).
    pub handshake_timeout: Duration,
    /// Interval of HTTP/2 keepalive pings on an idle connection; one not
    /// answered within the same time closes the connection.
    pub keepalive_interval: Duration,
    /// Webhooks: consumer groups whose member POSTs each event to a URL.
    pub webhooks: Vec<WebhookConfig>,
    /// Providers of the built-in OpenAI-compatible model (`--models`);
    /// `None`: runs cannot ask for it.
    pub models: Option<Arc<ModelsConfig>>,
    /// Upstream MCP servers whose tools aaa serves at `/mcp` (`--mcp`);
    /// `None`: no `/mcp`.
    pub mcp: Option<Arc<crate::mcp::config::McpConfig>>,
    /// The engine's time: event times, deadlines, timers and leases. Tests
    /// use a manual clock to move time forward instead of waiting.
    pub clock: Clock,
    /// On PostgreSQL: how long this server's claim on the runs lasts
    /// unless renewed (every third of it); a standby takes them over once
    /// it has lapsed.
    pub lease: Duration,
    /// On PostgreSQL: serve at once by forwarding every call, and take the
    /// runs over when no other server holds a live claim on them. Without
    /// it a server that finds a live owner stands by all the same; one
    /// that finds none claims the runs before it serves.
    pub standby: bool,
    /// On PostgreSQL: claim every shard at once, fencing out the server
    /// that holds them, instead of standing by while its claim is live.
    pub take_over: bool,
    /// On PostgreSQL: share the shards out among the live servers (see
    /// `cluster::balance`) instead of one server owning them all. `aaa
    /// serve` does unless told `--one-owner`, `--standby` or `--take-over`
    /// (see docs/cluster.md); `false` here, where a test or an embedder
    /// says which it wants.
    pub spread_shards: bool,
    /// On PostgreSQL: the `host:port` the other servers of the cluster
    /// reach this one at, to forward calls to it while it owns the runs.
    /// `None`: the listening address (loopback if it listens on all).
    pub advertise: Option<String>,
    /// The approval policy (`--policy FILE`), replaced whole on reload;
    /// `None`: every call follows its tool's settings.
    pub policy: Option<Arc<PolicyHandle>>,
    /// The server's Prometheus metrics (`GET /metrics`).
    pub metrics: crate::metrics::Metrics,
    /// Where spans go (`--otlp-endpoint`); `None`: no traces.
    pub tracer: Option<Arc<crate::otel::Tracer>>,
    /// How long a finished run is kept after it finished, unless it sets
    /// its own (see docs/retention.md).
    pub retention: crate::domain::Retention,
    /// How long a deleted run's tombstone lasts (`--tombstone`); `None`:
    /// as long as the retention, between an hour and 7 days.
    pub tombstone: Option<std::time::Duration>,
    /// Where expiring runs are archived before they are deleted (one
    /// gzip JSON Lines file per run); `None`: not archived.
    pub archive_dir: Option<PathBuf>,
    /// The embedded log's largest segment file, in bytes: the unit in
    /// which compaction gives disk back.
    pub log_segment_bytes: u64,
    /// The web inbox's base URL as people reach it (behind a proxy, a
    /// load balancer), for the links in webhooks and pages. `None`:
    /// `http://` (`https://` under TLS) and the advertised address.
    pub public_url: Option<String>,
    /// Tests only: holds the embedded store's commits while the test says
    /// so (see [`crate::store::CommitHold`]). `None` in a real server.
    pub commit_hold: Option<crate::store::CommitHold>,
    /// More host names (`name` or `name:port`) the web inbox answers to,
    /// besides the loopback names and, with auth on, those of the public
    /// URL and the listening and advertised addresses (`--allow-host`).
    pub allowed_hosts: Vec<String>,
}

impl Config {
    /// What the engine reads of this configuration.
    pub fn engine_settings(&self) -> crate::engine::Settings {
        crate::engine::Settings {
            clock: self.clock.clone(),
            metrics: self.metrics.clone(),
            tracer: self.tracer.clone(),
            poll_wait_cap: self.poll_wait_cap,
            default_heartbeat_timeout: self.default_heartbeat_timeout,
            run_cache_size: self.run_cache_size,
            separation_of_duties: (self.auth.as_ref())
                .is_some_and(|auth| auth.separation_of_duties),
            models: self.models.clone(),
            policy: self.policy.clone(),
            retention: self.retention,
            tombstone: self.tombstone,
            archive_dir: self.archive_dir.clone(),
        }
    }

    /// Defaults for a server keeping its data in `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Config {
            data_dir: data_dir.into(),
            store_url: None,
            poll_wait_cap: Duration::from_secs(30),
            default_heartbeat_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            run_cache_size: 1_024,
            store_cache_bytes: DEFAULT_STORE_CACHE_MIB * 1024 * 1024,
            auth: None,
            max_message_bytes: 4 * 1024 * 1024,
            max_streams_per_connection: 200,
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
            handshake_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(30),
            webhooks: Vec::new(),
            models: None,
            mcp: None,
            clock: Clock::system(),
            lease: Duration::from_secs(3),
            standby: false,
            take_over: false,
            spread_shards: false,
            advertise: None,
            policy: None,
            metrics: crate::metrics::Metrics::new(),
            tracer: None,
            retention: DEFAULT_RETENTION,
            tombstone: None,
            archive_dir: None,
            log_segment_bytes: DEFAULT_LOG_SEGMENT_KIB * 1024,
            public_url: None,
            commit_hold: None,
            allowed_hosts: Vec::new(),
        }
    }
}

impl Config {
    /// What the store reads of the configuration, to open it with
    /// [`crate::store::open`].
    pub fn store_settings(&self) -> crate::store::Settings {
        crate::store::Settings {
            data_dir: self.data_dir.clone(),
            url: self.store_url.clone(),
            cache_bytes: self.store_cache_bytes,
            log_segment_bytes: self.log_segment_bytes,
            metrics: self.metrics.clone(),
            commit_hold: self.commit_hold.clone(),
        }
    }
}

/// Refuses to serve without authentication on an address other machines
/// can reach, unless the operator said `insecure`: an open aaa lets anyone
/// who reaches it approve any call.
pub fn check_exposure(listen: SocketAddr, auth: bool, insecure: bool) -> Result<(), String> {
    if auth || insecure || listen.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "refusing to serve {listen} without authentication: give --auth-config FILE, \
         or --insecure to let anyone who can reach it call every RPC"
    ))
}
