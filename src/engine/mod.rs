//! The engine: the tool loop, the approval gate, leases and timers.
//!
//! Each request for a run takes that run's lock, loads its state (from a
//! bounded cache, or by folding its events), asks the pure `decide_*`
//! functions what to append, folds the new events (which may emit engine
//! follow-ups), commits them with their index changes in one durable batch,
//! and only then acts: offers tasks to workers, wakes timers and followers.
//! A run that waits (for a human, say) holds no task and no lock; at most its
//! state sits in the cache until evicted.

mod decisions;
mod dispatch;
mod driver;
pub mod error;
mod facts;
mod gate;
pub mod grants;
pub mod guard;
mod heads;
mod leases;
mod observed;
mod reads;
mod recorded;
mod requests;
pub mod retention;
mod runs;
pub mod schema;
mod settings;
pub mod state;
mod tasks;
mod timers;
mod traced;

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::domain::event::*;
use crate::domain::token::{TaskKind, Token};
pub use decisions::{Batch, BatchItem, ItemOutcome, SignalAnswer};
use dispatch::{Dispatcher, Reservation, TaskRef};
pub use dispatch::{Poller, QueueKey};
use driver::{locks, stripe};
pub use error::Error;
pub use facts::RunFacts;
pub use guard::{Reviewer, Rules};
use leases::Leases;
pub use reads::Reads;
use requests::request_scope;
pub use settings::Settings;
use state::{Action, Message, RunState, ToolOutcome};
pub use tasks::Held;

use crate::policy::{CallFacts, Verdict};
use crate::store::{ApprovalRecord, EventRecord, RunId, Shards, SharedStore, WriteBatch};

/// Largest event data (JSON text) the engine appends. sled keeps pages up to
/// a quarter segment in its main file; see `Store::open`.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Most events one input may cause (a guard against a runaway fold).
const MAX_EVENTS_PER_BATCH: usize = 4096;
const RUN_LOCK_STRIPES: usize = 1024;
/// When recording a lost attempt failed (the store refused the write), how
/// soon it is tried again.
const LOST_LEASE_RETRY: Duration = Duration::from_secs(1);
/// How often an engine that serves some of a cluster's shards reads the
/// standing grants other servers may have made or revoked.
const GRANTS_READ_EVERY: Duration = Duration::from_secs(1);

/// A tool reference in StartRun, resolved against the registry.
#[derive(Debug, Clone)]
pub struct ToolRef {
    pub name: String,
    pub requires_approval: bool,
    pub approval_timeout_s: f64,
    /// Raises the tool's approvals_required for the run (0: keep it).
    pub approvals_required: u32,
}

/// StartRun, validated by the api.
#[derive(Debug, Clone)]
pub struct StartRun {
    pub task: String,
    pub system: String,
    pub model: ModelChoice,
    pub tools: Vec<ToolRef>,
    pub budget: Budget,
    pub labels: std::collections::BTreeMap<String, String>,
    pub request_id: String,
    /// The principal that asks (empty with auth off): request ids are its
    /// own, never shared with another principal's.
    pub principal: String,
    /// The caller's W3C trace context, checked (see [`crate::otel`]).
    pub traceparent: Option<String>,
}

/// A task handed to a worker.
#[derive(Debug, Clone)]
pub struct Task {
    pub token: String,
    pub run: RunId,
    pub call_id: String,
    pub attempt: u32,
    pub heartbeat_timeout: Duration,
    pub deadline_at_ms: Option<i64>,
    pub work: Work,
    /// The W3C trace context of the server's span of this attempt.
    pub traceparent: String,
}

#[derive(Debug, Clone)]
pub enum Work {
    Tool {
        name: String,
        arguments: Value,
    },
    Model {
        model: String,
        messages: Vec<Message>,
        tools: Vec<ToolSpec>,
        /// The run's model as it snapshotted it (the built-in model's
        /// provider and settings).
        spec: ModelChoice,
    },
}

/// What a worker reports for a task.
#[derive(Debug, Clone)]
pub enum Report {
    ToolOutput(Value),
    ModelReply {
        content: String,
        calls: Vec<ProposedCall>,
        /// Usage and the like, from built-in models.
        facts: ReplyFacts,
    },
    Failure {
        error: ErrorData,
        retryable: bool,
    },
}

