//! The store: what the engine, the api and the subscriptions may ask of
//! durable storage, in domain terms, and the backends that answer.
//!
//! [`Store`] is the seam. A write is a [`WriteBatch`]: events of runs plus
//! typed index changes (run summaries, pending approvals, timers, ...) that
//! commit atomically with them. Each backend turns the operations into its
//! own keys or rows; nothing outside a backend knows them. Reads are async
//! queries, paginated where they can grow.
//!
//! What every backend promises:
//! - `commit` answers only once the batch is durable, with its events'
//!   positions: unique, and increasing in commit order within each shard
//!   (a reader that has read a shard up to position N never sees a later
//!   commit of that shard below N). Across shards they need not be: a
//!   reader of the whole log stands at a [`Cursor`], one position per
//!   shard.
//! - A batch that appends to a run expects the run's last seq to be the
//!   seq before the batch's first event of that run; when another writer
//!   got there first the batch is refused whole with
//!   [`StoreError::Conflict`], never forking the history.
//! - An idempotency record ([`Op::PutRequest`]) is written once: a batch
//!   that records an answer to a request already answered is refused whole
//!   with [`StoreError::RequestRecorded`], so the first answer stands and
//!   the effect it answered is never applied twice.
//! - Readers see no event before it is durable; `watch_durable` moves after
//!   each commit.
//!
//! Backends: [`embedded`] (sled and a segment log in a data directory, the
//! default) and [`postgres`].

mod batch;
pub mod embedded;
mod hold;
pub mod postgres;
mod queue;
mod settings;

pub use batch::{Op, WriteBatch};
pub use hold::CommitHold;
pub use settings::{Settings, DEFAULT_CACHE_MIB, DEFAULT_LOG_SEGMENT_KIB};

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};

pub use crate::domain::{
    ApprovalRecord, BadToken, Claim, ClusterView, Cursor, DeadLetterRecord, EventRecord,
    GrantRecord, GrantUse, GroupRecord, Member, RunId, RunRecord, ShardLease, Shards, Timer,
};

/// Store failures. Any of them but `Conflict` means the disk or the
/// database is in trouble.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Something stored does not read back; the text says what and where.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("the store is closed")]
    Closed,
    /// A write failed (disk full, an I/O error, the database unreachable)
    /// and nothing of it was written; the text names the cause.
    #[error("{0}")]
    Unavailable(String),
    /// The data was written by another version of aaa; the text says which
    /// and what to do.
    #[error("{0}")]
    Format(String),
    /// Another writer appended to the run first: its last seq is `actual`,
    /// the batch expected `expected`. Nothing of the batch was written.
    #[error("run {run} was appended to by another writer (its last seq is {actual}, this write expected {expected})")]
    Conflict {
        run: RunId,
        expected: u64,
        actual: u64,
    },
    /// Another server claimed the shard of a run the batch touches (its
    /// epoch is newer than the one this store holds): this store no longer
    /// writes that run. Nothing of the batch was written.
    #[error("another aaa server took over the runs of shard {shard} (its epoch {current}, this server's {held}); this server no longer writes them")]
    Fenced { shard: u8, held: i64, current: i64 },
    /// The batch uses a standing grant that another server revoked or used
    /// up meanwhile (this server's copy of the grants was behind). Nothing
    /// of the batch was written. Only a shared store (PostgreSQL) checks
    /// this; the embedded store's one engine keeps the count itself.
    #[error(
        "standing grant {0} was revoked or used up on another server; decided again without it"
    )]
    GrantUnusable(String),
    /// The batch records an answer to a request already answered (an
    /// earlier try committed first, here or on another server): the
    /// answer recorded stands. Nothing of the batch was written.
    #[error("request '{request_id}' was answered already; nothing of this try was written")]
    RequestRecorded { request_id: String },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// ListRuns: summaries newest first (by run id, which is start order).
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    /// Only runs started before this one (the previous page's last).
    pub before: Option<RunId>,
    /// The wire RunStatus number; 0 for any.
    pub status: i32,
    /// Every one of these labels, with these values.
    pub labels: BTreeMap<String, String>,
    /// Only runs this client principal started.
    pub started_by: Option<String>,
    pub limit: usize,
}

