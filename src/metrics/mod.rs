//! Prometheus metrics: one registry per server, the families the engine,
//! the store, the api and the subscriptions update, and the text a scrape
//! of `/metrics` reads (see [`scrape`]).
//!
//! Built on `prometheus-client`: it keeps no global registry (several
//! servers in one test process each count their own), and its families
//! are typed by their label sets. Label values are bounded: methods are the
//! api's own, statuses and outcomes are fixed words, and names a client
//! chooses (tools, models, groups) pass through [`Bounded`], which keeps
//! the first few hundred and counts the rest as `_other`. Never a run id.

mod api;
mod bounded;
pub mod scrape;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub use api::ApiMetricsLayer;
pub use bounded::Bounded;

/// A histogram family whose children share one set of buckets.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabel {
    pub tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolOutcome {
    pub tool: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Decision {
    pub tool: String,
    pub outcome: &'static str,
    pub actor_kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Expiry {
    pub tool: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelOutcome {
    pub model: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelTokens {
    pub model: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodCode {
    pub method: &'static str,
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// `tool` or `model`.
    pub kind: &'static str,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookOutcome {
    pub group: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetentionLabel {
    /// `deleted`, `archived`, `tombstones_dropped`, `group_skips`.
    pub what: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub state: &'static str,
}

/// The server's metrics. Cheap to clone; every clone counts into the same
/// registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

/// Reads, at each scrape, a value kept elsewhere (queue depths, what
/// waits in the store, group lag, the pool): gauges set from their source
/// rather than kept in step. `None` once its source is gone.
type Refresh = Box<dyn Fn() -> Option<BoxFuture> + Send + Sync>;
type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

struct Inner {
    registry: Registry,
    families: Families,
    refreshes: Mutex<Vec<Refresh>>,
}

/// Every family, by what it measures.
pub struct Families {
    pub approvals_pending: Family<ToolLabel, Gauge>,
    pub approval_oldest_wait_seconds: Family<ToolLabel, Gauge<f64, AtomicU64>>,
    pub approval_wait_seconds: Histograms<ToolOutcome>,
    pub approval_decisions: Family<Decision, Counter>,
    pub approvals_expired: Family<Expiry, Counter>,
    pub runs: Family<StatusLabel, Gauge>,
    pub runs_started: Counter,
    pub runs_finished: Family<StatusLabel, Counter>,
    pub tool_attempts: Family<ToolOutcome, Counter>,
    pub tool_attempt_seconds: Histograms<ToolLabel>,
    pub model_calls: Family<ModelOutcome, Counter>,
    pub model_tokens: Family<ModelTokens, Counter>,
    pub store_commit_seconds: Histogram,
    pub store_commit_batch_size: Histogram,
    pub store_fsyncs: Counter,
    pub store_checkpoint_seconds: Histogram,
    pub store_disk_bytes: Gauge,
    pub store_pool_connections: Family<PoolLabel, Gauge>,
    pub api_requests: Family<MethodCode, Counter>,
    pub api_request_seconds: Histograms<MethodLabel>,
    pub api_open_streams: Family<MethodLabel, Gauge>,
    pub poll_waiters: Family<QueueLabel, Gauge>,
    pub ready_tasks: Family<QueueLabel, Gauge>,
    pub group_lag_events: Family<GroupLabel, Gauge>,
    pub group_dead_letters: Family<GroupLabel, Counter>,
    pub webhook_deliveries: Family<WebhookOutcome, Counter>,
    pub trace_spans_dropped: Counter,
    pub retention_runs: Family<RetentionLabel, Counter>,
    pub retention_segments_compacted: Counter,
    pub retention_bytes_freed: Counter,
    pub retention_bytes_moved: Counter,
    /// Tools `aaa_approvals_pending` has shown, so that they show 0 when
    /// nothing of theirs waits.
    pub pending_shown: Mutex<std::collections::BTreeSet<String>>,
    /// Names a client chose, bounded before they become label values.
    pub tools: Bounded,
    pub models: Bounded,
    pub groups: Bounded,
}

/// Waits from 10 ms to a week (approvals, attempts), in steps a
/// dashboard reads: seconds, minutes, hours, a day, a week.
fn wait_buckets() -> Histogram {
    Histogram::new([
        0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 86400.0,
        604800.0,
    ])
}

/// Latencies from 0.1 ms to 5 s (api calls, commits).
fn latency_buckets() -> Histogram {
    Histogram::new([
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let families = Families {
            approvals_pending: Family::default(),
            approval_oldest_wait_seconds: Family::default(),
            approval_wait_seconds: Family::new_with_constructor(wait_buckets),
            approval_decisions: Family::default(),
            approvals_expired: Family::default(),
            runs: Family::default(),
            runs_started: Counter::default(),
            runs_finished: Family::default(),
            tool_attempts: Family::default(),
            tool_attempt_seconds: Family::new_with_constructor(wait_buckets),
            model_calls: Family::default(),
            model_tokens: Family::default(),
            store_commit_seconds: latency_buckets(),
            store_commit_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            store_fsyncs: Counter::default(),
            store_checkpoint_seconds: latency_buckets(),
            store_disk_bytes: Gauge::default(),
            store_pool_connections: Family::default(),
            api_requests: Family::default(),
            api_request_seconds: Family::new_with_constructor(latency_buckets),
            api_open_streams: Family::default(),
            poll_waiters: Family::default(),
            ready_tasks: Family::default(),
            group_lag_events: Family::default(),
            group_dead_letters: Family::default(),
            webhook_deliveries: Family::default(),
            trace_spans_dropped: Counter::default(),
            retention_runs: Family::default(),
            retention_segments_compacted: Counter::default(),
            retention_bytes_freed: Counter::default(),
            retention_bytes_moved: Counter::default(),
            pending_shown: Mutex::default(),
            tools: Bounded::new(256),
            models: Bounded::new(64),
            groups: Bounded::new(128),
        };
        let registry = register(&families);
        Metrics {
            inner: Arc::new(Inner {
                registry,
                families,
                refreshes: Mutex::new(Vec::new()),
            }),
        }
    }

    pub fn families(&self) -> &Families {
        &self.inner.families
    }

    /// Calls `refresh` before each scrape, for as long as `owner` lives
    /// (`refresh` gets it back, and is dropped once it is gone).
    pub fn refresh_from<T, F, Fut>(&self, owner: Weak<T>, refresh: F)
    where
        T: Send + Sync + 'static,
        F: Fn(Arc<T>, Metrics) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let metrics = Arc::downgrade(&self.inner);
        let refresh: Refresh = Box::new(move || {
            let owner = owner.upgrade()?;
            let inner = metrics.upgrade()?;
            Some(Box::pin(refresh(owner, Metrics { inner })))
        });
        self.inner.refreshes.lock().expect("poisoned").push(refresh);
    }

    /// The registry in the OpenMetrics text format, with every scrape-time
    /// gauge read again first.
    pub async fn render(&self) -> String {
        let pending: Vec<BoxFuture> = {
            let mut refreshes = self.inner.refreshes.lock().expect("poisoned");
            let mut pending = Vec::new();
            refreshes.retain(|refresh| match refresh() {
                Some(future) => {
                    pending.push(future);
                    true
                }
                None => false,
            });
            pending
        };
        for future in pending {
            future.await;
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.inner.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

fn register(f: &Families) -> Registry {
    let mut r = Registry::default();
    // Counters get `_total` appended by the encoder.
    r.register(
        "aaa_approvals_pending",
        "Approval requests waiting for a decision, by tool",
        f.approvals_pending.clone(),
    );
    r.register(
        "aaa_approval_oldest_wait_seconds",
        "How long the oldest pending approval request of each tool has waited (0: none waits)",
        f.approval_oldest_wait_seconds.clone(),
    );
    r.register(
        "aaa_approval_wait_seconds",
        "Time from an approval request to its resolution (granted, denied, expired, edited)",
        f.approval_wait_seconds.clone(),
    );
    r.register(
        "aaa_approval_decisions",
        "Approval decisions, by tool, outcome and the kind of actor that decided",
        f.approval_decisions.clone(),
    );
    r.register(
        "aaa_approvals_expired",
        "Approval requests that expired, by tool and reason (timeout, deadline, cancelled, run_ended)",
        f.approvals_expired.clone(),
    );
    r.register(
        "aaa_runs",
        "Runs not yet finished owned by this server, by status (running, waiting)",
        f.runs.clone(),
    );
    r.register("aaa_runs_started", "Runs started", f.runs_started.clone());
    r.register(
        "aaa_runs_finished",
        "Runs finished, by status (completed, failed, cancelled)",
        f.runs_finished.clone(),
    );
    r.register(
        "aaa_tool_attempts",
        "Tool attempts that ended, by tool and outcome (completed, retrying, failed, lost)",
        f.tool_attempts.clone(),
    );
    r.register(
        "aaa_tool_attempt_seconds",
        "Duration of tool attempts, from start to their end",
        f.tool_attempt_seconds.clone(),
    );
    r.register(
        "aaa_model_calls",
        "Model calls that ended, by model and outcome (completed, failed)",
        f.model_calls.clone(),
    );
    r.register(
        "aaa_model_tokens",
        "Tokens the models reported, by model and kind (input, output)",
        f.model_tokens.clone(),
    );
    r.register(
        "aaa_store_commit_seconds",
        "Duration of one commit round of the store (write and sync)",
        f.store_commit_seconds.clone(),
    );
    r.register(
        "aaa_store_commit_batch_size",
        "Events written by one commit round",
        f.store_commit_batch_size.clone(),
    );
    r.register(
        "aaa_store_fsyncs",
        "Syncs to disk of the embedded store (commits of a transaction on PostgreSQL)",
        f.store_fsyncs.clone(),
    );
    r.register(
        "aaa_store_checkpoint_seconds",
        "Duration of a checkpoint of the embedded store (its index written out and synced)",
        f.store_checkpoint_seconds.clone(),
    );
    r.register(
        "aaa_store_disk_bytes",
        "Bytes on disk of the embedded store's data directory",
        f.store_disk_bytes.clone(),
    );
    r.register(
        "aaa_store_pool_connections",
        "PostgreSQL pool connections, by state (in_use, idle)",
        f.store_pool_connections.clone(),
    );
    r.register(
        "aaa_api_requests",
        "gRPC calls answered, by method and status code",
        f.api_requests.clone(),
    );
    r.register(
        "aaa_api_request_seconds",
        "Time to a gRPC call's response headers (for a stream: until it opened), by method",
        f.api_request_seconds.clone(),
    );
    r.register(
        "aaa_api_open_streams",
        "Server streams and long polls open, by method",
        f.api_open_streams.clone(),
    );
    r.register(
        "aaa_poll_waiters",
        "PollTask calls waiting for work, by queue",
        f.poll_waiters.clone(),
    );
    r.register(
        "aaa_ready_tasks",
        "Calls ready for a worker and not yet taken, by queue",
        f.ready_tasks.clone(),
    );
    r.register(
        "aaa_group_lag_events",
        "Events committed after a consumer group's cursor, by group",
        f.group_lag_events.clone(),
    );
    r.register(
        "aaa_group_dead_letters",
        "Events a consumer group set aside as dead letters, by group",
        f.group_dead_letters.clone(),
    );
    r.register(
        "aaa_webhook_deliveries",
        "Webhook deliveries, by group and outcome (delivered, failed)",
        f.webhook_deliveries.clone(),
    );
    r.register(
        "aaa_retention_runs",
        "Retention: finished runs deleted, archived first, tombstones dropped, and deleted runs a consumer group had not read yet (group_skips)",
        f.retention_runs.clone(),
    );
    r.register(
        "aaa_retention_segments_compacted",
        "Retention: log segments of the embedded store compacted away",
        f.retention_segments_compacted.clone(),
    );
    r.register(
        "aaa_retention_bytes_freed",
        "Retention: disk the embedded store gave back",
        f.retention_bytes_freed.clone(),
    );
    r.register(
        "aaa_retention_bytes_moved",
        "Retention: live bytes compaction copied forward",
        f.retention_bytes_moved.clone(),
    );
    r.register(
        "aaa_trace_spans_dropped",
        "Spans not exported: the exporter's queue was full, or the collector did not take them",
        f.trace_spans_dropped.clone(),
    );
    r
}