/// Handle to the engine. Cheap to clone.
/// Worker identities whose owner is kept in memory.
const IDENTITIES_CACHED: usize = 4096;

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    settings: Settings,
    /// Tasks that hold the engine beyond a request (timers, the built-in
    /// model): [`Engine::stopped`] awaits them, so that no engine handle,
    /// and no open store, outlives the server.
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    run_locks: Box<[Arc<tokio::sync::Mutex<()>>]>,
    request_locks: Box<[Arc<tokio::sync::Mutex<()>>]>,
    cache: Mutex<lru::LruCache<RunId, RunState>>,
    dispatcher: Dispatcher,
    leases: Leases,
    /// The store, run heads, facts and the stop signal, as the api's
    /// reads see them.
    reads: Reads,
    /// Worker identities and the principals they belong to (auth on).
    identities: Mutex<lru::LruCache<String, String>>,
    timers_changed: Notify,
    /// Set when durable timers were armed or cancelled: the timer loop reads
    /// the earliest one again (not at every lease change, which on a
    /// database would be a query per attempt).
    durable_timers_changed: std::sync::atomic::AtomicBool,
    /// The standing grants, and their uses (see [`grants`]).
    grants: grants::Grants,
    /// The shards whose runs this engine serves: all of them, unless the
    /// server is one of a cluster's that share them out. Fixed for the
    /// engine's life; another set is another engine (see `Engine::close`).
    shards: Shards,
    /// Held (read) by each commit of a run's events; `close` takes it and
    /// turns it false, so that no commit of this engine follows its close.
    open: tokio::sync::RwLock<bool>,
}

impl Engine {
    /// Starts the engine on an open store: recovers in-flight work and starts
    /// the timer task. Everything stops when `shutdown` fires.
    /// It serves the runs of `shards` only (see `Inner::shards`).
    pub async fn start(
        store: SharedStore,
        settings: Settings,
        shards: Shards,
        shutdown: CancellationToken,
    ) -> Result<Engine, Error> {
        let cache_size = NonZeroUsize::new(settings.run_cache_size.max(1)).expect("non-zero");
        let leases = Leases::new(settings.clock.clone());
        let reads = Reads::new(store.clone(), shutdown);
        let engine = Engine {
            inner: Arc::new(Inner {
                store,
                settings,
                background: Mutex::new(Vec::new()),
                run_locks: locks(RUN_LOCK_STRIPES),
                request_locks: locks(RUN_LOCK_STRIPES),
                cache: Mutex::new(lru::LruCache::new(cache_size)),
                dispatcher: Dispatcher::default(),
                leases,
                reads,
                identities: Mutex::new(lru::LruCache::new(
                    NonZeroUsize::new(IDENTITIES_CACHED).expect("non-zero"),
                )),
                timers_changed: Notify::new(),
                durable_timers_changed: std::sync::atomic::AtomicBool::new(true),
                grants: grants::Grants::default(),
                shards,
                open: tokio::sync::RwLock::new(true),
            }),
        };
        // Before any call is reviewed; a standby loads them as it takes over.
        engine.inner.grants.load(&engine.inner.store).await?;
        let metrics = &engine.inner.settings.metrics;
        // Only the owner of the runs has an engine, so only it reports
        // what waits (on a shared database the counts are the database's).
        metrics.refresh_from(Arc::downgrade(&engine.inner), |inner, metrics| async move {
            let families = metrics.families();
            inner.dispatcher.observe(families);
            match inner.store.waiting(&inner.shards).await {
                Ok(waiting) => observed::waiting(families, waiting, inner.settings.clock.now_ms()),
                Err(e) => tracing::warn!("metrics: cannot count what waits: {e}"),
            }
        });
        engine.recover().await?;
        engine.spawn_background(engine.clone().run_timers());
        engine.spawn_background(engine.clone().run_retention());
        if !shards.is_all() {
            // Other servers create and revoke grants too; the store refuses
            // a use of a grant revoked or used up there (see
            // `store::postgres::grant_uses`), and this keeps the copy fresh.
            engine.spawn_background(engine.clone().follow_grants());
        }
        Ok(engine)
    }