/// Pending approvals in (run, call_id) order.
#[derive(Debug, Clone, Default)]
pub struct ApprovalQuery {
    /// Only those after this (run, call_id) pair (the previous page's last),
    /// in the query's order.
    pub after: Option<(RunId, String)>,
    /// Newest run first, and each run's calls in reverse order (`after`
    /// then means below the pair).
    pub newest_first: bool,
    /// Only this run's.
    pub run: Option<RunId>,
    /// Only this tool's; empty for any.
    pub tool: String,
    /// Every one of these labels (of the run), with these values.
    pub labels: BTreeMap<String, String>,
    /// Only those whose request is at or below this cursor (its position
    /// in its run's shard).
    pub at_or_below: Option<Cursor>,
    /// Only those a member of these approver groups may decide (those
    /// naming no groups, or one of these).
    pub decidable_by: Option<Vec<String>>,
    pub limit: usize,
}

impl RunQuery {
    /// Whether a summary passes the status and label filters (`before`,
    /// `started_by` and `limit` are the backend's to apply).
    pub fn matches(&self, run: &RunRecord) -> bool {
        (self.status == 0 || run.status == self.status) && labels_match(&self.labels, &run.labels)
    }
}

impl ApprovalQuery {
    /// Whether an approval passes the run, tool, label and position
    /// filters (`after` and `limit` are the backend's to apply).
    pub fn matches(&self, approval: &ApprovalRecord) -> bool {
        self.run
            .is_none_or(|run| run.as_bytes().as_slice() == approval.run_id.as_slice())
            && (self.tool.is_empty() || self.tool == approval.tool)
            && labels_match(&self.labels, &approval.labels)
            && self.at_or_below.as_ref().is_none_or(|cursor| {
                RunId::from_slice(&approval.run_id)
                    .is_some_and(|run| !cursor.passes(run, approval.position))
            })
            && crate::domain::may_decide(self.decidable_by.as_deref(), &approval.approvers)
    }
}

/// The wire ActorKind number of a client (StartRun, Signal, CancelRun):
/// a run whose summary names no starter (one written before summaries
/// did) was started by the client that appended its first event.
pub(crate) const CLIENT_ACTOR: i32 = 3;

/// True when `have` holds every label of `wanted` with the same value.
pub fn labels_match(wanted: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| have.get(k) == Some(v))
}

/// Waits for a store to let go of what it holds ([`Store::released`]).
pub struct Released(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>);

impl Released {
    /// Released once `until` completes.
    pub fn after(until: impl std::future::Future<Output = ()> + Send + 'static) -> Released {
        Released(Box::pin(until))
    }

    /// Released from the start.
    pub fn already() -> Released {
        Released::after(std::future::ready(()))
    }

    pub async fn wait(self) {
        self.0.await
    }
}

/// Durable storage, in domain terms. See the module docs for what every
/// implementation promises.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Appends the batch; answers once it is durable, with the positions of
    /// its events in order.
    async fn commit(&self, batch: WriteBatch) -> Result<Vec<u64>>;

    /// Lets in-flight commits finish, then refuses new ones with
    /// [`StoreError::Closed`].
    async fn close(&self);

    /// Resolves once every handle on this store is gone, tasks that still
    /// finish after `close` included: then the embedded store's data
    /// directory may be opened again. A store that keeps no other process
    /// out has nothing to release.
    fn released(&self) -> Released {
        Released::already()
    }

    /// Makes this store the only writer of every run, for `server` (a name
    /// for logs and status): from now on a batch that touches a run commits
    /// only while this store still owns the run's shard, and a later claim
    /// by another server fences this one out of that shard
    /// ([`StoreError::Fenced`]). The store renews its claims in the
    /// background; closing it hands the shards over at once. With
    /// `claim.standby` it first waits until no other server holds a live
    /// claim. Until a claim, writes are not fenced (tools such as `aaa
    /// migrate`). The embedded store is one process's by its lock: it holds
    /// every shard. The answer follows the shards this store holds: every
    /// shard after this claim, fewer as claims are lost or given up, more
    /// as [`Store::claim_shards`] takes them.
    async fn claim_runs(&self, server: &str, claim: Claim) -> Result<watch::Receiver<Shards>>;

    /// Claims those of `wanted` whose lease has lapsed (never a shard
    /// another server holds live), for `server`, and renews them with the
    /// others; answers the shards it claimed. How a member of a cluster
    /// that spreads the shards takes its share (see `cluster::balance`).
    async fn claim_shards(&self, server: &str, claim: Claim, wanted: Shards) -> Result<Shards>;

    /// Gives up these held shards at once (their lease ends now), so that
    /// the server they go to need not wait for it to lapse. The caller
    /// must have stopped writing their runs first.
    async fn release_shards(&self, shards: Shards) -> Result<()>;

    /// The shards this store holds now (see [`Store::claim_runs`]).
    fn held_shards(&self) -> watch::Receiver<Shards>;

    /// Makes this server a member of a shared store: writes its row (name,
    /// the address others reach it at, whether it `spreads` the shards out
    /// with the others) and renews it every third of `lease` until the
    /// store closes, so the others can forward calls to it and see that it
    /// is alive. The embedded store has no members.
    async fn join(
        &self,
        server: &str,
        address: &str,
        lease: std::time::Duration,
        spreads: bool,
    ) -> Result<()>;

    /// The members of a shared store and who holds each shard (empty for
    /// the embedded store).
    async fn cluster(&self) -> Result<ClusterView>;

    /// The secret that signs task tokens, made when the store was created
    /// and kept in it, so tokens stay valid across restarts.
    fn token_key(&self) -> [u8; 32];

    /// True while the store takes writes; false after a write failed, until
    /// one succeeds again (health follows it).
    fn watch_writable(&self) -> watch::Receiver<bool>;

    /// Per shard, the last position known to be durable.
    fn durable(&self) -> Cursor;

    /// A number that grows whenever a shard's durable position moves.
    fn watch_durable(&self) -> watch::Receiver<u64>;

    /// Moves a reader's `cursor` past `event`, which [`Store::log_after`]
    /// gave it. A store whose positions are in commit order across the
    /// whole log (one committer) may move it to [`Cursor::at`] the event,
    /// which keeps resume tokens small.
    fn read_past(&self, cursor: &mut Cursor, event: &EventRecord) {
        if let Some(run) = RunId::from_slice(&event.run_id) {
            cursor.read(run, event.position);
        }
    }

    /// The runs whose heads the commits of every server on a shared store
    /// moved, as this server hears of them from the database, so that a
    /// server that does not own the runs can tell its followers. A store
    /// with no other writers (the embedded one) has nothing to tell: the
    /// default is closed at once.
    fn heads_moved(&self) -> broadcast::Receiver<HeadsMoved> {
        broadcast::channel(1).1
    }

    /// Durable events of `run` with seq > `after_seq`, in seq order, at
    /// most `limit`.
    async fn run_events(
        &self,
        run: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventRecord>>;

    /// One event of a run.
    async fn event(&self, run: RunId, seq: u64) -> Result<Option<EventRecord>>;

    /// Durable events of every run past `after` (per shard), at most
    /// `limit`, in position order: each shard's are the first ones past
    /// its position, so a reader that moves its cursor past each event
    /// (see [`Store::read_past`]) never skips or repeats one.
    async fn log_after(&self, after: &Cursor, limit: usize) -> Result<Vec<EventRecord>>;

    /// The run's summary, with its current head (last seq, update time).
    async fn run(&self, run: RunId) -> Result<Option<RunRecord>>;

    /// Run summaries (with their heads) matching the query, newest first.
    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>>;

    /// Pending approvals of one run, in call_id order.
    async fn run_approvals(&self, run: RunId) -> Result<Vec<ApprovalRecord>>;

    /// Pending approvals matching the query, in (run, call_id) order.
    async fn approvals(&self, query: &ApprovalQuery) -> Result<Vec<ApprovalRecord>>;

    /// Runs of these shards marked active (see [`Op::SetActive`]).
    async fn active_runs(&self, shards: &Shards) -> Result<Vec<RunId>>;

    /// What waits in these shards, counted for the metrics at a scrape:
    /// pending approvals by tool, and unfinished runs by status. A scan of
    /// the pending approvals, done off the async threads.
    async fn waiting(&self, shards: &Shards) -> Result<Waiting>;

    /// The earliest durable timer of a run of these shards, if any.
    async fn next_timer(&self, shards: &Shards) -> Result<Option<Timer>>;

    /// A registered tool's stored definition.
    async fn tool(&self, name: &str) -> Result<Option<Vec<u8>>>;

    /// The answer recorded for an idempotent request.
    async fn request(&self, scope: &[u8], request_id: &str) -> Result<Option<Vec<u8>>>;

    /// A consumer group's definition and cursor.
    async fn group(&self, name: &str) -> Result<Option<GroupRecord>>;

    /// A group's dead letters with positions after `after`, in position
    /// order, at most `limit`.
    async fn dead_letters(
        &self,
        group: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetterRecord>>;

    // What `aaa migrate` copies besides events and the paginated queries
    // above. Whole lists: a store holds few of each (but see
    // `list_requests`).

    /// Every durable timer, earliest first.
    async fn list_timers(&self) -> Result<Vec<Timer>>;

    /// Every registered tool: (name, stored definition).
    async fn list_tools(&self) -> Result<Vec<(String, Vec<u8>)>>;

    /// Idempotency records after the given (scope, request_id), at most
    /// `limit`, in an order fixed by the backend: (scope, request_id,
    /// answer).
    async fn list_requests(
        &self,
        after: Option<(Vec<u8>, String)>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, String, Vec<u8>)>>;

    /// Every consumer group.
    async fn list_groups(&self) -> Result<Vec<GroupRecord>>;

    /// Every standing grant, revoked ones too, in id (creation) order,
    /// each with its number of uses.
    async fn grants(&self) -> Result<Vec<(GrantRecord, u64)>>;

    /// Every use of every grant (for `aaa migrate`).
    async fn list_grant_uses(&self) -> Result<Vec<GrantUse>>;

    // Retention (see docs/retention.md).

    /// Finished runs whose retention has passed at `now_ms`, at most
    /// `limit`: those that follow the server's default and finished at or
    /// before `now_ms - default_ms` (none when `default_ms` is `None`:
    /// kept for good), and those with their own retention
    /// ([`crate::domain::RETENTION_LABEL`]) that ran out; only runs of
    /// `shards`. Running and waiting runs are never among them.
    async fn expired_runs(
        &self,
        now_ms: i64,
        default_ms: Option<i64>,
        limit: usize,
        shards: &Shards,
    ) -> Result<Vec<RunId>>;

    /// When the run was deleted by retention, while its tombstone lasts.
    async fn expired_at(&self, run: RunId) -> Result<Option<i64>>;

    /// Drops tombstones kept until `now_ms` or before, at most `limit`;
    /// returns how many.
    async fn drop_tombstones(&self, now_ms: i64, limit: usize) -> Result<usize>;

    /// Gives back the disk space of deleted runs, a bounded step at a
    /// time; returns what it did. The embedded store compacts its log
    /// (see `embedded::compact`); a database reclaims space on its own.
    async fn compact(&self) -> Result<Compacted> {
        Ok(Compacted::default())
    }
}

/// What one [`Store::compact`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Log segments deleted.
    pub segments: u64,
    /// Bytes of live events copied forward out of them.
    pub moved_bytes: u64,
    /// Bytes of disk given back.
    pub freed_bytes: u64,
}