    /// Runs `task` until it ends; it must end soon after the engine's
    /// shutdown token fires. [`Engine::stopped`] waits for it.
    pub fn spawn_background(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        self.inner.background.lock().expect("poisoned").push(handle);
    }

    /// Waits for the background tasks, once the shutdown token has fired.
    pub async fn stopped(&self) {
        let tasks = std::mem::take(&mut *self.inner.background.lock().expect("poisoned"));
        for task in tasks {
            let _ = task.await;
        }
    }

    /// Reads the standing grants again every [`GRANTS_READ_EVERY`] until
    /// the engine stops.
    async fn follow_grants(self) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(GRANTS_READ_EVERY) => self.reload_grants().await,
                () = self.shutdown_token().cancelled() => return,
            }
        }
    }

    /// Stops this engine for good, before another takes its shards (or
    /// some of them) over in this process: its background tasks and polls
    /// end, commits already under way finish, and no commit follows.
    /// `shutdown` must be this engine's own token (a child of the
    /// server's); it is cancelled here.
    pub async fn close(&self) {
        self.shutdown_token().cancel();
        *self.inner.open.write().await = false;
        self.stopped().await;
    }

    /// The longest a poll waits.
    pub fn poll_wait_cap(&self) -> Duration {
        self.inner.settings.poll_wait_cap
    }

    /// The shards whose runs this engine serves.
    pub fn shards(&self) -> Shards {
        self.inner.shards
    }

    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.inner.settings.metrics
    }

    /// The engine's clock (see [`crate::clock`]).
    pub fn clock(&self) -> &crate::clock::Clock {
        &self.inner.settings.clock
    }

    fn now_ms(&self) -> i64 {
        self.clock().now_ms()
    }

    /// Who may decide calls in this deployment (see [`guard`]).
    pub fn rules(&self) -> Rules {
        Rules {
            separation_of_duties: self.inner.settings.separation_of_duties,
        }
    }

    pub fn shutdown_token(&self) -> &CancellationToken {
        self.inner.reads.shutdown_token()
    }

    /// What the api's reads use: the store, run heads, run facts.
    pub fn reads(&self) -> &Reads {
        &self.inner.reads
    }

    /// Re-offers the work of runs that were active when the server stopped,
    /// and gives their running attempts a fresh lease. A built-in model's
    /// attempt in flight died with the server that made it: it is recorded
    /// as lost and the call goes on as the next attempt, so no two attempts
    /// of one call are ever in flight.
    async fn recover(&self) -> Result<(), Error> {
        let now = self.now_ms();
        let mut lost = Vec::new();
        let mut reoffered = Vec::new();
        for run in self.inner.store.active_runs(&self.inner.shards).await? {
            let state = self.load(run).await?;
            if let Some(pending) = state.builtin_model_pending() {
                lost.push((run, pending.call_id.clone(), pending.attempt));
            }
            let served = state.served_model_pending();
            if let Some(pending) = served {
                reoffered.push((run, pending.call_id.clone(), pending.attempt));
            }
            for call in &state.calls {
                if call.phase == state::Phase::Running {
                    let timeout = self.heartbeat_timeout(call.spec.as_ref());
                    self.inner.leases.grant(
                        run,
                        &call.call_id,
                        call.attempt,
                        &call.worker,
                        TaskKind::Tool,
                        timeout,
                    );
                }
            }
            // A served model's call is offered by its request again, below.
            let mut actions = state.dispatchable(now);
            if served.is_some() {
                actions.retain(|a| !matches!(a, Action::DispatchModel { .. }));
            }
            self.offer_all(run, actions);
            self.cache_put(state);
        }
        for (run, call_id, attempt) in reoffered {
            self.update(run, |state, _| {
                Ok((vec![state.decide_model_reoffer(&call_id, attempt)?], ()))
            })
            .await?;
        }
        for (run, call_id, attempt) in lost {
            let error = ErrorData::new(
                "AttemptLost",
                format!("the server that made attempt {attempt} stopped before it was answered"),
            );
            self.update(run, |state, _| {
                let event =
                    state.decide_model_failure(&call_id, attempt, error, true, Actor::Engine)?;
                Ok((vec![event], ()))
            })
            .await?;
        }
        Ok(())
    }
}