/// Which runs' heads a commit moved, as another server hears of it.
#[derive(Debug, Clone)]
pub enum HeadsMoved {
    /// Each run and its new last seq.
    Runs(Arc<[(RunId, u64)]>),
    /// Some runs moved, which is not known (too many to name, or the
    /// position was read rather than heard): every follower looks again.
    Unknown,
}

/// A store shared by the engine, the api and the subscriptions.
pub type SharedStore = Arc<dyn Store>;

/// A tool's pending approvals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolWaiting {
    pub tool: String,
    pub pending: u64,
    /// When the one that waits longest was requested.
    pub oldest_requested_ms: i64,
}

/// See [`Store::waiting`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub approvals_by_tool: Vec<ToolWaiting>,
    /// Runs with work in progress (a model or tool call, or one ready).
    pub running: u64,
    /// Runs that wait only for approvals.
    pub waiting: u64,
}

/// Opens the store the settings name.
pub async fn open(settings: &Settings) -> Result<SharedStore> {
    match &settings.url {
        None => {
            let store = embedded::EmbeddedStore::open_with(
                &settings.data_dir,
                settings.cache_bytes,
                settings.log_segment_bytes,
                &settings.metrics,
                settings.commit_hold.clone(),
            )?;
            Ok(Arc::new(store))
        }
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let store = postgres::PostgresStore::open_with_metrics(url, &settings.metrics).await?;
            Ok(Arc::new(store))
        }
        Some(url) => Err(StoreError::Format(format!(
            "store '{}' is not supported by this build",
            redact(url)
        ))),
    }
}

/// A store URL fit for logs and errors: any password replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{scheme}://{name}:***@{host}{path}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}
